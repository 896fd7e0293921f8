"""rules.yaml "Default backend choice": the model overrides of architectures outside examples/models (R66 to R70), the
default where FlashInfer is not installed, the fallback where triton refuses, and explain's per-backend verdicts."""

from __future__ import annotations

import json

import pytest

from attngate import ModelFacts, PlanError, Platform, ServerArgs, resolve
from tests.engine.shipped.common import EXAONE4, LFM2, OLMO3, QWEN3_NEXT, as_architecture
from tests.support.helpers import MODELS, fa3_gpu, model, refusing_rules_of


@pytest.mark.parametrize("name, backend", [("Llama-3.1-8B", "triton"), ("gpt-oss-20b", "triton")])
def test_default_backend_without_flashinfer_installed_is_triton(name, backend):
    """R5: the generic MHA default is flashinfer only where FlashInfer imports, else triton (as for sinks)."""
    r = resolve(ServerArgs(), model(name), Platform.from_name("sm80", has_flashinfer=False))
    assert r.plan.prefill_backend == backend
    assert resolve(ServerArgs(), model("Llama-3.1-8B"), Platform.from_name("sm80")).plan.prefill_backend == "flashinfer"


@pytest.mark.parametrize(
    "flags, arch, gpu, backend, hybrid_pool_off",
    [
        ("", ("Olmo2ForCausalLM", "olmo2"), "sm90", "fa3", True),
        ("", ("Olmo2ForCausalLM", "olmo2"), "sm80", "fa3", True),  # FA3 from SM80 up, never FlashInfer
        ("", ("Olmo2ForCausalLM", "olmo2"), "sm100", "trtllm_mha", True),
        (
            "",
            ("Olmo3ForCausalLM", "olmo3", OLMO3),
            "sm90",
            "fa3",
            True,
        ),  # 0.5.23: one pool for Olmo 3's window/full mix too
        ("--attention-backend triton", ("Olmo2ForCausalLM", "olmo2"), "sm90", "triton", True),
        ("", ("Gemma4ForCausalLM", "gemma4_text"), "sm90", "triton", False),
        ("", ("Gemma4ForConditionalGeneration", "gemma4"), "sm100", "trtllm_mha", False),
        ("--attention-backend fa4", ("Gemma4ForCausalLM", "gemma4_text"), "sm100", "fa4", False),
        ("", ("Exaone4ForCausalLM", "exaone4", EXAONE4), "sm90", "fa3", True),
        ("", ("Exaone4ForCausalLM", "exaone4"), "sm80", "flashinfer", False),  # no window layers: no constraint
        (
            "",
            ("NemotronHForCausalLM", "nemotron_h", {"hybrid_override_pattern": "M-M*" * 8}),
            "sm100",
            "flashinfer",
            False,
        ),
        ("", ("Lfm2ForCausalLM", "lfm2", LFM2), "sm90", "fa3", False),  # off SM100: the generic default
        ("", ("FalconH1ForCausalLM", "falcon_h1"), "sm100", "triton", False),
        (
            "",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm100",
            "triton",
            False,
        ),  # radix cache on, no speculation
        ("--disable-radix-cache", ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT), "sm100", "trtllm_mha", False),
        ("", ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT), "sm90", "fa3", False),
        (
            "--attention-backend trtllm_mha",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm100",
            "trtllm_mha",
            False,
        ),
    ],
)
def test_model_override_defaults(flags, arch, gpu, backend, hybrid_pool_off):
    r = resolve(
        ServerArgs.from_flags(flags.split()),
        as_architecture(*arch[:2], **(arch[2] if len(arch) > 2 else {})),
        fa3_gpu(gpu),
    )
    assert (r.plan.prefill_backend, r.server_args.disable_hybrid_swa_memory) == (backend, hybrid_pool_off)
    if backend == "trtllm_mha":
        assert r.server_args.page_size == 64


