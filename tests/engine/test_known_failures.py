"""SGLang 0.5.23's reported failures as rules (issue 51): each fires on a real config of examples/models, not on the
neighbouring configuration that works, names its issue, gives way to --allow-known-failure, and, where SGLang accepts
the configuration, is declared in the deviation that says so."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngate import ModelFacts, PlanError, Platform, ServerArgs, resolve
from attngate.errors import AttngateError
from attngate.rules.deviations import matching_deviations
from tests.support.helpers import MODELS, fa3_gpu, model, refusing_rules_of

FP8_QUERY = "known.fa-fp8-kv-query-cast-without-scale"
DP_PADDED_RAGGED = "known.flashinfer-mla-dp-padded-ragged-prefill"
SOFTCAP = "known.flashinfer-softcap-planned-uncapped"
RAGGED_WINDOW = "known.flashinfer-ragged-prefill-drops-window"
RADIX = "known.deterministic-radix-cache-diverges"
FP8 = "--kv-cache-dtype fp8_e4m3"
DP_FA = "known.fa-dp-attention-padded-rows-nan"
DP = "--enable-dp-attention --dp-size 2 --tp-size 4"  # attention TP 2: each DP group's rows padded to a multiple of 2


def _refused_by(flags: str, name: str, gpu: str) -> set[str]:
    """The rules refusing the configuration, or the default backend resolve() fell back from."""
    return refusing_rules_of(lambda: resolve(ServerArgs.from_flags(flags.split()), model(name), fa3_gpu(gpu)))


@pytest.mark.parametrize(
    "flags, name, gpu, entry",
    [
        (f"--attention-backend fa3 {FP8}", "Qwen2.5-7B-Instruct", "sm90", FP8_QUERY),
        (f"--attention-backend flashinfer {DP}", "DeepSeek-V2-Lite", "sm90", DP_PADDED_RAGGED),
        (f"--attention-backend fa3 {DP}", "Qwen3-30B-A3B", "sm90", DP_FA),  # sglang issue 18668's launch
        ("--decode-attention-backend flashinfer --prefill-attention-backend fa3", "gemma-2-9b-it", "sm90", SOFTCAP),
        ("--attention-backend flashinfer", "gemma-3-1b-it", "sm90", RAGGED_WINDOW),
    ],
)
def test_a_reported_failure_is_refused_with_its_issue_unless_allowed_and_declared(rules, flags, name, gpu, entry):
    args, facts, platform = ServerArgs.from_flags(flags.split()), model(name), fa3_gpu(gpu)
    with pytest.raises(PlanError) as err:
        resolve(args, facts, platform)
    (v,) = err.value.violations
    assert (v.rule, v.kind) == (entry, "known_failure")
    assert v.issue.startswith("https://github.com/sgl-project/sglang/")
    r = resolve(args, facts, platform, allow_known_failures=[entry])
    assert any(w.startswith(f"known failure {entry} allowed") for w in r.warnings)
    # SGLang 0.5.23 starts with it: the refusal is a declared difference, and conform accepts it
    assert matching_deviations(rules, args, facts, platform, frozenset({entry})) == {
        "refusal": ["sglang.known-failures-refused"]
    }
    # the failure is in SGLang's backend code: where attngate's own backends run the plan, nothing is refused
    own = resolve(args, facts, platform.model_copy(update={"runs_sglang": False}))
    assert own.plan.prefill_backend == (args.attention_backend or args.prefill_attention_backend)
    assert not own.allowed_known_failures


# ---- FA's FP8 query without a scale (sglang issues 5700, 20820) -----------------------------------------------------


@pytest.mark.parametrize(
    "flags, name, gpu, fires",
    [
        (f"--attention-backend fa3 {FP8}", "Qwen2.5-7B-Instruct", "sm90", True),  # QwQ-32B's Qwen2ForCausalLM
        (f"--attention-backend fa3 {FP8} --is-embedding", "gte-Qwen2-7B-instruct", "sm90", True),
        (
            f"--prefill-attention-backend flashinfer --decode-attention-backend fa3 {FP8}",
            "Qwen2.5-7B-Instruct",
            "sm90",
            True,
        ),
        (f"--attention-backend fa4 {FP8}", "Qwen2.5-7B-Instruct", "sm100", True),  # FA4 casts in decode
        # neighbours that work: FA4 prefill keeps its query, another backend reads the cache, a 16-bit cache, another family
        (
            f"--prefill-attention-backend fa4 --decode-attention-backend trtllm_mha {FP8}",
            "Qwen2.5-7B-Instruct",
            "sm100",
            False,
        ),
        (f"--attention-backend flashinfer {FP8}", "Qwen2.5-7B-Instruct", "sm90", False),
        ("--attention-backend fa3", "Qwen2.5-7B-Instruct", "sm90", False),
        (f"--attention-backend fa3 {FP8}", "Qwen3-8B", "sm90", False),
        (f"--attention-backend fa3 {FP8}", "Llama-3.1-8B", "sm90", False),
    ],
)
def test_fp8_query_cast_fires_on_fa_over_an_fp8_cache_for_the_reported_families(flags, name, gpu, fires):
    assert (FP8_QUERY in _refused_by(flags, name, gpu)) is fires


def test_fp8_query_cast_moves_hoppers_default_to_flashinfer_naming_the_failure():
    """SGLang's default on Hopper is fa3; with an fp8_e4m3 cache a Qwen2 model then answers gibberish, so attngate's
    default falls back to the first candidate that reads the cache with a scaled query."""
    r = resolve(ServerArgs.from_flags(FP8.split()), model("Qwen2.5-7B-Instruct"), Platform.from_name("sm90"))
    assert (r.plan.prefill_backend, r.plan.decode_backend) == ("flashinfer", "flashinfer")
    assert r.default_refusal[0] == "fa3" and [v.rule for v in r.default_refusal[1]] == [FP8_QUERY]
    qwen3 = resolve(ServerArgs.from_flags(FP8.split()), model("Qwen3-8B"), Platform.from_name("sm90"))
    assert qwen3.plan.prefill_backend == "fa3" and qwen3.default_refusal is None


# ---- FlashInfer MLA's ragged prefill over DP attention's padded rows (sglang PR 30916, fix PR 35876) -----------------


@pytest.mark.parametrize(
    "flags, name, fires",
    [
        (f"--attention-backend flashinfer {DP}", "DeepSeek-V2-Lite", True),
        ("--attention-backend flashinfer --enable-dp-attention --dp-size 2 --tp-size 8", "Kimi-K2-Instruct", True),
        # neighbours: one attention TP rank per DP group (no padding), the ragged path off, no prefill on FlashInfer,
        # an MHA model (FlashInfer's MHA backend), no DP attention, a PD decode instance (it never prefills)
        ("--attention-backend flashinfer --enable-dp-attention --dp-size 2 --tp-size 2", "DeepSeek-V2-Lite", False),
        (f"--attention-backend flashinfer {DP} --attn-cp-size 2", "DeepSeek-V2-Lite", False),
        (f"--attention-backend flashinfer {DP} --flashinfer-mla-disable-ragged", "DeepSeek-V2-Lite", False),
        (f"--prefill-attention-backend fa3 --decode-attention-backend flashinfer {DP}", "DeepSeek-V2-Lite", False),
        (f"--attention-backend flashinfer {DP}", "Llama-3.1-8B", False),
        ("--attention-backend flashinfer --tp-size 4", "DeepSeek-V2-Lite", False),
        (f"--attention-backend flashinfer {DP} --disaggregation-mode decode", "DeepSeek-V2-Lite", False),
    ],
)
def test_dp_padded_ragged_prefill_fires_on_flashinfer_mla_with_attention_tp_above_1(flags, name, fires):
    assert (DP_PADDED_RAGGED in _refused_by(flags, name, "sm90")) is fires


# ---- SGLang's FlashInfer backend: a soft-cap and a ragged window given per call, not planned (sglang issue 33915) -----


@pytest.mark.parametrize(
    "flags, name, gpu, refused_by",
    [
        ("--attention-backend flashinfer", "gemma-2-9b-it", "sm90", {SOFTCAP, RAGGED_WINDOW}),
        ("--attention-backend flashinfer --enable-deterministic-inference", "gemma-2-9b", "sm90", {SOFTCAP}),  # paged
        ("--prefill-attention-backend fa3 --decode-attention-backend flashinfer", "gemma-2-9b-it", "sm90", {SOFTCAP}),
        ("--attention-backend flashinfer", "gemma-3-1b-it", "sm90", {RAGGED_WINDOW}),  # Gemma-3 takes no cap
        # neighbours: another backend, a piecewise CUDA graph (paged prefill only), a multimodal Gemma-3 (paged prefill
        # only), Mistral (SGLang's Llama model takes no window at all), a model with neither
        ("--attention-backend fa3", "gemma-2-9b-it", "sm90", set()),
        ("--attention-backend triton", "gemma-2-9b-it", "sm80", set()),
        ("--attention-backend flashinfer --enable-piecewise-cuda-graph", "gemma-3-1b-it", "sm90", set()),
        ("--attention-backend flashinfer", "gemma-3-27b-it", "sm90", set()),
        ("--attention-backend flashinfer", "Mistral-7B-v0.1", "sm90", set()),
        ("--attention-backend flashinfer", "Llama-3.1-8B", "sm90", set()),
    ],
)
def test_flashinfer_plan_time_state_fires_on_capped_and_windowed_models(flags, name, gpu, refused_by):
    assert _refused_by(flags, name, gpu) & {SOFTCAP, RAGGED_WINDOW} == refused_by


def test_a_grok_config_without_a_cap_is_capped_by_sglang_and_so_refused_on_flashinfer():
    """Grok-1 caps at 30 where its config gives no attn_logit_softcapping (models/grok.py l.425): has_softcap is false,
    SGLang's Grok still caps, and its FlashInfer backend drops the cap."""
    raw = {**json.loads((MODELS / "Llama-3.1-8B.json").read_text()), "architectures": ["Grok1ForCausalLM"]}
    grok = ModelFacts.from_hf_dict({**raw, "model_type": "grok-1"})
    args = ServerArgs(attention_backend="flashinfer")
    assert grok.attn_logit_softcapping is None
    assert SOFTCAP in refusing_rules_of(lambda: resolve(args, grok, fa3_gpu("sm90")))


