"""The rule-coverage pytest plugin (``--rule-coverage``), run on a small inner test session."""

from __future__ import annotations

import json

pytest_plugins = ["pytester"]

INNER = '''
from attngate import ModelFacts, Platform, ServerArgs, resolve
from helpers_path import LLAMA

def test_one_resolve():
    resolve(ServerArgs(attention_backend="fa3"), ModelFacts.from_hf_config(LLAMA), Platform.from_name("sm90"))
'''


def _inner(pytester, *args):
    from helpers import MODELS

    pytester.makepyfile(helpers_path=f"LLAMA = {str(MODELS / 'Llama-3.1-8B.json')!r}", test_inner=INNER)
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", *args)


def test_coverage_reports_fired_and_never_fired_rules_and_atoms(pytester):
    result = _inner(pytester, "--rule-coverage", "--rule-coverage-json=cov.json")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["rule coverage of *rules.yaml: *% (*/* rules fired, */* atom outcomes seen)", "  never fired: *"])
    report = json.loads((pytester.path / "cov.json").read_text())
    never = {r["rule"] for r in report["never_fired"]}
    assert "default-backend.whisper" in never and "fa.fa4-sm90-single-split" not in never  # fa3 on sm90 fired it
    assert 0 < report["rules_fired"] < report["rules"] and report["atoms_not_seen_both_ways"]


def test_coverage_below_the_threshold_fails_the_session(pytester):
    result = _inner(pytester, "--rule-coverage-fail-under=99")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*FAIL: rule coverage *% is below --rule-coverage-fail-under=99.0"])
