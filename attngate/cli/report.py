"""The JSON output contract of ``attngate explain --format json`` (documented in the README; ``version`` moves
when a key changes)."""

from __future__ import annotations

from typing import Any

from attngate.engine.result import Adjustment, GateExplanation, Resolution
from attngate.errors import PlanError

#: the contract's version: 2 spells the FlashAttention group "fa" in plans and gives each error its source and code
VERSION = 2


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


def resolution_report(r: Resolution) -> dict[str, Any]:
    """The report of a resolved configuration (``errors`` is empty)."""
    e = r.explanation
    return {
        "version": VERSION,
        "plan": {
            "prefill_backend": r.plan.prefill_backend,
            "decode_backend": r.plan.decode_backend,
            "fingerprint": r.plan.fingerprint,
        },
        "server_args": r.server_args.model_dump(),
        "gates": {name: _gate(g) for name, g in e.gates.items()},
        "modes": {mode: {name: _gate(g) for name, g in gates.items()} for mode, gates in e.modes.items()},
        "layers": {kind: {name: _gate(g) for name, g in gates.items()} for kind, gates in e.layers.items()},
        "backends": [{"backend": b.backend, "status": b.status.value, "reasons": b.reasons} for b in e.backends],
        "adjustments": [_adjustment(a) for a in r.adjustments],
        "warnings": r.warnings,
        "deviations": [_deviation(d) for d in r.deviations],
        "errors": [],
    }


def error_report(err: PlanError) -> dict[str, Any]:
    """The report of an invalid configuration: no plan, every reason in ``errors``."""
    return {
        "version": VERSION,
        "plan": None,
        "server_args": err.server_args,
        "gates": {},
        "modes": {},
        "layers": {},
        "backends": [],
        "adjustments": [_adjustment(a) for a in err.adjustments],
        "warnings": [str(a) for a in err.adjustments if not a.fills_default],
        "deviations": [_deviation(d) for d in err.deviations],
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
