"""The default ``attngate explain`` view: one screen a person reads at a glance.

Backends chosen and rejected with their reasons, each adjustment once, then one line per gate of
the chosen backends that a rule or a fact decided (gate = value, the rule, the facts it read);
gates at their default are folded into a count. Per-mode and per-layer values only where a rule
set them, and only for the layer kinds the model has. Plain lines: the caller wraps them, never cuts.
"""

from __future__ import annotations

from typing import Any

from attngate.engine.result import GateExplanation, Resolution
from attngate.plan.registry import GATES

HINT = "more: --gate NAME (the full why of one gate), --all (every table), --format json; server flags: attngate flags"


def _reads(name: str, backends: set[str]) -> bool:
    readers = GATES[name].read_by
    return not readers or bool(backends & set(readers))


def _facts(facts: dict[str, Any], limit: int = 4, *, backends: bool = False) -> str:
    # ``backends`` False: the section's title names the backends, the facts that name them would repeat it
    items = [f"{k}={v!r}" for k, v in facts.items() if backends or k not in ("prefill_backend", "decode_backend")]
    more = f", +{len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _decided(e: GateExplanation) -> bool:
    return e.origin != "default"


def summary_lines(r: Resolution) -> list[str]:
    plan, e = r.plan, r.explanation
    chosen = {plan.prefill_backend, plan.decode_backend}
    backends = (
        f"prefill {plan.prefill_backend}, decode {plan.decode_backend}"
        if len(chosen) > 1
        else f"backend {plan.prefill_backend}"
    )
    lines = [f"{r.model.source} on {r.platform.gpu_arch}: {backends} (plan {plan.fingerprint[:16]})", "", "backends:"]
    lines += _backend_lines(r)
    lines += _adjustment_lines(r) + deviation_lines(r.deviations)
    adjusted = {a.field for a in r.adjustments}
    others = [w for w in r.warnings if w.split(":", 1)[0] not in adjusted]
    if others:
        lines += ["", "warnings:"] + [f"  {w}" for w in others]
    relevant = {name: g for name, g in e.gates.items() if _reads(name, chosen)}
    decided = {name: g for name, g in relevant.items() if _decided(g)}
    lines += ["", f"gates read by {', '.join(sorted(chosen))} ({len(relevant) - len(decided)} more at their defaults):"]
    for name, g in decided.items():
        why = f" <- {g.origin}" + (f" ({_facts(g.facts)})" if g.facts else "")
        lines.append(f"  {name} = {g.value!r}{why}")
    lines += _table_lines("per forward mode", e.modes, chosen, set(e.modes))
    lines += _table_lines("per layer kind", e.layers, chosen, {k.value for k in r.model.layer_kinds})
    lines += ["", HINT]
    return lines


def _table_lines(
    title: str, table: dict[str, dict[str, GateExplanation]], chosen: set[str], keys: set[str]
) -> list[str]:
    """One line per gate that a rule set somewhere: ``gate: key=value (rule), ...`` over ``keys`` only."""
    by_gate: dict[str, dict[tuple[str, str], list[str]]] = {}
    for key, gates in table.items():
        if key not in keys:
            continue
        for name, g in gates.items():
            if _reads(name, chosen) and g.rules:
                by_gate.setdefault(name, {}).setdefault((repr(g.value), g.origin), []).append(key)
    if not by_gate:
        return []
    lines = ["", f"{title} (where a rule set it):"]
    for name, groups in by_gate.items():
        parts = [f"{' '.join(keys)} = {value} ({origin})" for (value, origin), keys in groups.items()]
        lines.append(f"  {name}: {'; '.join(parts)}")
    return lines


def gate_lines(r: Resolution, name: str) -> list[str] | None:
    """The full why of one gate in every table that has it; None when no gate has that name."""
    e = r.explanation
    places = [("global", e.gates)] + [(f"forward mode {m}", g) for m, g in e.modes.items()]
    places += [(f"layer kind {k}", g) for k, g in e.layers.items() if k in {kind.value for kind in r.model.layer_kinds}]
    found = [(where, gates[name]) for where, gates in places if name in gates]
    if not found:
        return None
    return [line for where, g in found for line in _why_lines(f"{name} [{where}]", g)]


def _why_lines(label: str, g: GateExplanation, indent: str = "") -> list[str]:
    lines = [f"{indent}{label} = {g.value!r}, from {g.origin}"]
    if g.facts:
        lines.append(f"{indent}  facts read: {_facts(g.facts, limit=99, backends=True)}")
    lines += [f"{indent}  candidate {c.rule} did not match, false: {'; '.join(c.failed)}" for c in g.candidates]
    return lines


def all_lines(r: Resolution, mode: str | None) -> list[str]:
    """``--all`` (``--mode M``: the global gates and that mode's) as plain lines: every gate of every table with
    its full why, the adjustments, warnings and candidate backends; what a pipe gets instead of tables."""
    plan, e = r.plan, r.explanation
    lines = [
        f"attention plan: {r.model.source} on {r.platform.gpu_arch}: prefill {plan.prefill_backend}, "
        f"decode {plan.decode_backend} (plan {plan.fingerprint[:16]})"
    ]
    tables = [("global gates", e.gates)] + [(f"forward mode {m}", g) for m, g in e.modes.items() if mode in (None, m)]
    tables += [(f"layer kind {k}", g) for k, g in e.layers.items()] if mode is None else []
    for title, gates in tables:
        lines += ["", f"{title}:"] + [line for name, g in gates.items() for line in _why_lines(name, g, "  ")]
    lines += _adjustment_lines(r) + deviation_lines(r.deviations)
    lines += (["", "warnings:"] + [f"  {w}" for w in r.warnings]) if r.warnings else []
    return lines + ["", "candidate backends:"] + _backend_lines(r)


def _backend_lines(r: Resolution) -> list[str]:
    """Each candidate backend and its status, one reason per line (a rule message ends in a full stop of its own)."""
    lines = []
    for b in r.explanation.backends:
        lines.append(f"  {b.backend:<12} {b.status}" + (f": {b.reasons[0]}" if b.reasons else ""))
        lines += [f"  {'':<12} also {reason}" for reason in b.reasons[1:]]
    return lines


def _adjustment_lines(r: Resolution) -> list[str]:
    if not r.adjustments:
        return []
    return ["", "adjustments:"] + [
        f"  {a.field}: {a.old!r} -> {a.new!r} ({a.rule}: {a.message})" for a in r.adjustments
    ]


def deviation_lines(deviations: list[Any]) -> list[str]:
    """The rules file's deviations that apply: where SGLang 0.5.23 resolves this configuration otherwise, on purpose."""
    if not deviations:
        return []
    lines = ["", "differs from SGLang 0.5.23 on purpose (deviations: in the rules file):"]
    for d in deviations:
        lines += [f"  {d.id} ({', '.join(d.fields)}): {' '.join(d.reason.split())}", f"    source: {d.source}"]
    return lines
