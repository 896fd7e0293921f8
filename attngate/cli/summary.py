"""The default ``attngate explain`` view: one screen a person reads at a glance.

Backends chosen and rejected with their reasons, each adjustment once, then one line per gate of
the chosen backends that a rule or a fact decided (gate = value, the rule, the facts it read);
gates at their default are folded into a count. Per-mode and per-layer values only where a rule
set them, and only for the layer kinds the model has. Plain lines: the caller wraps them, never cuts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from attngate.engine.result import GateExplanation, Resolution
from attngate.facts.choices import SGLANG_VERSION
from attngate.facts.model import HeadShape, ModelFacts
from attngate.facts.modes import LayerKind
from attngate.plan.backends import kernel_provider
from attngate.plan.registry import GATES
from attngate.rules.ruleset import RuleSet

HINT = (
    "more: --gate NAME (one gate's rules, why and source), --all (every table and message), --mode M, "
    "--format json; server flags: attngate flags"
)


def _reads(name: str, backends: set[str]) -> bool:
    readers = GATES[name].read_by
    return not readers or bool(backends & set(readers))


def _facts(facts: dict[str, Any], limit: int = 3, *, backends: bool = False) -> str:
    # ``backends`` False: the section's title names the backends, the facts that name them would repeat it
    items = [f"{k}={v!r}" for k, v in facts.items() if backends or k not in ("prefill_backend", "decode_backend")]
    more = f", +{len(items) - limit} more" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def provider(r: Resolution, backend: str) -> str:
    """The kernel package that serves ``backend`` in this plan, e.g. ``flash_attn.cute (FA4 kernels)`` for fa3."""
    named = kernel_provider(backend)
    if named is not None:
        return named
    kernels = "FA4" if r.plan.fa.provider == "flash_attn.cute" else "FA3"  # the plan names fa3's and fa4's package
    return f"{r.plan.fa.provider} ({kernels} kernels)"


def _heads(shape: HeadShape) -> str:
    dims = f"{shape.head_dim}" if shape.head_dim == shape.v_head_dim else f"{shape.head_dim}/v {shape.v_head_dim}"
    group = shape.num_attention_heads // max(shape.num_key_value_heads, 1)
    return f"{shape.num_attention_heads}/{shape.num_key_value_heads} q/kv heads (GQA {group}) x {dims}"


def model_line(m: ModelFacts) -> str:
    """One line of the facts read from config.json, so that a reader can check them: architecture, layer kinds and
    counts, heads (GQA), head dims, window, chunk, soft-cap, sinks, MLA ranks, dtype."""
    kinds = Counter(k.value for k in m.layer_kinds)
    parts = [", ".join(m.architectures) or m.model_type, " + ".join(f"{n} {kind}" for kind, n in kinds.items())]
    if m.attention_arch == "mla":
        parts.append(
            f"MLA {m.num_attention_heads} heads, kv_lora_rank {m.kv_lora_rank}, qk_rope_head_dim {m.qk_rope_head_dim},"
            f" qk head_dim {m.head_dim}, v_head_dim {m.v_head_dim}"
        )
    else:
        swa = m.swa_shape if LayerKind.SLIDING_WINDOW in m.layer_kinds else None
        if swa is None or any(kind != LayerKind.SLIDING_WINDOW for kind in m.layer_kinds):
            parts.append(_heads(m.shape(LayerKind.FULL)))
        if swa is not None:
            parts.append(f"sliding_window layers {_heads(swa)}")
    extras = [
        (m.sliding_window is not None, f"window {m.sliding_window}"),
        (m.attention_chunk_size is not None, f"chunk {m.attention_chunk_size}"),
        (m.attn_logit_softcapping is not None, f"soft-cap {m.attn_logit_softcapping}"),
        (m.has_attention_sinks, "sinks"),
        (m.use_bidirectional_attention, "bidirectional"),
        (m.is_multimodal, "multimodal"),
        (m.is_encoder_decoder, "encoder-decoder"),
        (m.torch_dtype is not None, str(m.torch_dtype)),
    ]
    return "model: " + "; ".join(parts + [text for on, text in extras if on])


def _backend_title(r: Resolution) -> str:
    plan = r.plan
    if plan.prefill_backend == plan.decode_backend:
        return f"backend {plan.prefill_backend} via {provider(r, plan.prefill_backend)}"
    return (
        f"prefill {plan.prefill_backend} via {provider(r, plan.prefill_backend)}, "
        f"decode {plan.decode_backend} via {provider(r, plan.decode_backend)}"
    )


def summary_lines(r: Resolution, mode: str | None = None) -> list[str]:
    """The default screen (``mode``: only that forward mode's per-mode values)."""
    plan, e = r.plan, r.explanation
    chosen = {plan.prefill_backend, plan.decode_backend}
    lines = [f"{r.model.source} on {r.platform.gpu_arch}: {_backend_title(r)} (plan {plan.fingerprint[:16]})"]
    lines += [model_line(r.model), f"kernels: {r.platform.kernel_set}", "", "backends:"] + _backend_summary(r)
    lines += _adjustment_lines(r, brief=True) + deviation_lines(r.deviations, brief=True)
    adjusted = {a.field for a in r.adjustments}
    others = [w for w in r.warnings if w.split(":", 1)[0] not in adjusted]
    if others:
        lines += ["", "warnings:"] + [f"  {w}" for w in others]
    relevant = {name: g for name, g in e.gates.items() if _reads(name, chosen)}
    decided = {name: g for name, g in relevant.items() if g.rules}
    copied = sum(g.origin.startswith("fact:") for g in relevant.values())
    rest = len(relevant) - len(decided) - copied
    lines += ["", f"gates rules set for {', '.join(sorted(chosen))} ({rest} at defaults, {copied} copied from facts):"]
    for name, g in decided.items():
        why = f" <- {g.origin}" + (f" ({_facts(g.facts)})" if g.facts else "")
        lines.append(f"  {name} = {g.value!r}{why}")
    modes = {m.value for m in r.forward_modes if mode in (None, m.value)}
    lines += _table_lines("per forward mode", e.modes, chosen, modes)
    lines += _table_lines("per layer kind", e.layers, chosen, {k.value for k in r.model.layer_kinds})
    lines += ["", HINT]
    return lines


def _backend_summary(r: Resolution) -> list[str]:
    """Backends with the same verdict and the same rules grouped on one line, rules by id (``--all``: messages)."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for b in r.explanation.backends:
        label = b.status.value + (f" via {provider(r, b.backend)}" if b.status.value == "chosen" else "")
        ids = tuple(dict.fromkeys(reason.split(": ", 1)[0] for reason in b.reasons))
        groups.setdefault((label, ids), []).append(b.backend)
    return [
        f"  {', '.join(names):<12} {label}" + (f": {', '.join(ids)}" if ids else "")
        for (label, ids), names in groups.items()
    ]


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


def gate_lines(r: Resolution, name: str, rules: RuleSet | None = None) -> list[str] | None:
    """The full why of one gate in every table that has it (``rules``: each deciding rule's summary, why, source and
    file:line); None when no gate has that name."""
    e = r.explanation
    places = [("global", e.gates)] + [(f"forward mode {m.value}", e.modes[m.value]) for m in r.forward_modes]
    places += [(f"layer kind {k}", g) for k, g in e.layers.items() if k in {kind.value for kind in r.model.layer_kinds}]
    found = [(where, gates[name]) for where, gates in places if name in gates]
    if not found:
        return None
    lines = [line for where, g in found for line in _why_lines(f"{name} [{where}]", g)]
    cited = dict.fromkeys(rule for _, g in found for rule in g.rules)
    if rules is not None and cited:
        lines += ["", "rules:"]
        for rule_id in cited:
            rule = rules.by_id(rule_id)
            lines += [f"  {rule.id} ({rule.where}): {rule.summary}", f"    why: {' '.join(rule.why.split())}"]
            lines.append(f"    source: {' '.join(rule.source.split())}")
    return lines


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
    tables = [("global gates", e.gates)] + [
        (f"forward mode {m.value}", e.modes[m.value]) for m in r.forward_modes if mode in (None, m.value)
    ]
    kinds = {k.value for k in r.model.layer_kinds}
    tables += [(f"layer kind {k}", g) for k, g in e.layers.items() if k in kinds]
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


def _adjustment_lines(r: Resolution, *, brief: bool = False) -> list[str]:
    if not r.adjustments:
        return []
    return ["", "adjustments:"] + [
        f"  {a.field}: {a.old!r} -> {a.new!r} ({a.rule}" + (")" if brief else f": {a.message})") for a in r.adjustments
    ]


def deviation_lines(deviations: list[Any], *, brief: bool = False) -> list[str]:
    """The rules file's deviations that apply: where SGLang 0.5.23 resolves this configuration otherwise, on purpose
    (``brief``: ids and fields only)."""
    if not deviations:
        return []
    lines = ["", f"differs from SGLang {SGLANG_VERSION} on purpose (deviations: in the rules file):"]
    for d in deviations:
        if brief:
            lines.append(f"  {d.id} ({', '.join(d.fields)})")
        else:
            lines += [f"  {d.id} ({', '.join(d.fields)}): {' '.join(d.reason.split())}", f"    source: {d.source}"]
    return lines
