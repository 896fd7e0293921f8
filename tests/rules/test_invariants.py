"""Invariants: the shipped rules prove every one; putting a seed bug back into rules.yaml the way a
contributor could makes lint fail with a counterexample; the prover agrees with resolve()."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attngate import ForwardMode, PlanError, Platform, ServerArgs, resolve
from attngate.analysis.lint import lint_rules
from attngate.analysis.prove import prove_invariants
from attngate.errors import RulesError, ServerArgsError
from attngate.facts.catalogue import base_facts
from attngate.plan.registry import GATES
from attngate.rules.condition import gate_key
from attngate.rules.load import load_rules, parse_rules, shipped_rules_path
from tests.support.helpers import MODELS, SERVER_ARGS, model

SHIPPED = shipped_rules_path().read_text()


def test_the_shipped_rules_prove_every_invariant():
    rules = load_rules()
    assert len(rules.invariants) >= 9
    assert prove_invariants(rules) == []


def _rule_block(rule_id: str) -> str:
    start = SHIPPED.index(f"  - id: {rule_id}\n")
    end = SHIPPED.index("\n\n", start)
    return SHIPPED[start : end + 2]


# each: (what a contributor changes, the invariant that must catch it)
REINJECTIONS = {
    "skip-kv without 'not use_mla'": (
        lambda t: t.replace("and not use_mla and not has_cross_attention\n", "and not has_cross_attention\n"),
        "mla-keeps-its-kv-cache",
    ),
    "DP-attention precompute rule deleted": (
        lambda t: t.replace(_rule_block("fa.no-precompute-under-dp-attention"), ""),
        "no-scheduler-precompute-under-dp-attention-or-prefill-cp",
    ),
    "prefill-CP precompute rule deleted": (
        lambda t: t.replace(_rule_block("fa.no-precompute-under-prefill-cp"), ""),
        "no-scheduler-precompute-under-dp-attention-or-prefill-cp",
    ),
    "draft-extend-v2 reads the prefix only": (
        lambda t: t.replace(
            _rule_block("fa.draft-extend-v2-reads-prefix-plus-new"),
            _rule_block("fa.draft-extend-v2-reads-prefix-plus-new").replace(
                "{fa.kv_extent: prefix_plus_new}", "{fa.kv_extent: prefix}"
            ),
        ),
        "write-before-attention-modes-read-prefix-plus-new",
    ),
    "deterministic decode split size dropped": (
        lambda t: t.replace("      flashinfer.decode_fixed_split_size: 2048\n", ""),
        "deterministic-fixed-splits-on-every-path",
    ),
    "deterministic decode leaves the tensor-core path": (
        lambda t: t.replace(
            "    when: enable_deterministic_inference\n    set: {flashinfer.decode_use_tensor_cores: true}",
            "    when: enable_deterministic_inference and page_size == 7\n    set: {flashinfer.decode_use_tensor_cores: true}",
        ),
        "deterministic-fixed-splits-on-every-path",
    ),
    "window off under ragged prefill": (
        lambda t: t.replace(
            'when: layer_kind == "sliding_window"\n',
            'when: layer_kind == "sliding_window" and not flashinfer.use_ragged_prefill\n',
        ),
        "window-on-every-pass",
    ),
    "fast path skips FlashInfer's prefill writes": (
        lambda t: t.replace(
            'fa.skip_kv_cache and prefill_backend in ("fa3", "fa4") and layer_kind', "fa.skip_kv_cache and layer_kind"
        ),
        "unwritten-layers-read-no-paged-extend",
    ),
    "fa3 family without its custom-mask exclusion": (
        lambda t: t.replace(
            "is_hopper and flashinfer_head_dims and not flashinfer_prefill_custom_mask\n",
            "is_hopper and flashinfer_head_dims\n",
        ),
        "flashinfer-fa3-plans-no-custom-mask",
    ),
    "fa3 family over an FP8 cache": (
        lambda t: t.replace(
            '\n      and kv_cache_dtype in ("auto", "bf16", "bfloat16")\n    set: {flashinfer.prefill_kernel_family: fa3}',
            "\n    set: {flashinfer.prefill_kernel_family: fa3}",
        ),
        "flashinfer-fa3-prefill-reads-16-bit-caches",
    ),
    "FlashInfer allowed for a bidirectional window": (
        lambda t: t.replace(_rule_block("flashinfer.no-bidirectional-window"), ""),
        "bidirectional-layers-attend-both-ways",
    ),
    "bidirectional sliding layers left causal": (
        lambda t: t.replace(
            'or (use_bidirectional_attention and layer_kind in ("full", "sliding_window"))',
            'or (use_bidirectional_attention and layer_kind == "full")',
        ),
        "bidirectional-layers-attend-both-ways",
    ),
    "MLA encoder-only layers left unwritten": (
        lambda t: t.replace(
            'when: layer_kind == "encoder_only" and not use_mla and not (uses_flashinfer',
            'when: layer_kind == "encoder_only" and not (uses_flashinfer',
        ),
        "mla-keeps-its-kv-cache",
    ),
    "no-op KV pool under MLA or cross attention": (
        lambda t: t.replace(
            "when: prefill_only_disable_kv_cache and (use_mla or has_cross_attention)\n",
            "when: prefill_only_disable_kv_cache and use_mla\n",
        ),
        "no-kv-pool-no-kv-traffic",
    ),
}


@pytest.mark.parametrize("name", sorted(REINJECTIONS))
def test_a_reinjected_seed_bug_fails_lint_with_a_counterexample(name):
    edit, invariant = REINJECTIONS[name]
    text = edit(SHIPPED)
    assert text != SHIPPED, "the edit no longer applies to rules.yaml"
    findings = [f for f in lint_rules(parse_rules(text, "rules.yaml")) if "invariant" in f.message]
    assert [f for f in findings if f"invariant {invariant!r}" in f.message], findings
    found = next(f for f in findings if f"invariant {invariant!r}" in f.message)
    assert found.where.startswith("rules.yaml:") and "Counterexample:" in found.message and "input:" in found.message


def test_invariants_are_type_checked_with_their_location():
    text = SHIPPED + '  - id: bad\n    summary: s\n    assert: fa.kv_extnt == "prefix" and use_mla > 1\n    source: s\n'
    with pytest.raises(RulesError) as err:
        parse_rules(text, "rules.yaml")
    message = str(err.value)
    assert "invariant 'bad'" in message and "fa.kv_extent" in message  # did-you-mean
    assert message.count("rules.yaml:") >= 2  # every problem, each with file:line:col


def test_the_prover_agrees_with_resolve_on_real_configs():
    """Every invariant holds on what resolve() returns for every example model x backend x GPU, every mode and
    every layer kind the model has (the prover links a layer kind to its model fact, as ModelFacts does)."""
    rules = load_rules()
    checked = 0
    for path, backend, gpu, flags in itertools.product(
        sorted(MODELS.glob("*.json")),
        ("fa3", "fa4", "flashinfer"),
        ("sm90", "sm100"),
        ({}, {"enable_deterministic_inference": True}, {"enable_dp_attention": True, "dp_size": 2, "tp_size": 2}),
    ):
        try:
            r = resolve(
                ServerArgs(attention_backend=backend, **flags),
                model(path.stem),
                Platform.from_name(gpu, kernels=["flashinfer", "flash_attn.cute", "flash_attn_interface"]),
            )
        except PlanError:
            continue
        checked += _assert_invariants_hold(rules, r, f"{path.stem} {backend} {gpu} {flags}")
    assert checked > 5_000


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    args=SERVER_ARGS,
    name=st.sampled_from(sorted(p.stem for p in MODELS.glob("*.json"))),
    gpu=st.sampled_from(["sm80", "sm90", "sm100", "sm120"]),
)
def test_the_prover_agrees_with_resolve_on_any_server_arguments(args, name, gpu):
    """The same, over any mix of SGLang's server arguments: what z3 proved for every input, Python finds on each."""
    try:
        r = resolve(ServerArgs(**args), model(name), Platform.from_name(gpu))
    except (PlanError, ServerArgsError):
        return
    _assert_invariants_hold(load_rules(), r, f"{name} {gpu} {args}")


