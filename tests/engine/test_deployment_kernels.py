"""Whose kernels a kernel limit is (issue 51): SGLang's deployment (runs_sglang, the default of explain and conform)
runs SGLang 0.5.23's own FA4 (vendored, with an SM120 paged path) and sgl_kernel's FA3 (which takes learned sinks and
an fp8_e4m3 cache); attngate's own backends (runs_sglang false) run flash_attn.cute 4.0.0b36 and upstream FA3. A
limit of attngate's kernels refuses attngate's plans only, so conform agrees with SGLang there with no deviation; the
limits SGLang's deployment shares stay refused there and declared in sglang.kernel-limits-at-start-up."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attngate import PlanError, Platform, ServerArgs, resolve
from attngate.rules.deviations import matching_deviations
from tests.support.helpers import model

PAGES = "fa.cute-pages-on-sm90-and-sm100-only"
FP8 = "fa.cute-fp8-kv-on-sm100-only"
ABSORBED = "fa.mla-needs-absorbed-kernel"
FA_LIMITS = {PAGES, FP8, ABSORBED}
DEVIATION = {"refusal": ["sglang.kernel-limits-at-start-up"]}


def _refusals(args: ServerArgs, name: str, platform: Platform) -> set[str]:
    try:
        resolve(args, model(name), platform)
    except PlanError as err:
        return {v.rule for v in err.violations}
    return set()


@pytest.mark.parametrize(
    "flags, name, gpu, backend",
    [
        # sgl_kernel's FA3 takes gpt-oss's sinks and an fp8_e4m3 cache on Hopper (gpt-oss's override picks fa3 there)
        ("--kv-cache-dtype fp8_e4m3", "gpt-oss-20b", "sm90", "fa3"),
        ("--attention-backend fa3 --kv-cache-dtype fp8_e4m3", "gpt-oss-120b", "sm90", "fa3"),
        # SGLang's FA4 pages through its own SM120 forward host
        ("--attention-backend fa4", "Llama-3.1-8B", "sm120", "fa4"),
        ("--attention-backend fa4", "Qwen3-8B", "sm121", "fa4"),
    ],
)
def test_sglang_runs_what_only_attngates_kernels_cannot(rules, flags, name, gpu, backend):
    args = ServerArgs.from_flags(flags.split())
    sglang = resolve(args, model(name), Platform.from_name(gpu))
    assert sglang.plan.prefill_backend == sglang.plan.decode_backend == backend
    assert not matching_deviations(rules, args, model(name), Platform.from_name(gpu), frozenset())
    # attngate's own backends with the same kernel set: flash_attn.cute 4.0.0b36 or upstream FA3 cannot run it
    own = Platform.from_name(gpu, runs_sglang=False)
    if args.attention_backend is None:
        assert resolve(args, model(name), own).plan.decode_backend != backend  # the default moves on
    else:
        assert _refusals(args, name, own) & FA_LIMITS


@pytest.mark.parametrize(
    "flags, name, gpu, rule",
    [
        ("--attention-backend fa4", "Llama-3.1-8B", "sm80", PAGES),  # SGLang's FA4: no paged KV on SM8x, l.1431
        ("--attention-backend fa4", "Qwen3-8B", "sm86", PAGES),
        ("--attention-backend fa4 --kv-cache-dtype fp8_e4m3", "Llama-3.1-8B", "sm90", FP8),  # FP8 on SM100 only
        ("--attention-backend fa4 --kv-cache-dtype fp8_e4m3", "Llama-3.1-8B", "sm120", FP8),
        ("--attention-backend fa4", "DeepSeek-V2-Lite", "sm90", ABSORBED),  # qv on Blackwell only, l.1016
    ],
)
def test_limits_of_sglangs_own_kernels_stay_refused_and_declared(rules, flags, name, gpu, rule):
    args, platform = ServerArgs.from_flags(flags.split()), Platform.from_name(gpu)
    assert rule in _refusals(args, name, platform)
    assert matching_deviations(rules, args, model(name), platform, frozenset({rule})) == DEVIATION
    assert rule in _refusals(args, name, platform.model_copy(update={"runs_sglang": False}))


def _sglang_fa_fails(backend: str, sm_major: int, use_mla: bool, kv_fp8: bool) -> bool:
    """SGLang 0.5.23's FA kernels at their first forward, read off its source: fa3 is sgl_kernel's FA3 (sinks, FP8
    e4m3, absorbed MLA on SM90); fa4 the vendored FA4 (kernels/ops/attention/flash_attn/cute/interface.py): no paged
    KV on SM8x (l.1431), FP8 K/V on SM10x only (l.729-731), qv on SM10x only (l.1016); SM12x pages (fa4_sm120)."""
    if backend == "fa3":
        return False  # where the registry takes it (fa3.requires-sm80-or-sm90 refuses the rest)
    return sm_major == 8 or (kv_fp8 and sm_major != 10) or (use_mla and sm_major != 10)


@settings(max_examples=60, deadline=5000)
@given(
    name=st.sampled_from(["Llama-3.1-8B", "gpt-oss-20b", "Qwen3-8B", "DeepSeek-V2-Lite", "gemma-3-1b-it"]),
    gpu=st.sampled_from(["sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm120", "sm121"]),
    backend=st.sampled_from(["fa3", "fa4"]),
    kv=st.sampled_from(["auto", "bf16", "fp8_e4m3"]),
)
def test_fa_kernel_limits_follow_whose_kernels_run(name, gpu, backend, kv):
    """Over models x GPUs x FA backends x caches: under SGLang's deployment the FA kernel-limit rules refuse exactly
    where SGLang's own kernels fail; attngate's own kernels refuse at least as much (they run less)."""
    args = ServerArgs(attention_backend=backend, kv_cache_dtype=kv)
    facts, sglang = model(name), Platform.from_name(gpu)
    if backend == "fa3" and not (sglang.sm_major == 9 or (sglang.sm_major == 8 and not facts.use_mla)):
        return  # SGLang's registry refuses it (declared in sglang.registry-refusals-at-start-up)
    fired = _refusals(args, name, sglang) & FA_LIMITS
    assert bool(fired) == _sglang_fa_fails(backend, sglang.sm_major, facts.use_mla, kv == "fp8_e4m3"), fired
    assert fired <= _refusals(args, name, sglang.model_copy(update={"runs_sglang": False}))


@pytest.mark.parametrize(
    "flags, gpu, refused",
    [
        ("--attention-backend trtllm_mla", "sm120", True),  # sglang issue 24633: TllmGenFmhaRunner on SM12x
        ("--attention-backend trtllm_mla --kv-cache-dtype fp8_e4m3", "sm121", True),
        ("--prefill-attention-backend trtllm_mla --decode-attention-backend flashinfer", "sm120", True),
        ("--decode-attention-backend trtllm_mla --prefill-attention-backend flashinfer", "sm120", False),  # xqa decode
        ("--attention-backend trtllm_mla", "sm100", False),
        ("--attention-backend trtllm_mla", "sm103", False),
    ],
)
def test_trtllm_mla_prefill_runs_on_sm100_and_sm103_only(rules, flags, gpu, refused):
    """trtllm-mla.prefill-sm100-only: SGLang admits trtllm_mla on every Blackwell and its prefill then fails on SM12x
    (a limit of its deployment's kernel, declared in sglang.kernel-limits-at-start-up); its decode runs there."""
    rule = "trtllm-mla.prefill-sm100-only"
    args, platform = ServerArgs.from_flags(flags.split()), Platform.from_name(gpu)
    assert (rule in _refusals(args, "DeepSeek-V3", platform)) == refused
    if refused:
        assert matching_deviations(rules, args, model("DeepSeek-V3"), platform, frozenset({rule})) == DEVIATION


def test_flashinfer_mla_off_the_deepseek_latent_is_a_declared_kernel_limit(rules):
    """flashinfer.mla-head-dims: an MLA model of another latent geometry (MiniCPM3: kv_lora_rank 256, rope dim 32) is
    refused FlashInfer MLA, which SGLang 0.5.23 picks by default off Hopper and FlashInfer 0.7.2 runs for 512/64 only;
    the default falls back, declared in sglang.kernel-limits-at-start-up."""
    from attngate import ModelFacts

    raw = {
        "architectures": ["MiniCPM3ForCausalLM"],
        "model_type": "minicpm3",
        "hidden_size": 2560,
        "num_attention_heads": 40,
        "num_key_value_heads": 40,
        "num_hidden_layers": 62,
        "qk_nope_head_dim": 64,
        "qk_rope_head_dim": 32,
        "q_lora_rank": 768,
        "kv_lora_rank": 256,
    }
    facts, platform = ModelFacts.from_hf_dict(raw, source="MiniCPM3-4B"), Platform.from_name("sm103")
    args = ServerArgs(attention_backend="flashinfer")
    with pytest.raises(PlanError) as err:
        resolve(args, facts, platform)
    refused = frozenset(v.rule for v in err.value.violations)
    assert "flashinfer.mla-head-dims" in refused
    assert matching_deviations(rules, args, facts, platform, refused) == DEVIATION
    assert resolve(ServerArgs(), facts, platform).plan.decode_backend != "flashinfer"
