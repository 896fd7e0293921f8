"""Every plan the rules resolve runs on the backends it names, and computes what the reference computes.

A property test over the configs of examples/models x server arguments x GPU: for each plan that resolves,
the backend of each forward mode (``plan.backend_for``; through PlanBackend where attngate runs both of the
plan's backends: fa3/fa4 through ``flash_attn.cute``, flashinfer) is built over one layer of each of the
model's layer kinds, with the plan's per-rank heads and page size, on the CPU stand-ins of the kernels; the
batches a server would send it (an extend over cached prefixes of uneven lengths and over page boundaries, a
decode step, a target verify under a speculative chain or tree, encoder tokens for cross-attention layers, an
FP8 cache) must run, eagerly and, where the plan
captures the mode, as a CUDA graph captured without prefix and replayed, and match the reference backend
under the same plan. The rules and the backends are written apart; this is where a plan that promises what
its backend refuses, or resolves a decision the backend reads differently from the reference, shows up.
"""

from __future__ import annotations

import json
import sys

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st

from attngate import (  # noqa: E402
    ForwardMode,
    LayerKind,
    ModelFacts,
    PlanError,
    Platform,
    ServerArgs,
    resolve,
)
from attngate.backends.checks import kv_storage_dtype  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from attngate.backends.plan_backend import KERNEL_BACKENDS, PlanBackend  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.kv_cache import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from attngate.backends.runtime.layer import layers_from_model  # noqa: E402
from attngate.errors import BatchMetadataError  # noqa: E402
from tests.support.backend_cases import CPU, SPECULATIVE_TREE, Graph, random_tree  # noqa: E402
from tests.support.backend_cases import SPECULATIVE as SPECULATIVE_CHAIN
from tests.support.helpers import MODELS  # noqa: E402
from tests.support.standins import flash_attn_cute, flashinfer  # noqa: E402

M = ForwardMode
CONFIGS = {path.stem: ModelFacts.from_hf_config(path) for path in sorted(MODELS.glob("*.json"))}
# sliding-window layers with a shape of their own on head dims FlashInfer runs (MiMo-V2's 192/128 it does not)
_GEMMA3 = json.loads((MODELS / "gemma-3-27b-it.json").read_text())
CONFIGS["gemma-3-27b+swa-kv-8"] = ModelFacts.from_hf_dict(
    {**_GEMMA3, "text_config": {**_GEMMA3["text_config"], "swa_num_key_value_heads": 8}}, source="gemma-3+swa"
)
SPECULATIVE = {"chain": SPECULATIVE_CHAIN, "tree": SPECULATIVE_TREE}
TOL = {torch.bfloat16: 3e-2, torch.float32: 1e-4}


@pytest.fixture(autouse=True, scope="module")
def kernels():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "flashinfer", flashinfer.module())
        for name, module in flash_attn_cute.modules().items():
            patch.setitem(sys.modules, name, module)
        yield


def _layers(facts: ModelFacts, plan, gen: torch.Generator):
    """One layer of each of the model's kinds (ids 0..n-1), with the plan's per-rank heads; MLA layers with random
    kv_b_proj halves."""
    layers, seen = [], set()
    for layer in layers_from_model(facts, plan, include_encoder=False):
        if layer.kind in seen:
            continue
        seen.add(layer.kind)
        layer.layer_id = len(layers)
        if layer.is_mla:
            r, nope, h = layer.kv_lora_rank, layer.qk_nope_head_dim, layer.num_q_heads
            layer.w_kc = torch.randn(h, nope, r, generator=gen) / r**0.5
            layer.w_vc = torch.randn(h, r, layer.v_head_dim, generator=gen) / r**0.5
        if layer.has_sinks:
            layer.sinks = torch.linspace(-1, 1, layer.num_q_heads)
        layers.append(layer)
    return layers


def _batches(plan, facts: ModelFacts, speculative: str | None):
    """(mode, [(prefix, new)]): the batches a server sends under this plan. Where a layer writes no cache (encoder-only
    layers, the embedding fast path) requests have no cached prefix and never decode."""
    ps = plan.common.page_size
    kinds = {lay.kind for lay in layers_from_model(facts, include_encoder=False)}
    cached = LayerKind.ENCODER_ONLY not in kinds and all(plan.layer(kind).common.write_kv_cache for kind in kinds)
    prefixes = [0, ps - 1, ps + 3, 2 * ps + 5] if cached else [0, 0, 0, 0]
    yield M.EXTEND, [(p, n) for p, n in zip(prefixes, [7, 1, ps + 2, 5])]
    if cached:
        yield M.DECODE, [(p + 1, 1) for p in prefixes]
        if speculative:
            yield M.TARGET_VERIFY, [(p + 1, 4 if speculative == "chain" else 8) for p in prefixes]


