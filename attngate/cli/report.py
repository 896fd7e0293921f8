"""The JSON output contract of ``attngate explain --format json`` (documented in the README; ``version`` moves
when a key changes)."""

from __future__ import annotations

from typing import Any

from attngate.cli.summary import model_line, provider
from attngate.engine.result import Adjustment, GateExplanation, Resolution
from attngate.errors import PlanError
from attngate.rules.ruleset import RuleSet

#: the contract's version: 3 adds ``forward_modes`` (the modes that can occur), ``providers`` (the kernel package of
#: each chosen backend), ``rules`` (summary, why, source and file:line of every rule the report cites) and, on a
#: refusal where the backend is at issue, ``candidates`` (each candidate backend and the rules refusing it; [] runs)
VERSION = 3


def _gate(e: GateExplanation) -> dict[str, Any]:
    return {
        "value": e.value,
        "origin": e.origin,
        "rules": e.rules,
        "facts": e.facts,
        "candidates": [{"rule": c.rule, "failed": c.failed} for c in e.candidates],
    }


def _adjustment(a: Adjustment) -> dict[str, Any]:
    return {
        "rule": a.rule,
        "field": a.field,
        "old": a.old,
        "new": a.new,
        "message": a.message,
        "issue": a.issue,
        "fills_default": a.fills_default,
    }


def _deviation(d: Any) -> dict[str, Any]:
    return {"id": d.id, "fields": list(d.fields), "reason": " ".join(d.reason.split()), "source": d.source}


def _rules(rule_set: RuleSet | None, ids: Any) -> dict[str, dict[str, str]]:
    if rule_set is None:
        return {}
    known = {rule.id: rule for rule in rule_set.rules}
    return {
        i: {
            "summary": known[i].summary,
            "why": " ".join(known[i].why.split()),
            "source": " ".join(known[i].source.split()),
            "where": known[i].where,
        }
        for i in dict.fromkeys(ids)
        if i in known
    }


def resolution_report(r: Resolution, rule_set: RuleSet | None = None) -> dict[str, Any]:
    """The report of a resolved configuration (``errors`` is empty); ``rule_set``: the file the plan was resolved
    from, for ``rules``."""
    e = r.explanation
    tables = [e.gates, *e.modes.values(), *e.layers.values()]
    cited = [rule for gates in tables for g in gates.values() for rule in g.rules] + [a.rule for a in r.adjustments]
    return {
        "version": VERSION,
        "plan": {
            "prefill_backend": r.plan.prefill_backend,
            "decode_backend": r.plan.decode_backend,
            "fingerprint": r.plan.fingerprint,
        },
        "platform": {
            "gpu_arch": r.platform.gpu_arch,
            "kernels": list(r.platform.kernel_providers),
            "kernel_source": r.platform.kernel_source,
        },
        "providers": {b: provider(r, b) for b in dict.fromkeys((r.plan.prefill_backend, r.plan.decode_backend))},
        "model_summary": model_line(r.model).removeprefix("model: "),
        "forward_modes": [m.value for m in r.forward_modes],
        "server_args": r.server_args.model_dump(),
        "gates": {name: _gate(g) for name, g in e.gates.items()},
        "modes": {mode: {name: _gate(g) for name, g in gates.items()} for mode, gates in e.modes.items()},
        "layers": {kind: {name: _gate(g) for name, g in gates.items()} for kind, gates in e.layers.items()},
        "backends": [{"backend": b.backend, "status": b.status.value, "reasons": b.reasons} for b in e.backends],
        "adjustments": [_adjustment(a) for a in r.adjustments],
        "warnings": r.warnings,
        "deviations": [_deviation(d) for d in r.deviations],
        "rules": _rules(rule_set, cited),
        "candidates": {},
        "errors": [],
    }


def error_report(err: PlanError, rule_set: RuleSet | None = None) -> dict[str, Any]:
    """The report of an invalid configuration: no plan, every reason in ``errors``."""
    cited = [rule for v in err.violations for rule in v.rules] + [a.rule for a in err.adjustments]
    return {
        "version": VERSION,
        "plan": None,
        "providers": {},
        "model_summary": None,
        "forward_modes": [],
        "server_args": err.server_args,
        "gates": {},
        "modes": {},
        "layers": {},
        "backends": [],
        "adjustments": [_adjustment(a) for a in err.adjustments],
        "warnings": [str(a) for a in err.adjustments if not a.fills_default],
        "deviations": [_deviation(d) for d in err.deviations],
        "rules": _rules(rule_set, cited),
        "candidates": err.candidates,
        "errors": [
            {
                "rule": v.rule,
                "rules": list(v.rules),
                "source": v.source.value,
                "code": p.code,
                "kind": v.kind.value,
                "message": v.message,
                "facts": v.facts,
                "issue": v.issue,
                "help": v.help,
            }
            for v, p in zip(err.violations, err.problems)
        ],
    }