def test_the_default_on_ampere_moves_gemma2_off_flashinfer_naming_both_failures():
    r = resolve(ServerArgs(), model("gemma-2-9b-it"), Platform.from_name("sm80"))
    assert r.plan.prefill_backend != "flashinfer" and r.default_refusal[0] == "flashinfer"
    assert {v.rule for v in r.default_refusal[1]} == {SOFTCAP, RAGGED_WINDOW}


# ---- deterministic inference keeps no radix cache (sglang issue 22819) ------------------------------------------------


@pytest.mark.parametrize(
    "flags, name, gpu, backend, by",
    [
        ("--enable-deterministic-inference", "Qwen3-8B", "sm90", "fa3", RADIX),  # SGLang keeps the cache here
        ("--enable-deterministic-inference --attention-backend triton", "Llama-3.1-8B", "sm90", "triton", RADIX),
        ("--enable-deterministic-inference", "DeepSeek-V2-Lite", "sm100", "triton", RADIX),
        ("--rl-on-policy-target fsdp", "Llama-3.1-8B", "sm90", "fa3", RADIX),
        # where SGLang turns it off itself the rule that mirrors it says so
        (
            "--enable-deterministic-inference --attention-backend flashinfer",
            "Llama-3.1-8B",
            "sm90",
            "flashinfer",
            "deterministic.radix-cache-off",
        ),
        # the user's own --disable-radix-cache, or no deterministic inference: nothing to change
        ("--enable-deterministic-inference --disable-radix-cache", "Qwen3-8B", "sm90", "fa3", None),
        ("--attention-backend fa3", "Qwen3-8B", "sm90", "fa3", None),
    ],
)
def test_deterministic_inference_turns_the_radix_cache_off_with_a_warning(rules, flags, name, gpu, backend, by):
    args = ServerArgs.from_flags(flags.split())
    r = resolve(args, model(name), fa3_gpu(gpu))
    assert r.plan.prefill_backend == backend
    changed = [a for a in r.adjustments if a.field == "disable_radix_cache"]
    assert [a.rule for a in changed] == ([by] if by else [])
    assert r.server_args.disable_radix_cache is (by is not None or args.disable_radix_cache)
    if by == RADIX:
        assert changed[0].issue == "https://github.com/sgl-project/sglang/issues/22819"
        assert any("split boundary" in w for w in r.warnings)
        # SGLang keeps the cache: the difference is declared
        assert matching_deviations(rules, args, model(name), fa3_gpu(gpu)) == {
            "disable_radix_cache": ["sglang.deterministic-keeps-radix-cache"]
        }


