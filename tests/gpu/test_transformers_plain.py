"""``attn_implementation="attngate"`` without a runtime on the GPU: the plan runs prefill and decode on FA4's
varlen kernel (flash_attn.cute), or on FlashInfer's ragged wrapper (DeepSeek's default on an H100, or when configured
with attention_backend flashinfer); bf16 logits against sdpa (eager where transformers has no sdpa path), a left-padded batch, transformers' DynamicCache
and static cache (decode teacher-forced with sdpa's tokens, so ties in bf16 cannot fork the sequences)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("flash_attn.cute")

import attngate.integrations.transformers  # noqa: E402,F401 - registers "attngate"
from attngate import ServerArgs  # noqa: E402
from attngate.integrations.transformers_plain import configure, plan_of  # noqa: E402
from tests.support.transformers_models import config_of  # noqa: E402

GPU_SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "vocab_size": 512,
    "num_hidden_layers": 2,
}
MODELS = {
    "llama": ("Llama-3.1-8B", {}),
    "qwen3": ("Qwen3-8B", {}),
    "mistral-swa": ("Mistral-7B-v0.1", {"sliding_window": 24}),
    "gemma2-softcap-swa": ("gemma-2-9b", {"num_hidden_layers": 4, "sliding_window": 24, "query_pre_attn_scalar": 128}),
    # every expert routed: a bf16 near-tie in the router must not swap experts between the two runs
    "gpt-oss-sinks": (
        "gpt-oss-20b",
        {
            "num_hidden_layers": 4,
            "sliding_window": 24,
            "num_local_experts": 4,
            "num_experts_per_tok": 4,
            "experts_per_token": 4,
            "quantization_config": None,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        },
    ),
    # alternating window and full layers
    "gemma3-pattern": (
        "gemma-3-1b-it",
        {"num_hidden_layers": 4, "sliding_window": 24, "sliding_window_pattern": 2, "query_pre_attn_scalar": 128},
    ),
    # chunked local attention on three layers of four (chunks of 16: the 40-token prompts and the decode cross them);
    # both experts routed, as for gpt-oss
    "llama4-chunked": (
        "Llama-4-Scout-17B-16E-Instruct",
        {
            "num_hidden_layers": 4,
            "attention_chunk_size": 16,
            "num_local_experts": 2,
            "num_experts_per_tok": 2,
            "intermediate_size_mlp": 1024,
        },
    ),
    # MLA at the real latent geometry; the default plan on an H100 runs both phases on FlashInfer (ragged, q/k 192, v 128)
    "deepseek-v3-mla": (
        "DeepSeek-V3",
        {
            "num_key_value_heads": 8,
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            "head_dim": None,
            "q_lora_rank": 64,
            "n_routed_experts": 4,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 256,
            "n_shared_experts": 1,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "quantization_config": None,
        },
    ),
}
EAGER_ONLY = {"gemma2-softcap-swa", "gpt-oss-sinks"}  # transformers has no sdpa path for soft-cap and sinks
TOL = 3e-2  # bf16, relative to the largest logit


def model_pair(name, server_args=None):
    file, overrides = MODELS[name]
    cfg = config_of(file, {**GPU_SHAPE, **overrides})
    torch.manual_seed(0)
    reference = "eager" if name in EAGER_ONLY else "sdpa"
    ref = (
        transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation=reference, dtype=torch.bfloat16
        )
        .cuda()
        .eval()
    )
    ours = (
        transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation="attngate", dtype=torch.bfloat16
        )
        .cuda()
        .eval()
    )
    ours.load_state_dict(ref.state_dict())
    if server_args is not None:
        configure(ours, server_args)
    return ref, ours


def _close(a, b, valid) -> bool:
    a, b = a[valid].float(), b[valid].float()
    return ((a - b).abs().max() / a.abs().max()).item() < TOL


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_prefill_and_decode_on_the_plans_kernels_match_sdpa(name, cache):
    _prefill_and_decode_match(*model_pair(name), cache)


# decode split past 16 keys (the 40-token prompts cross it), pieces sized to the GPU's SMs, at least 4 keys: full
# attention, a window, sinks beside one
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "mistral-swa", "gpt-oss-sinks"])
def test_a_split_decode_on_fa4_matches_sdpa(name, cache, monkeypatch):
    from attngate.integrations import transformers_ops

    monkeypatch.setattr(transformers_ops, "DECODE_SPLIT_KEYS", 16)
    monkeypatch.setattr(transformers_ops, "DECODE_MIN_PIECE_KEYS", 4)
    _prefill_and_decode_match(*model_pair(name), cache)


# torch.compile: inductor around FA4's padded calls (and with CUDA graphs); FlashInfer's path through dynamo only
# (aot_eager). Each attention call is one opaque op (attngate::fa_varlen, or ::plain_kernel_attention on
# FlashInfer) of the graph: fullgraph=True
@pytest.mark.parametrize(
    "server_args, compiler, mode",
    [
        (None, "inductor", None),
        (None, "inductor", "reduce-overhead"),
        (ServerArgs(attention_backend="flashinfer"), "aot_eager", None),
    ],
    ids=["fa4-inductor", "fa4-cudagraphs", "flashinfer-aot_eager"],
)
def test_a_compiled_model_on_the_plans_kernels_matches_sdpa(server_args, compiler, mode):
    if server_args is not None:
        pytest.importorskip("flashinfer")
    ref, ours = model_pair("llama", server_args)
    torch._dynamo.reset()
    if server_args is None:
        configure(ours)  # a never-configured model resolves its plan outside the graph, which fullgraph=True refuses
    compiled = torch.compile(ours.forward, backend=compiler, fullgraph=True, mode=mode)
    if mode == "reduce-overhead":  # CUDA graphs for the decode steps; the prefill eager, as generate() runs it
        eager = ours.forward

        def forward(input_ids, **kw):
            if input_ids.shape[1] > 1:
                return eager(input_ids, **kw)
            out = compiled(input_ids, **kw)
            out.logits = out.logits.clone()  # the graph's output buffer is overwritten by the next replay
            return out

        ours.forward = forward
    else:
        ours.forward = compiled
    _prefill_and_decode_match(ref, ours, "static", steps=6)
    assert plan_of(ours)[0].plan.decode_backend == ("flashinfer" if server_args else "fa3")


# FlashInfer's fa3 ragged variants JIT-build in about 90 s each: the two that tests/gpu/test_flashinfer.py builds too
@pytest.mark.parametrize("name", ["llama", "mistral-swa"])
def test_prefill_and_decode_on_flashinfer_match_sdpa(name):
    pytest.importorskip("flashinfer")
    ref, ours = model_pair(name, ServerArgs(attention_backend="flashinfer"))
    assert plan_of(ours)[0].plan.decode_backend == "flashinfer"
    _prefill_and_decode_match(ref, ours, "dynamic")


def test_a_hybrid_model_runs_its_attention_layers_on_the_plans_kernels():
    """Qwen3-Next: Gated DeltaNet layers 0 and 2 stay in transformers (its torch path, the same on both sides), the
    softmax-attention layers 1 and 3 run on the plan's kernels, found by their model layer index."""
    cfg = transformers.Qwen3NextConfig(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
        num_experts=4,
        num_experts_per_tok=4,
        moe_intermediate_size=256,
        shared_expert_intermediate_size=256,
        layer_types=["linear_attention", "full_attention"] * 2,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    ref = (
        transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation="sdpa", dtype=torch.bfloat16
        )
        .cuda()
        .eval()
    )
    ours = (
        transformers.AutoModelForCausalLM.from_config(
            copy.deepcopy(cfg), attn_implementation="attngate", dtype=torch.bfloat16
        )
        .cuda()
        .eval()
    )
    ours.load_state_dict(ref.state_dict())
    _prefill_and_decode_match(ref, ours, "dynamic", steps=6)
    resolution, layers = plan_of(ours)
    assert resolution.model.attention_layer_ids == (1, 3) and len(layers) == 2


