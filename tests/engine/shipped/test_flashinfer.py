"""rules.yaml "FlashInfer backend": wrapper dispatch and the per-layer window from the model's facts, what encoder-only
layers write and read, and the prefill kernel family."""

from __future__ import annotations

import json

import pytest

from attngate import ForwardMode, LayerKind, PlanError, Platform, ServerArgs, resolve
from attngate.facts.model import ModelFacts
from tests.engine.shipped.common import SGLANG_FLASHINFER_PLAN_TIME
from tests.support.helpers import MODELS, fa3_gpu, model


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.json")), ids=lambda p: p.stem)
def test_wrapper_dispatch_from_model_facts(path):
    m = model(path.stem)
    try:
        r = resolve(
            ServerArgs(attention_backend="flashinfer"),
            m,
            Platform.from_name("sm90"),
            allow_known_failures=SGLANG_FLASHINFER_PLAN_TIME,  # gemma: window and soft-cap (sglang issue 33915)
        )
    except PlanError:
        assert m.has_attention_sinks or m.model_type == "llama4" or m.head_dim not in (64, 128, 256)  # MiniLM: 32
        return
    expected = (
        "sliding_window"
        if (m.has_sliding_window or m.is_local_attention_model)
        else "cross_attention"
        if m.has_cross_attention
        else "single"
    )
    assert r.plan.flashinfer.wrapper_dispatch == expected
    assert r.plan.layer("sliding_window").common.use_window and not r.plan.layer("full").common.use_window
    full_index = r.plan.layer("full").flashinfer.wrapper_index
    assert full_index == (1 if expected == "sliding_window" else 0)
    assert r.plan.layer("cross_attention").flashinfer.wrapper_index == (1 if expected == "cross_attention" else 0)


def test_ragged_extend_pages_only_the_prefix():
    r = resolve(ServerArgs(attention_backend="flashinfer"), model("Mistral-7B-v0.1"), Platform.from_name("sm90"))
    assert r.plan.mode("extend").flashinfer.paged_kv_extent == "prefix"
    assert r.plan.mode("decode").flashinfer.paged_kv_extent == "prefix_plus_new"


@pytest.mark.parametrize("backend", ["fa3", "flashinfer"])
@pytest.mark.parametrize("det", [False, True])
def test_encoder_only_layers_write_the_cache_exactly_where_a_backend_reads_it(backend, det):
    """FA and ragged FlashInfer attend on the raw K/V of encoder-only layers; FlashInfer without
    ragged prefill (deterministic inference) reads them back through the paged wrapper."""
    r = resolve(
        ServerArgs(attention_backend=backend, enable_deterministic_inference=det, is_embedding=True),
        model("gte-Qwen2-7B-instruct"),
        fa3_gpu(),
    )
    paged_extend = (
        backend == "flashinfer" and r.plan.mode(ForwardMode.EXTEND).flashinfer.paged_kv_extent == "prefix_plus_new"
    )
    assert paged_extend is (backend == "flashinfer" and det)
    assert r.plan.layer(LayerKind.ENCODER_ONLY).common.write_kv_cache is paged_extend
    assert r.plan.layer(LayerKind.ENCODER_ONLY).common.causal is False


@pytest.mark.parametrize("gpu", ["sm90", "sm100"])
@pytest.mark.parametrize("backend", [None, "fa3", "flashinfer", "triton"])
@pytest.mark.parametrize("det", [False, True])
def test_mla_encoder_only_layers_write_their_latent_cache(gpu, backend, det):
    """An MLA model's bidirectional layers attend through the latent cache (its absorbed path reads it back), so
    they write it on every backend that runs them (layer.encoder-only-writes-no-cache excludes MLA; invariant
    mla-keeps-its-kv-cache), and FlashInfer MLA, which plans causal self-attention only, refuses them
    (flashinfer.mla-full-attention-only). Found by tests/backends/test_config_fuzz_plans.py: DeepSeek-V2-Lite with
    is_causal false, refused by the backends' own checks on SM90 fa3 and on SM100's default."""
    facts = ModelFacts.from_hf_dict({**json.loads((MODELS / "DeepSeek-V2-Lite.json").read_text()), "is_causal": False})
    assert facts.use_mla and facts.is_encoder_only
    args = ServerArgs(attention_backend=backend, enable_deterministic_inference=det)
    try:
        plan = resolve(args, facts, Platform.from_name(gpu, runs_sglang=False)).plan
    except PlanError as err:
        refused_by = {v.rule for v in err.violations}
        if backend == "flashinfer":
            assert "flashinfer.mla-full-attention-only" in refused_by
        else:
            assert (backend, gpu, refused_by) == ("fa3", "sm100", {"fa3.requires-sm80-or-sm90"})
        return
    assert plan.prefill_backend != "flashinfer" and plan.layer(LayerKind.ENCODER_ONLY).common.write_kv_cache


@pytest.mark.parametrize(
    "name, gpu, args, family",
    [
        ("Llama-3.1-8B", "sm90", {}, "fa3"),
        ("Llama-3.1-8B", "sm80", {}, "fa2"),
        ("Llama-3.1-8B", "sm100", {}, "fa2"),
        ("Llama-3.1-8B", "sm90", {"enable_deterministic_inference": True}, "fa3"),  # fixed splits on fa3
        ("Mistral-7B-v0.1", "sm90", {}, "fa2"),  # the window's paged half under ragged prefill takes a custom mask
        ("Mistral-7B-v0.1", "sm90", {"enable_deterministic_inference": True}, "fa3"),  # no ragged: window_left only
        ("whisper-large-v3-turbo", "sm90", {}, "fa3"),  # head dim 64, non-causal cross attention
        ("DeepSeek-V2-Lite", "sm90", {}, "fa3"),  # MLA non-absorbed prefill, 192/128
        (
            "Llama-3.1-8B",
            "sm90",
            {
                "speculative_algorithm": "EAGLE",
                "speculative_eagle_topk": 4,
                "speculative_num_steps": 3,
                "speculative_num_draft_tokens": 8,
            },
            "fa2",
        ),  # tree masks
    ],
)
def test_flashinfer_prefill_kernel_family(name, gpu, args, family):
    plan = resolve(ServerArgs(attention_backend="flashinfer", **args), model(name), Platform.from_name(gpu)).plan
    assert plan.flashinfer.prefill_kernel_family == family