def _assert_invariants_hold(rules, r, label: str) -> int:
    """Evaluate every invariant on resolution ``r`` for every mode and every layer kind its model has; the count."""
    facts = rules.with_predicates(base_facts(r.server_args, r.model, r.platform))
    checked = 0
    for mode, kind in itertools.product(ForwardMode, sorted(set(r.model.layer_kinds), key=lambda k: k.value)):
        values = {**facts, "forward_mode": mode.value, "layer_kind": kind.value}
        for name, spec in GATES.items():
            holder = (
                r.plan
                if spec.scope == "global"
                else (r.plan.mode(mode) if spec.scope == "mode" else r.plan.layer(kind))
            )
            values[gate_key(name)] = getattr(getattr(holder, spec.group), spec.field)
        for inv in rules.invariants:
            assert inv.condition(values), f"{inv.id} fails for {label} {mode.value} {kind.value}"
            checked += 1
    return checked


# ---- attngate diff ------------------------------------------------------------------------------


def test_diff_of_a_file_with_itself_is_empty():
    from attngate.analysis.diff import diff_rules

    rules = load_rules()
    assert diff_rules(rules, rules) == []


@pytest.mark.parametrize("name", sorted(REINJECTIONS))
def test_diff_finds_a_witness_for_every_reinjected_seed_bug(name):
    from attngate.analysis.diff import diff_rules

    edit, _ = REINJECTIONS[name]
    differences = diff_rules(load_rules(), parse_rules(edit(SHIPPED), "new.yaml"))
    assert differences, name
    for d in differences:
        assert d.kind in ("gate", "acceptance", "adjustment") and d.old != d.new and d.witness
        assert d.old_rules or d.new_rules  # a rule is responsible on at least one side


