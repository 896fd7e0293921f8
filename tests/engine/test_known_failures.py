"""SGLang 0.5.23's reported failures as rules (issue 51): each fires on a real config of examples/models, not on the
neighbouring configuration that works, names its issue, gives way to --allow-known-failure, and, where SGLang accepts
the configuration, is declared in the deviation that says so."""

from __future__ import annotations

import pytest

from attngate import PlanError, Platform, ServerArgs, resolve
from attngate.rules.deviations import matching_deviations
from tests.support.helpers import fa3_gpu, model, refusing_rules_of

FP8_QUERY = "known.fa-fp8-kv-query-cast-without-scale"
DP_PADDED_RAGGED = "known.flashinfer-mla-dp-padded-ragged-prefill"
FP8 = "--kv-cache-dtype fp8_e4m3"
DP = "--enable-dp-attention --dp-size 2 --tp-size 4"  # attention TP 2: each DP group's rows padded to a multiple of 2


def _refused_by(flags: str, name: str, gpu: str) -> set[str]:
    """The rules refusing the configuration, or the default backend resolve() fell back from."""
    return refusing_rules_of(lambda: resolve(ServerArgs.from_flags(flags.split()), model(name), fa3_gpu(gpu)))


@pytest.mark.parametrize(
    "flags, name, gpu, entry",
    [
        (f"--attention-backend fa3 {FP8}", "Qwen2.5-7B-Instruct", "sm90", FP8_QUERY),
        (f"--attention-backend flashinfer {DP}", "DeepSeek-V2-Lite", "sm90", DP_PADDED_RAGGED),
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
    assert own.plan.prefill_backend == args.attention_backend and not own.allowed_known_failures


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