def test_deterministic_inference_with_the_hierarchical_cache_is_refused_and_declared(rules):
    """The hierarchical cache is the radix tree's host tier: with the radix cache off it is refused."""
    args = ServerArgs.from_flags(
        "--enable-deterministic-inference --enable-hierarchical-cache --hicache-io-backend direct".split()
    )
    with pytest.raises(PlanError) as err:
        resolve(args, model("Qwen3-8B"), fa3_gpu("sm90"))
    assert [v.rule for v in err.value.violations] == ["hicache.needs-radix-cache"]
    assert RADIX in {a.rule for a in err.value.adjustments}
    assert matching_deviations(
        rules, args, model("Qwen3-8B"), fa3_gpu("sm90"), frozenset({"hicache.needs-radix-cache"})
    ) == {"refusal": ["sglang.deterministic-keeps-radix-cache"]}


@pytest.mark.parametrize(
    "flags, name, gpu",
    [
        ("--attention-backend flashinfer", "gemma-2-9b-it", "sm90"),
        ("--attention-backend flashinfer", "gemma-3-1b-it", "sm90"),
        ("--enable-deterministic-inference", "Qwen3-8B", "sm90"),
    ],
)
def test_where_attngates_own_backends_run_the_plan_sglangs_failures_do_not_apply(flags, name, gpu):
    """runs_sglang false (AttngateRuntime, the transformers path): attngate's FlashInfer backend plans the cap and the
    window on every wrapper, and no SGLang scheduler keeps a radix cache."""
    args = ServerArgs.from_flags(flags.split())
    r = resolve(args, model(name), Platform.from_name(gpu, has_flash_attn_interface=True, runs_sglang=False))
    assert r.default_refusal is None and not r.allowed_known_failures
    assert r.server_args.disable_radix_cache is False
    assert not ({a.rule for a in r.adjustments} & {SOFTCAP, RAGGED_WINDOW, RADIX})