@pytest.mark.parametrize(
    "flags, arch, gpu, rule",
    [
        ("--attention-backend flashinfer", ("Olmo2ForCausalLM", "olmo2"), "sm90", "olmo2.no-flashinfer"),
        ("--attention-backend fa3", ("Gemma4ForCausalLM", "gemma4_text"), "sm90", "gemma4.backends"),
        ("--prefill-attention-backend flashinfer", ("Gemma4ForCausalLM", "gemma4_text"), "sm90", "gemma4.backends"),
        ("", ("Exaone4ForCausalLM", "exaone4", EXAONE4), "sm80", "exaone4.backends"),  # the default flashinfer
        ("--attention-backend fa4", ("Exaone4ForCausalLM", "exaone4", EXAONE4), "sm100", "exaone4.backends"),
        (
            "--attention-backend triton",
            ("Lfm2ForCausalLM", "lfm2", LFM2),
            "sm90",
            "hybrid.first-layer-not-attention-no-triton",
        ),
        (
            "--attention-backend triton",
            ("NemotronHForCausalLM", "nemotron_h"),
            "sm90",
            "hybrid.first-layer-not-attention-no-triton",
        ),
        ("--page-size 16", ("Lfm2ForCausalLM", "lfm2", LFM2), "sm90", "mamba.radix-cache-page-size-1"),  # no_buffer
        (  # the extra buffer (SGLang's default for Qwen3-Next) takes pages dividing its track interval of 256
            "--page-size 17",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm90",
            "mamba.extra-buffer-page-divides-track-interval",
        ),
        (
            "--attention-backend torch_native",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm100",
            "hybrid-gdn.blackwell-backends",
        ),
        (
            "--attention-backend fa4 --disable-radix-cache",
            ("Qwen3NextForCausalLM", "qwen3_next", QWEN3_NEXT),
            "sm120",
            "hybrid-gdn.blackwell-backends",
        ),  # fa4 on SM100 only
        (
            "--attention-backend fa4",
            ("Lfm2ForCausalLM", "lfm2", LFM2),
            "sm100",
            "mamba.radix-cache-page-size-1",
        ),  # FA4's 128 over a no_buffer Mamba radix cache (FalconH1's extra buffer takes it)
    ],
)
def test_model_override_rejections(flags, arch, gpu, rule):
    facts = as_architecture(*arch[:2], **(arch[2] if len(arch) > 2 else {}))
    assert rule in refusing_rules_of(
        lambda: resolve(ServerArgs.from_flags(flags.split()), facts, fa3_gpu(gpu))
    )  # refused, or its default backend refused


@pytest.mark.parametrize("gpu", ["sm90", "sm100"])
def test_explain_backend_verdicts_are_what_asking_for_each_backend_gives(gpu):
    """explain's per-backend verdict is the outcome of asking for that backend with the same other arguments:
    accepted (or chosen) exactly when resolve() with --attention-backend B keeps B for both phases. EmbeddingGemma
    included: its no-KV-pool adjustment (R33) is made only for an FA or unset backend, so triton stays accepted."""
    from tests.support.helpers import MODELS, embedding_gemma

    configs = [model(p.stem) for p in sorted(MODELS.glob("*.json"))] + [embedding_gemma()]
    explained = 0
    for facts in configs:
        try:  # (EmbeddingGemma's default on SM100 is refused: trtllm_mha cannot run without a KV pool, as in SGLang)
            verdicts = {
                v.backend: v for v in resolve(ServerArgs(), facts, Platform.from_name(gpu)).explanation.backends
            }
        except PlanError:
            continue
        explained += 1
        for backend, verdict in verdicts.items():
            try:
                r = resolve(ServerArgs(attention_backend=backend), facts, Platform.from_name(gpu))
                kept = r.plan.prefill_backend == r.plan.decode_backend == backend
            except PlanError:
                kept = False
            assert (verdict.status != "rejected") is kept, (facts.source, backend, verdict)
    assert explained >= len(configs) - 1


@pytest.mark.parametrize("kernels, fallback", [("sglang", "fa3"), ("attngate", "torch_native")])
@pytest.mark.parametrize("head_dim, refused", [(8, True), (16, False)])
def test_triton_refuses_a_qk_head_dim_below_9(head_dim, refused, kernels, fallback):
    """triton.qk-head-dim-at-least-9 (Triton's tl.dot needs K >= 16 and SGLang's kernels tile the head dim to a power
    of two): on SM80, where triton is the default, the default falls back to the first candidate that runs: FA3 where
    sgl_kernel's build is installed (FA3 runs a head dim <= 64 with its 64-wide kernel), else torch_native."""
    facts = ModelFacts.from_hf_dict({**json.loads((MODELS / "Qwen3-8B.json").read_text()), "head_dim": head_dim})
    platform = Platform.from_name("sm80", kernels=[kernels])
    named = lambda: resolve(ServerArgs(attention_backend="triton"), facts, platform)  # noqa: E731
    assert ("triton.qk-head-dim-at-least-9" in refusing_rules_of(named)) == refused
    assert resolve(ServerArgs(), facts, platform).plan.prefill_backend == (fallback if refused else "triton")