def _backend_factory(plan, facts: ModelFacts, mode: M):
    """What runs ``mode``: PlanBackend where attngate runs both of the plan's backends (so each mode reaches the one
    ``common.runs_on`` names), else the factory of the mode's own backend, or None where attngate has none for it.
    attngate's FA and FlashInfer MLA backends read 16-bit caches only and refuse an FP8 plan saying so (tested apart)."""
    fp8 = plan.common.kv_cache_dtype != "auto"
    runs = {name for name in KERNEL_BACKENDS if not (fp8 and (name in ("fa3", "fa4") or facts.use_mla))}
    if {plan.prefill_backend, plan.decode_backend} <= runs:
        return PlanBackend
    name = plan.backend_for(mode)
    return KERNEL_BACKENDS[name] if name in runs else None


def _run(cls, plan, facts: ModelFacts, mode: M, requests, seed: int):
    """The layers' outputs through ``cls`` and through the reference, on identical pools holding the same prefixes."""
    gen = torch.Generator().manual_seed(seed)
    layers = _layers(facts, plan, gen)
    mla = layers[0].is_mla
    dtype = torch.float32 if mla else torch.bfloat16
    kv_dtype = kv_storage_dtype(
        plan, dtype
    )  # an FP8 cache: K/V drawn FP8-representable, as the raw ones equal the stored
    stored = (lambda t: t.to(kv_dtype).to(dtype)) if kv_dtype != dtype else (lambda t: t)  # noqa: E731
    cross = any(layer.kind == LayerKind.CROSS_ATTENTION for layer in layers)
    ps = plan.common.page_size
    enc = [ps * (1 + i % 2) for i in range(len(requests))] if cross else None
    slots = max(ps * 64, 1024)
    s = build_batch(
        requests, mode, page_size=ps, num_slots=slots, max_context_len=max(ps * 16, 256), encoder_lens=enc, seed=seed
    )
    lay0 = layers[0]
    if mla:
        pools = [
            MLATokenToKVPool(slots, ps, len(layers), lay0.kv_lora_rank, lay0.qk_rope_head_dim, dtype=kv_dtype)
            for _ in range(2)
        ]
    else:  # each layer its own K and V rows (MiMo-V2's sliding-window layers have more KV heads, V narrower than K)
        shapes = [(lay.num_kv_heads, lay.head_dim, lay.v_head_dim) for lay in layers]
        pools = [
            MHATokenToKVPool(slots, ps, len(layers), *shapes[0], dtype=kv_dtype, layer_shapes=shapes) for _ in range(2)
        ]

    def widths(layer):  # (K row, V row) shape of one token
        if mla:
            return (1, lay0.latent_dim), (1, lay0.latent_dim)
        return (layer.num_kv_heads, layer.head_dim), (layer.num_kv_heads, layer.v_head_dim)

    for layer in layers:
        k_width, v_width = widths(layer)
        for (prefix, _), req_slots, e in zip(requests, s.slots, enc or [0] * len(requests)):
            k, v = (stored(torch.randn(e + prefix, *w, generator=gen, dtype=dtype)) for w in (k_width, v_width))
            for pool in pools:
                pool.set_kv_buffer(layer.layer_id, req_slots[: e + prefix], k, None if mla else v)
    if plan.mode(mode).common.tree_mask:
        s.batch.spec_tree_mask = random_tree(len(requests), requests[0][1], seed)
    rtt = s.req_to_token_pool.req_to_token
    n = s.batch.num_tokens
    inputs = [
        (
            torch.randn(n, layer.num_q_heads, layer.head_dim, generator=gen, dtype=dtype),
            stored(torch.randn(n, *widths(layer)[0], generator=gen, dtype=dtype)),
            stored(torch.randn(n, *widths(layer)[1], generator=gen, dtype=dtype)),
        )
        for layer in layers
    ]

    def forward(backend):
        return [
            backend.forward(
                q,
                None if layer.kind == LayerKind.CROSS_ATTENTION else k,
                None if layer.kind == LayerKind.CROSS_ATTENTION or mla else v,
                layer,
                s.batch,
            )
            for layer, (q, k, v) in zip(layers, inputs)
        ]

    outs = {}
    for name, factory, pool in (("eager", cls, pools[0]), ("reference", ReferenceBackend, pools[1])):
        backend = factory(plan, pool, rtt, layers, "cpu", q_dtype=dtype)  # every factory takes q_dtype
        backend.init_forward_metadata(s.batch)
        outs[name] = forward(backend)
    if plan.common.cuda_graph and plan.mode(mode).common.capture_cuda_graph:
        outs["graph"] = _replayed(cls(plan, pools[0], rtt, layers, "cpu", q_dtype=dtype), s.batch, forward)
    return layers, outs, TOL[dtype]