# right padding: each prompt's own forward in place; a decode step over a prompt, its padding and what followed goes
# unpadded (eager), a window that leaves the padding behind in place again
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "mistral-swa", "gpt-oss-sinks"])
def test_decoding_after_right_padding_matches_sdpa(name, cache):
    _prefill_and_decode_match(*model_pair(name), cache, steps=4, padding="right")


def _prefill_and_decode_match(ref, ours, cache, steps=12, padding="left"):
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 512, (3, 40), generator=gen).cuda()
    mask = torch.ones_like(ids)
    mask[1, :9] = 0
    mask[2, :30] = 0
    if padding == "right":
        mask = mask.flip(1)
    tokens = ref.generate(ids, attention_mask=mask, max_new_tokens=steps, do_sample=False)[:, ids.shape[1] :]
    caches = []
    for model in (ref, ours):  # a hybrid's cache needs its config (the recurrent layers keep their state in it)
        hybrid = "linear_attention" in (getattr(model.config, "layer_types", None) or ())
        dynamic = transformers.DynamicCache(config=model.config) if hybrid else transformers.DynamicCache()
        caches.append(transformers.StaticCache(config=model.config, max_cache_len=64) if cache == "static" else dynamic)
    outs = []
    with torch.no_grad():
        for model, past in zip((ref, ours), caches):
            logits, m = [model(ids, attention_mask=mask, past_key_values=past, use_cache=True).logits], mask
            for t in range(steps):
                m = torch.cat([m, torch.ones_like(m[:, :1])], dim=1)
                logits.append(
                    model(tokens[:, t : t + 1], attention_mask=m, past_key_values=past, use_cache=True).logits
                )
            outs.append(logits)
    assert _close(outs[0][0], outs[1][0], mask.bool()), "prefill"
    for t in range(1, steps + 1):
        assert _close(outs[0][t], outs[1][t], torch.ones_like(outs[0][t][..., 0], dtype=torch.bool)), f"decode step {t}"