def test_diff_reads_derived_facts_by_their_definition():
    """speculative_chain_draft_tokens is speculative_num_steps + 1, None exactly when the steps are: a rule that
    reads one instead of the other resolves every input alike (before the derived facts were linked, diff
    answered with a witness that has steps 0 and chain None)."""
    from attngate.analysis.diff import diff_rules

    edited = SHIPPED.replace(
        "speculative_eagle_topk == 1 and speculative_num_steps is not None",
        "speculative_eagle_topk == 1 and speculative_chain_draft_tokens is not None",
    )
    assert edited != SHIPPED
    assert diff_rules(load_rules(), parse_rules(edited, "new.yaml")) == []


def test_a_witness_shows_what_explains_it_and_the_flags_that_reproduce_it():
    """The MLA conjunct dropped from the skip-KV rule (seed bug 1): the witness names the facts that rule and the
    gates it feeds read, and leaves every other server argument at its default."""
    from attngate.analysis.diff import diff_rules
    from attngate.facts.server_args import ServerArgs as Args

    edited = REINJECTIONS["skip-kv without 'not use_mla'"][0](SHIPPED)
    (d, *_) = [d for d in diff_rules(load_rules(), parse_rules(edited, "new.yaml")) if d.name == "fa.skip_kv_cache"]
    w = d.witness
    assert (w["use_mla"], w["is_embedding"], w["chunked_prefill_size"], w["disable_radix_cache"]) == (
        True,
        True,
        -1,
        True,
    )
    assert w["prefill_backend"] in ("fa3", "fa4") or w["decode_backend"] in ("fa3", "fa4")
    assert len(w) < 15, w
    read = {
        "use_mla",
        "is_embedding",
        "chunked_prefill_size",
        "disable_radix_cache",
        "prefill_backend",
        "decode_backend",
        "has_cross_attention",
    }
    for name in set(w) - read:  # the rest: server arguments the witness needs away from their defaults
        assert name in Args.model_fields and w[name] != Args.model_fields[name].default, name


def test_diff_cli_exit_codes_and_json(tmp_path):
    from typer.testing import CliRunner

    from attngate.cli import app

    old, new = tmp_path / "old.yaml", tmp_path / "new.yaml"
    old.write_text(SHIPPED)
    new.write_text(SHIPPED.replace("      flashinfer.decode_fixed_split_size: 2048\n", ""))
    runner = CliRunner()
    assert runner.invoke(app, ["diff", str(old), str(old)]).exit_code == 0
    res = runner.invoke(app, ["diff", str(old), str(new), "--format", "json"])
    assert res.exit_code == 1
    (d,) = json.loads(res.output)
    assert (d["kind"], d["name"], d["old"], d["new"]) == ("gate", "flashinfer.decode_fixed_split_size", 2048, None)
    assert d["witness"]["enable_deterministic_inference"] is True
    assert runner.invoke(app, ["diff", str(old), str(tmp_path / "missing.yaml")]).exit_code == 2