# ---- torch_native's causal window on a bidirectional layer (sglang issue 33603) -------------------------------------

TORCH_WINDOW = "known.torch-native-bidirectional-window-ignored"


def test_torch_native_refuses_a_bidirectional_window_only_where_sglangs_backend_runs_it(rules):
    from tests.support.helpers import embedding_gemma

    args, platform = ServerArgs.from_flags("--attention-backend torch_native --is-embedding".split()), fa3_gpu("sm90")
    with pytest.raises(PlanError) as err:
        resolve(args, embedding_gemma(), platform)
    assert [(v.rule, v.kind) for v in err.value.violations] == [(TORCH_WINDOW, "known_failure")]
    assert matching_deviations(rules, args, embedding_gemma(), platform, frozenset({TORCH_WINDOW})) == {
        "refusal": ["sglang.known-failures-refused"]
    }
    own = resolve(args, embedding_gemma(), platform.model_copy(update={"runs_sglang": False}))
    assert own.plan.prefill_backend == "torch_native"  # attngate's torch_native takes the window both ways
    # a causal model's window is SGLang's torch_native's own: not refused
    causal = resolve(ServerArgs(attention_backend="torch_native"), model("gemma-3-1b-it"), platform)
    assert TORCH_WINDOW not in {a.rule for a in causal.adjustments} and causal.plan.prefill_backend == "torch_native"


# ---- FA over DP attention's padded rows (sglang issue 18668) --------------------------------------------------------


@settings(max_examples=40, deadline=5000)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    dp=st.sampled_from([1, 2, 4, 8]),
    backend=st.sampled_from(["fa3", "fa4", "flashinfer", "triton"]),
    name=st.sampled_from(["Qwen3-30B-A3B", "Llama-3.1-8B"]),
)
def test_fa_over_dp_padded_rows_is_refused_exactly_where_attention_tp_pads(tp, dp, backend, name):
    """Over TP x DP sizes x backends: the known failure fires on fa3/fa4 under DP attention where the attention TP size
    (tp / dp) is above 1, the padding's condition, and nowhere else; attngate's own backends are never refused it."""
    gpu = "sm100" if backend == "fa4" else "sm90"
    flags = f"--attention-backend {backend} --tp-size {tp} --dp-size {dp} --enable-dp-attention"
    try:
        args = ServerArgs.from_flags(flags.split())
    except AttngateError:
        return  # a DP size that does not divide TP is refused as an argument
    fired = DP_FA in _refused_by(flags, name, gpu)
    assert fired == (backend in ("fa3", "fa4") and dp > 1 and tp // dp > 1 and tp % dp == 0)
    own = fa3_gpu(gpu).model_copy(update={"runs_sglang": False})
    assert DP_FA not in refusing_rules_of(lambda: resolve(args, model(name), own))