@pytest.mark.gpu
def test_a_bidirectional_decoder_on_fa_varlen_matches_eager():
    """EmbeddingGemma's shape (Gemma3TextModel, use_bidirectional_attention) in bf16: every layer non-causal, the
    sliding-window layers' window on both sides, through FA4's varlen kernel with window_size (w, w); a left-padded batch."""
    overrides = {
        **GPU_SHAPE,
        "num_hidden_layers": 4,
        "sliding_window": 24,
        "use_bidirectional_attention": True,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "query_pre_attn_scalar": 128,
        "architectures": ["Gemma3TextModel"],
    }
    cfg = config_of("gemma-3-1b-it", overrides)
    torch.manual_seed(0)
    ref = (
        transformers.AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.bfloat16)
        .cuda()
        .eval()
    )
    ours = (
        transformers.AutoModel.from_config(copy.deepcopy(cfg), attn_implementation="attngate", dtype=torch.bfloat16)
        .cuda()
        .eval()
    )
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(1, 512, (2, 80), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :17] = 0
    with torch.no_grad():
        expected, got = (
            ref(ids, attention_mask=mask).last_hidden_state,
            ours(ids, attention_mask=mask).last_hidden_state,
        )
    resolution, _ = plan_of(ours)
    assert (
        resolution.plan.prefill_backend in ("fa3", "fa4") and not resolution.plan.layer("sliding_window").common.causal
    )
    assert _close(expected, got, mask.bool())


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["mllama", "whisper"])
def test_cross_attention_models_on_fa_varlen_match_eager(name):
    """Mllama (two images per request, text between them seeing only the first, one request seeing one tile of its
    second) and Whisper (encoder, decoder self and cross attention) in bf16, every attention layer through FA4's
    varlen kernel: a cross layer as one non-causal row per run of queries that see the same keys."""
    from tests.support.transformers_models import mllama_pair, two_images

    if name == "mllama":
        ref, ours, _ = mllama_pair(hidden_size=512)
        ref, ours = (m.to("cuda", torch.bfloat16) for m in (ref, ours))
        inputs = {k: v.cuda() for k, v in two_images().items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(torch.bfloat16)
        model = ours.model.language_model
    else:
        cfg = transformers.WhisperConfig(
            vocab_size=512,
            num_mel_bins=16,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=8,
            decoder_attention_heads=8,
            d_model=512,
            encoder_ffn_dim=1024,
            decoder_ffn_dim=1024,
            max_source_positions=40,
            max_target_positions=64,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
        )
        torch.manual_seed(0)
        ref = (
            transformers.AutoModelForSpeechSeq2Seq.from_config(
                copy.deepcopy(cfg), attn_implementation="eager", dtype=torch.bfloat16
            )
            .cuda()
            .eval()
        )
        ours = (
            transformers.AutoModelForSpeechSeq2Seq.from_config(
                copy.deepcopy(cfg), attn_implementation="attngate", dtype=torch.bfloat16
            )
            .cuda()
            .eval()
        )
        ours.load_state_dict(ref.state_dict())
        gen = torch.Generator(device="cuda").manual_seed(1)
        inputs = dict(
            input_features=torch.randn(2, 16, 80, device="cuda", generator=gen, dtype=torch.bfloat16),
            decoder_input_ids=torch.randint(3, 500, (2, 9), device="cuda", generator=gen),
        )
        model = ours
    resolution = configure(model, ServerArgs(attention_backend="fa3"))
    assert resolution.plan.fa.provider == "flash_attn.cute"
    with torch.no_grad():
        expected, got = ref(**inputs).logits, ours(**inputs).logits
    assert _close(expected, got, torch.ones_like(expected[..., 0], dtype=torch.bool))
