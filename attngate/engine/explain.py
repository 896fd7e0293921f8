"""Why each gate holds its value (the deciding rules, the facts they read, the rules that could have set it and
the conditions that were false), and every candidate backend's verdict; built lazily, on first use of
``Resolution.explanation``."""

from __future__ import annotations

from typing import Any

from attngate.engine.adjust import adjust
from attngate.engine.index import RuleIndex, read_by
from attngate.engine.result import BackendVerdict, Candidate, GateExplanation
from attngate.errors import PlanError
from attngate.plan.backends import CANDIDATE_BACKENDS
from attngate.plan.registry import GateSpec
from attngate.rules.ruleset import Rule
from attngate.types import VerdictStatus

_BACKEND_ARGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend")


def explain_scope(
    values: dict[str, Any], hits: dict[str, list[Rule]], rules: list[Rule], facts: dict[str, Any], specs: list[GateSpec]
) -> dict[str, GateExplanation]:
    out = {}
    for spec in specs:
        matched = hits.get(spec.name, [])
        others = [r for r in rules if spec.name in r.sets and r not in matched]
        read: dict[str, Any] = {}
        for rule in matched or others:
            read.update(read_by(rule, facts))
        if matched:
            origin = " + ".join(r.id for r in matched)
        else:
            origin = f"fact:{spec.from_fact}" if spec.from_fact else "default"
        out[spec.name] = GateExplanation(
            value=values[spec.name],
            origin=origin,
            rules=[r.id for r in matched],
            facts=read,
            candidates=[Candidate(r.id, r.condition.failed(facts)) for r in others],
        )
    return out


def backend_verdicts(
    requested: dict[str, Any], fixed: dict[str, Any], chosen: set[str], index: RuleIndex
) -> list[BackendVerdict]:
    """Every candidate backend, asked for alone (``--attention-backend B`` on top of the requested arguments, so the
    adjust rules run as they would for that request), with all the rules that reject it or switch away from it."""
    verdicts = []
    for backend in CANDIDATE_BACKENDS:
        state = {
            **requested,
            "attention_backend": backend,
            "prefill_attention_backend": None,
            "decode_attention_backend": None,
        }
        try:
            state, adjustments = adjust(state, fixed, index)
        except PlanError as err:
            reasons = [f"{v.where}: {v.message}" for v in err.violations]
        else:
            trial = index.facts(fixed, state)
            reasons = [f"{r.id}: {r.message or r.summary}" for r in index.checks if r.matches(trial)]
            reasons += [f"{a.rule}: {a.message}" for a in adjustments if a.field in _BACKEND_ARGS]
        if backend in chosen:
            status = VerdictStatus.CHOSEN
        else:
            status = VerdictStatus.REJECTED if reasons else VerdictStatus.ACCEPTED
        verdicts.append(BackendVerdict(backend, status, reasons))
    return verdicts
