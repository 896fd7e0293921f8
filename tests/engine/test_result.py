"""A Resolution travels between processes (a server's scheduler and its TP workers) whole."""

from __future__ import annotations

import pickle

from tests.support.helpers import resolve_flags


def test_a_resolution_pickles_with_its_explanation_and_an_intact_plan():
    r = resolve_flags("--attention-backend flashinfer --enable-deterministic-inference", "gemma-2-9b")
    again = pickle.loads(pickle.dumps(r))
    again.plan.check_intact()
    assert again.plan == r.plan and again.plan.fingerprint == r.plan.fingerprint
    assert again.server_args == r.server_args and again.adjustments == r.adjustments
    assert again.explanation == r.explanation and again.warnings == r.warnings