def _replayed(backend, batch, forward):
    """``forward`` captured as a CUDA graph (emulated) at the batch's size with no cached prefix, as a server captures
    at start-up, then replayed for the batch: the replay hook alone brings the graph's metadata to its lengths."""
    bs, n, mode = batch.batch_size, batch.num_tokens, batch.forward_mode
    backend.init_cuda_graph_state(bs, n)
    backend.init_forward_metadata_capture_cuda_graph(
        bs, n, batch.req_pool_indices, batch.seq_lens - batch.extend_prefix_lens, batch.encoder_lens, mode
    )
    graph = Graph(CPU, lambda: forward(backend))
    backend.init_forward_metadata_replay_cuda_graph(
        bs,
        batch.req_pool_indices,
        batch.seq_lens,
        batch.seq_lens_cpu,
        batch.encoder_lens,
        mode,
        encoder_lens_cpu=batch.encoder_lens_cpu,
        spec_tree_mask=batch.spec_tree_mask,
    )
    return graph.replay()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(
    model=st.sampled_from(sorted(CONFIGS)),
    backend=st.sampled_from([None, "fa3", "fa4", "flashinfer"]),
    split=st.sampled_from([None, ("fa3", "flashinfer"), ("flashinfer", "fa3"), ("fa4", "flashinfer")]),
    gpu=st.sampled_from(["sm80", "sm90", "sm100"]),
    page_size=st.sampled_from([None, 1, 16, 64, 128]),
    tp=st.sampled_from([(1, False), (2, False), (4, False), (4, True)]),
    deterministic=st.booleans(),
    embedding=st.booleans(),
    speculative=st.sampled_from([None, "chain", "tree"]),
    kv_cache=st.sampled_from(["auto", "fp8_e4m3"]),
    verify_on=st.sampled_from(["prefill", "decode"]),
    seed=st.integers(0, 3),
)
@example("MiMo-V2-Flash", "fa3", None, "sm90", None, (4, False), False, False, None, "auto", "prefill", 0)
@example("MiMo-V2-Flash", None, None, "sm100", None, (1, False), False, False, None, "auto", "prefill", 1)
@example("gemma-3-27b+swa-kv-8", "flashinfer", None, "sm90", 16, (2, False), False, False, None, "auto", "prefill", 0)
@example("gemma-3-27b+swa-kv-8", "fa3", None, "sm90", 1, (1, False), False, False, "chain", "auto", "decode", 2)
def test_every_resolved_plan_runs_on_its_backends_as_the_reference(
    model, backend, split, gpu, page_size, tp, deterministic, embedding, speculative, kv_cache, verify_on, seed
):
    facts = CONFIGS[model]
    args = dict(
        attention_backend=backend,
        page_size=page_size,
        enable_deterministic_inference=deterministic,
        tp_size=tp[0],
        kv_cache_dtype=kv_cache,
    )
    if split:
        args.update(prefill_attention_backend=split[0], decode_attention_backend=split[1])
    if tp[1]:
        args.update(enable_dp_attention=True, dp_size=2)
    if embedding:
        args.update(is_embedding=True, chunked_prefill_size=-1, disable_radix_cache=True)
    if speculative:
        args.update(SPECULATIVE[speculative], speculative_attention_mode=verify_on)
    try:
        plan = resolve(ServerArgs(**args), facts, Platform.from_name(gpu, kernels=["attngate"])).plan
    except PlanError:
        assume(False)
    runs = [
        (mode, requests, _backend_factory(plan, facts, mode)) for mode, requests in _batches(plan, facts, speculative)
    ]
    runs = [run for run in runs if run[2] is not None]
    assume(runs)
    flash_attn_cute.ARCH = Platform.from_name(gpu).sm_major  # the stand-in holds each call to this GPU's limits
    try:
        results = [(mode, *_run(cls, plan, facts, mode, requests, seed)) for mode, requests, cls in runs]
    finally:
        flash_attn_cute.ARCH = None
    for mode, layers, outs, tol in results:
        expected = outs.pop("reference")
        side = plan.backend_for(mode)
        for run, got in outs.items():
            for layer, a, b in zip(layers, got, expected):
                diff = (a.float() - b.float()).abs().max().item()
                assert diff < tol, (
                    f"{model} {args} on {gpu}: {side} {run} {mode.value} {layer.kind.value} layer differs by {diff}"
                )


def test_an_encoder_decoder_models_encoder_layers_stay_outside_the_paged_backends():
    """Whisper's encoder attends over its audio frames, not over a batch's tokens (SGLang runs it with SDPA): every
    backend refuses its layers beside cross-attention ones, naming them, and serves the decoder's."""
    facts = CONFIGS["whisper-large-v3-turbo"]
    plan = resolve(ServerArgs(), facts, Platform.from_name("sm90")).plan
    every, decoder = layers_from_model(facts, plan), layers_from_model(facts, plan, include_encoder=False)
    assert [lay.layer_id for lay in decoder] == list(range(32, 40)) and LayerKind.ENCODER_ONLY not in {
        lay.kind for lay in decoder
    }
    pool = MHATokenToKVPool(64, plan.common.page_size, len(every), every[0].num_kv_heads, every[0].head_dim)
    rtt = torch.zeros(2, 64, dtype=torch.int32)
    for cls in (ReferenceBackend, FlashAttentionBackend, FlashInferBackend):
        with pytest.raises(BatchMetadataError, match=r"layers 0, 1, .*, 31: an encoder-decoder model's encoder layers"):
            cls(plan, pool, rtt, every, "cpu")
        cls(plan, pool, rtt, decoder, "cpu")
