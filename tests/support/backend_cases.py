"""Backend test set-up shared by tests/gpu (real kernels) and the CPU suite (stand-ins): one batch, two
pools holding the same cached prefix (backend under test, reference), sized by an :class:`Env`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from unittest import mock

import torch

from attngate import ForwardMode, LayerKind, ModelFacts, Platform, ServerArgs, resolve
from attngate.backends.reference import ReferenceBackend
from attngate.backends.runtime.batch_builder import BatchSetup, build_batch
from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.kv_cache import MHATokenToKVPool
from attngate.backends.runtime.layer import AttentionLayer
from tests.support.helpers import MODELS


@dataclass(frozen=True)
class Env:
    """Where a backend test runs: device, GQA shape, and the sizes of its long requests."""

    device: str
    heads: tuple[int, int, int]  # num_q_heads, num_kv_heads, head_dim
    platform: Callable[[], Platform]
    long_prefix: int  # the longest cached prefix of the batch-invariance tests
    many_slots: int  # pool size of the batch-invariance tests
    dtype: torch.dtype = torch.bfloat16
    tol: float = 2e-2  # bf16 kernels against the float32 reference (measured differences are about 1e-2)


# attngate's own backends run these plans (runs_sglang false): rules about SGLang's backend code (its FlashInfer
# backend's soft-cap and ragged window, sglang issue 33915) do not refuse them
GPU = Env(
    "cuda",
    (32, 8, 128),
    lambda: Platform.detect().model_copy(update={"runs_sglang": False}),
    long_prefix=4000,
    many_slots=1 << 19,
)
# the stand-ins run on an H100's facts: flashinfer and flash_attn.cute "installed"
CPU = Env(
    "cpu",
    (4, 2, 64),
    lambda: Platform.from_name("sm90", kernels=["attngate"], runs_sglang=False),
    long_prefix=1200,
    many_slots=1 << 17,
)
MODE_OF = {
    "extend": ForwardMode.EXTEND,
    "extend_prefix": ForwardMode.EXTEND,
    "decode": ForwardMode.DECODE,
    "target_verify": ForwardMode.TARGET_VERIFY,
    "draft_extend_v2": ForwardMode.DRAFT_EXTEND_V2,
}


def requests_around_page(ps: int) -> dict[str, list[tuple[int, int]]]:
    """Per shape of MODE_OF, uneven ``(prefix_len, new_len)`` requests on both sides of a ``ps``-token page boundary."""
    return {
        "extend": [(0, 1), (0, ps - 1), (0, ps + 1), (0, 300)],
        "extend_prefix": [(5, 1), (ps - 1, 17), (ps, ps), (700, 45), (0, 260), (1, 260)],
        "decode": [(0, 1), (ps - 2, 1), (ps - 1, 1), (ps, 1), (2000, 1)],
        "target_verify": [(3, 4), (ps - 1, 4), (500, 4)],
        "draft_extend_v2": [(9, 3), (ps, 3), (1024, 3)],
    }


def plan_for(env: Env, backend: str = "fa4", page_size: int = 1, model: str = "Llama-3.1-8B", **args):
    facts = ModelFacts.from_hf_config(MODELS / f"{model}.json")
    return resolve(ServerArgs(attention_backend=backend, page_size=page_size, **args), facts, env.platform()).plan


def with_gate(plan, gate: str, value):
    """``plan`` with one global gate (``"group.field"``, e.g. ``"flashinfer.graph_decode_replan"``) set to ``value``: a
    configuration the shipped rules do not resolve to, for comparing a backend's two paths under one plan otherwise."""
    group, field = gate.split(".")
    return plan.model_copy(update={group: getattr(plan, group).model_copy(update={field: value})})


@dataclass
class Case:
    setup: BatchSetup
    pools: tuple[MHATokenToKVPool, MHATokenToKVPool]
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    encoder_k: torch.Tensor | None
    encoder_v: torch.Tensor | None


def make_case(
    env: Env,
    requests,
    mode: ForwardMode,
    page_size: int,
    *,
    encoder_lens=None,
    num_slots=1 << 16,
    seed=0,
    max_context_len=8192,
    kv_dtype: torch.dtype | None = None,
) -> Case:
    """``kv_dtype``: the pools' (an FP8 cache); K/V are drawn in ``env.dtype`` and rounded through it, so that the raw
    K/V a ragged pass reads equal what the cache holds and a backend matches the reference to ``env.tol``."""
    dev, (h, hkv, d), dtype = env.device, env.heads, env.dtype
    s = build_batch(
        requests,
        mode,
        page_size=page_size,
        num_slots=num_slots,
        max_context_len=max_context_len,
        encoder_lens=encoder_lens,
        seed=seed,
        device=dev,
    )
    gen = torch.Generator(device=dev).manual_seed(seed)
    pools = tuple(
        MHATokenToKVPool(num_slots, page_size, 1, hkv, d, dtype=kv_dtype or dtype, device=dev) for _ in range(2)
    )
    stored = (lambda t: t.to(kv_dtype).to(dtype)) if kv_dtype else (lambda t: t)  # noqa: E731
    new_k, new_v, enc_k, enc_v = [], [], [], []
    for (prefix, new), slots, enc in zip(requests, s.slots, encoder_lens or [0] * len(requests)):
        k = stored(torch.randn(enc + prefix + new, hkv, d, device=dev, generator=gen, dtype=dtype))
        v = stored(torch.randn(enc + prefix + new, hkv, d, device=dev, generator=gen, dtype=dtype))
        for pool in pools:
            pool.set_kv_buffer(0, slots[: enc + prefix].to(dev), k[: enc + prefix], v[: enc + prefix])
        new_k.append(k[enc + prefix :])
        new_v.append(v[enc + prefix :])
        enc_k.append(k[:enc])
        enc_v.append(v[:enc])
    n = s.batch.num_tokens
    q = torch.randn(n, h, d, device=dev, generator=gen, dtype=dtype)
    cat = lambda xs: torch.cat(xs) if xs else torch.empty(0, hkv, d, device=dev, dtype=dtype)  # noqa: E731
    return Case(
        s,
        pools,
        q,
        cat(new_k)[:n],
        cat(new_v)[:n],
        cat(enc_k) if encoder_lens else None,
        cat(enc_v) if encoder_lens else None,
    )


def layer_of(env: Env, kind, **kw) -> AttentionLayer:
    h, hkv, d = env.heads
    return AttentionLayer(0, h, hkv, d, d, d**-0.5, kind=kind, **kw)


def with_cross_layer(backend_cls, env: Env, plan, case: Case, layer: AttentionLayer, **kw):
    """``backend_cls`` over ``layer`` (id 0) plus a cross-attention layer (id 1) on a pool of two layers, as an
    encoder-decoder model has both (a backend sizes its graph buffers for encoder tokens from its layers)."""
    h, hkv, d = env.heads
    pool = MHATokenToKVPool(
        case.pools[0].num_slots, case.pools[0].page_size, 2, hkv, d, dtype=env.dtype, device=env.device
    )
    layers = [layer] + (
        []
        if layer.kind == LayerKind.CROSS_ATTENTION
        else [AttentionLayer(1, h, hkv, d, d, d**-0.5, kind=LayerKind.CROSS_ATTENTION)]
    )
    return backend_cls(plan, pool, case.setup.req_to_token_pool.req_to_token, layers, env.device, **kw)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def rel_err(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference over the largest magnitude of ``expected``."""
    return max_diff(got, expected) / expected.float().abs().max().item()


SPECULATIVE = dict(
    speculative_algorithm="EAGLE", speculative_eagle_topk=1, speculative_num_steps=3, speculative_num_draft_tokens=4
)
SPECULATIVE_TREE = dict(
    speculative_algorithm="EAGLE", speculative_eagle_topk=4, speculative_num_steps=5, speculative_num_draft_tokens=8
)


def random_tree(bs: int, draft: int, seed: int, device="cpu") -> torch.Tensor:
    """``[bs, draft, draft]`` bool spec_tree_mask of random draft trees: token 0 is each tree's root, token i's parent
    is a random earlier token, and a token sees its ancestors and itself (EAGLE's flattened tree)."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros(bs, draft, draft, dtype=torch.bool)
    for b in range(bs):
        for i in range(draft):
            if i:
                mask[b, i] = mask[b, int(torch.randint(0, i, (1,), generator=gen))]
            mask[b, i, i] = True
    return mask.to(device)


ENCODER_PAGES = [[2, 8, 1, 4], [8, 1, 2, 2], [1, 3, 8, 1]]  # per replay round, each request's encoder tokens in pages


def assert_replays_match_reference(
    env: Env, make_backend, plan, layer: AttentionLayer, mode: ForwardMode, page_size: int, **rounds
) -> None:
    """Every round of :func:`replay_rounds` (``rounds``: its keywords) within ``env.tol`` of the reference backend; a
    cross-attention layer reads K/V from the cache."""
    kv = dict(k=None, v=None) if layer.kind == LayerKind.CROSS_ATTENTION else {}
    for i, case, replayed in replay_rounds(env, make_backend, plan, layer, mode, page_size, **rounds):
        assert max_diff(replayed, reference_out(env, case, plan, layer, **kv)) < env.tol, (
            f"{layer.kind.value} round {i}"
        )


def reference_out(env: Env, case: Case, plan, layer: AttentionLayer, k="new", v="new") -> torch.Tensor:
    """The reference backend's output of the case; ``k``/``v`` as in :func:`run` (None: cross attention reads the cache)."""
    ref = ReferenceBackend(plan, case.pools[1], case.setup.req_to_token_pool.req_to_token, [layer], env.device)
    return run(ref, case, layer, k, v)


def run(backend, case: Case, layer: AttentionLayer, k="new", v="new") -> torch.Tensor:
    """init_forward_metadata + forward of the case's batch; ``k``/``v`` default to the case's new tokens."""
    backend.init_forward_metadata(case.setup.batch)
    return backend.forward(case.q, case.k if k == "new" else k, case.v if v == "new" else v, layer, case.setup.batch)


def replay_rounds(
    env: Env,
    make_backend,
    plan,
    layer: AttentionLayer,
    mode: ForwardMode,
    page_size: int,
    *,
    fresh_rows: bool = False,
    encoder_pages: list[list[int]] | None = None,
    then: ForwardMode | None = None,
    tree: bool = False,
    kv_dtype: torch.dtype | None = None,
):
    """Capture one CUDA graph (4 requests), then replay it for three rounds of different lengths.

    ``make_backend(plan, case, layer)`` builds the backend under test. Yields ``(round, case, replayed_out)``
    with the round's pool and request table copied into the captured ones. ``fresh_rows``: each round's
    requests sit in other rows of ``req_to_token`` (rolled by the round), handed to the replay as a new
    tensor rather than copied into the captured one, so a graph that reads the captured rows reads stale ones.
    ``encoder_pages``: per round, each request's encoder tokens in pages (an encoder-decoder batch: the graph is
    captured with, and each replay handed, the static encoder_lens; a cross-attention layer reads the cache).
    ``then``: a second graph, of this forward mode at the same batch size, is captured on the same backend after the
    first, and each round replays both (``mode``'s, then ``then``'s), yielding each: graphs of two modes (SGLang's
    decode and target-verify graphs) must keep their own metadata.
    ``tree``: each round's draft tokens form other random trees (:func:`random_tree`), handed to the replay and set on
    the round's batch (``case.setup.batch.spec_tree_mask``, for the reference). ``kv_dtype``: as :func:`make_case`'s.
    On the CPU the graph is emulated (standins.graphs): each replay re-runs the forward, and the stand-in kernels
    check that it launches what was captured, reading the same metadata buffers.
    """
    bs, modes = 4, (mode,) if then is None else (mode, then)
    per_req = {m: 1 if m == ForwardMode.DECODE else 6 if tree else 3 for m in modes}
    prefixes = ([5, 300, 127, 64], [1000, 2, 129, 255], [17, 17, 900, 3])
    encoders = [[n * page_size for n in pages] for pages in encoder_pages] if encoder_pages else [None] * len(prefixes)
    cross = layer.kind == LayerKind.CROSS_ATTENTION
    requests = lambda m, i: [(p, per_req[m]) for p in prefixes[i]]  # noqa: E731
    captured = {
        m: make_case(env, requests(m, 0), m, page_size, seed=0, encoder_lens=encoders[0], kv_dtype=kv_dtype)
        for m in modes
    }
    first = captured[mode]
    rtt = first.setup.req_to_token_pool.req_to_token
    backend = make_backend(plan, first, layer)
    backend.init_cuda_graph_state(bs, bs * max(per_req.values()))
    graphs = {}
    for m in modes:  # each graph: its static q/k/v and batch, captured from the mode's first round
        static = {name: getattr(captured[m], name).clone() for name in ("q", "k", "v")}
        b = captured[m].setup.batch
        enc = b.encoder_lens.clone() if encoder_pages else None
        static_batch = ForwardBatch(
            m,
            bs,
            b.req_pool_indices.clone(),
            b.seq_lens.clone(),
            b.seq_lens_cpu.clone(),
            b.extend_prefix_lens.clone(),
            b.extend_seq_lens.clone(),
            b.out_cache_loc.clone(),
            enc,
        )
        backend.init_forward_metadata_capture_cuda_graph(
            bs, bs * per_req[m], static_batch.req_pool_indices, static_batch.seq_lens, enc, m
        )
        k_v = (None, None) if cross else (static["k"], static["v"])
        graph = Graph(
            env,
            functools.partial(lambda st, sb, kv: backend.forward(st["q"], *kv, layer, sb), static, static_batch, k_v),
        )
        graphs[m] = (static, static_batch, graph)
    for i in range(len(prefixes)):
        for m in modes:
            case = make_case(env, requests(m, i), m, page_size, seed=i + 1, encoder_lens=encoders[i], kv_dtype=kv_dtype)
            static, static_batch, graph = graphs[m]
            backend.kv_pool.k_buffer[0].copy_(case.pools[0].k_buffer[0])
            backend.kv_pool.v_buffer[0].copy_(case.pools[0].v_buffer[0])
            shift = i + 1 if fresh_rows else 0
            rtt.copy_(case.setup.req_to_token_pool.req_to_token[: rtt.shape[0]].roll(shift, dims=0))
            for name in ("q", "k", "v"):
                static[name].copy_(getattr(case, name))
            cb, enc = case.setup.batch, static_batch.encoder_lens
            for name in (
                ("seq_lens", "out_cache_loc")
                + (() if fresh_rows else ("req_pool_indices",))
                + (("encoder_lens",) if enc is not None else ())
            ):
                getattr(static_batch, name).copy_(getattr(cb, name))
            rows = (cb.req_pool_indices + shift) % rtt.shape[0] if fresh_rows else static_batch.req_pool_indices
            if tree:
                cb.spec_tree_mask = random_tree(bs, per_req[m], seed=i, device=env.device)
            with _no_device_to_host_copies(enc is not None):  # the host copies of the lengths are all the hook reads
                backend.init_forward_metadata_replay_cuda_graph(
                    bs,
                    rows,
                    static_batch.seq_lens,
                    cb.seq_lens_cpu,
                    enc,
                    m,
                    encoder_lens_cpu=cb.encoder_lens_cpu,
                    spec_tree_mask=cb.spec_tree_mask,
                )
            yield i, case, graph.replay().clone()


@contextmanager
def _no_device_to_host_copies(active: bool):
    """``Tensor.cpu()`` raises inside (a device-to-host copy is a sync on CUDA)."""
    if not active:
        yield
        return
    with mock.patch.object(torch.Tensor, "cpu", side_effect=AssertionError("a device-to-host copy in the replay hook")):
        yield


def mla_cpu_layer(
    gen: torch.Generator, *, heads: int, nope: int, rank: int, rope: int, v_head_dim: int, scaling: float = 0.2
):
    """An MLA layer spec with random ``kv_b_proj`` halves: ``w_kc [heads, nope, rank]``, ``w_vc [heads, rank, v_head_dim]``."""
    return AttentionLayer(
        0,
        heads,
        1,
        nope + rope,
        v_head_dim,
        scaling,
        is_mla=True,
        kv_lora_rank=rank,
        qk_rope_head_dim=rope,
        w_kc=torch.randn(heads, nope, rank, generator=gen) / rank**0.5,
        w_vc=torch.randn(heads, rank, v_head_dim, generator=gen) / rank**0.5,
    )


def mla_cpu_batch(
    requests,
    mode: ForwardMode,
    page_size: int,
    gen: torch.Generator,
    *,
    heads: int,
    nope: int,
    rank: int,
    rope: int,
    seed: int = 1,
    num_slots: int = 2048,
):
    """A CPU batch (float32) whose prefixes' latent (``rank + rope`` per token) is cached in two identical MLA pools:
    ``(setup, pools, q [T, heads, nope + rope], latent [T, 1, rank + rope])``."""
    from attngate.backends.runtime.kv_cache import MLATokenToKVPool

    s = build_batch(requests, mode, page_size=page_size, num_slots=num_slots, max_context_len=256, seed=seed)
    pools = [MLATokenToKVPool(num_slots, page_size, 1, rank, rope, dtype=torch.float32) for _ in range(2)]
    for (prefix, _), slots in zip(requests, s.slots):
        latent = torch.randn(prefix, 1, rank + rope, generator=gen)
        for pool in pools:
            pool.set_kv_buffer(0, slots[:prefix], latent)
    n = s.batch.num_tokens
    return s, pools, torch.randn(n, heads, nope + rope, generator=gen), torch.randn(n, 1, rank + rope, generator=gen)


def assert_mla_matches_reference(backend_cls, plan, layer: AttentionLayer, case) -> None:
    """One eager forward of ``case = (setup, (pool, reference_pool), q, latent)`` (:func:`mla_cpu_batch`) through
    ``backend_cls`` and through the reference backend, within 1e-4 of each other."""
    from attngate.backends.reference import ReferenceBackend

    s, pools, q, latent = case
    outs = []
    for cls, pool in ((backend_cls, pools[0]), (ReferenceBackend, pools[1])):
        backend = cls(plan, pool, s.req_to_token_pool.req_to_token, [layer], "cpu")
        backend.init_forward_metadata(s.batch)
        outs.append(backend.forward(q, latent, None, layer, s.batch))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)


def assert_mla_replays_match_reference(backend_cls, plan, layer: AttentionLayer, mode: ForwardMode, make_batch) -> None:
    """An absorbed-MLA CUDA graph on the CPU (emulated, standins.graphs): captured with one batch of two requests,
    replayed for three rounds of other lengths whose requests sit in other rows of req_to_token (handed to the replay
    as a new tensor), each within 1e-4 of the reference backend. ``make_batch(requests, mode, seed)`` returns
    ``(setup, (pool, reference_pool), q, latent)``."""
    from tests.support.standins.graphs import RECORDER

    per_req = 1 if mode == ForwardMode.DECODE else 3
    rounds = [[(5, per_req), (40, per_req)], [(70, per_req), (0, per_req)], [(16, per_req), (100, per_req)]]
    s0, pools0, q0, latent0 = make_batch(rounds[0], mode, 0)
    rtt = s0.req_to_token_pool.req_to_token
    backend = backend_cls(plan, pools0[0], rtt, [layer], "cpu", checked=True)
    backend.init_cuda_graph_state(2, 2 * per_req)
    backend.init_forward_metadata_capture_cuda_graph(
        2, 2 * per_req, s0.batch.req_pool_indices, s0.batch.seq_lens, None, mode
    )
    with RECORDER.capture():
        backend.forward(q0, latent0, None, layer, s0.batch)
    for i, requests in enumerate(rounds):
        s, pools, q, latent = make_batch(requests, mode, i + 1)
        pools0[0].kv_buffer[0].copy_(pools[0].kv_buffer[0])
        rtt.copy_(s.req_to_token_pool.req_to_token[: rtt.shape[0]].roll(i + 1, dims=0))
        rows = (s.batch.req_pool_indices + i + 1) % rtt.shape[0]
        backend.init_forward_metadata_replay_cuda_graph(2, rows, s.batch.seq_lens, s.batch.seq_lens_cpu, None, mode)
        with RECORDER.replay():
            got = backend.forward(q, latent, None, layer, s.batch)
        ref = ReferenceBackend(plan, pools[1], s.req_to_token_pool.req_to_token, [layer])
        ref.init_forward_metadata(s.batch)
        torch.testing.assert_close(
            got, ref.forward(q, latent, None, layer, s.batch), atol=1e-4, rtol=1e-4, msg=f"round {i}"
        )


def target_in_batch(
    env: Env,
    make_backend,
    plan,
    layer: AttentionLayer,
    mode: ForwardMode,
    others: int,
    target: tuple[int, int],
    *,
    max_prefix: int,
    max_new: int,
    num_slots: int,
    encoder: int | None = None,
    kv_from_cache: bool = False,
) -> torch.Tensor:
    """The output rows of one fixed request (same q, K/V every time) in the middle of ``others`` other requests."""
    gen = torch.Generator().manual_seed(others)
    filler = [
        (
            int(torch.randint(0, max_prefix, (1,), generator=gen)),
            1 if mode == ForwardMode.DECODE else int(torch.randint(1, max_new, (1,), generator=gen)),
        )
        for _ in range(others)
    ]
    idx = others // 2
    requests = filler[:idx] + [target] + filler[idx:]
    case = make_case(
        env, requests, mode, 1, seed=5, num_slots=num_slots, encoder_lens=[encoder] * len(requests) if encoder else None
    )
    solo = make_case(env, [target], mode, 1, seed=99, encoder_lens=[encoder] if encoder else None)
    pre = (encoder or 0) + target[0]
    solo_slots = solo.setup.slots[0][:pre].to(env.device)
    case.pools[0].set_kv_buffer(
        0,
        case.setup.slots[idx][:pre].to(env.device),
        solo.pools[0].k_buffer[0][solo_slots],
        solo.pools[0].v_buffer[0][solo_slots],
    )
    start = sum(n for _, n in requests[:idx])
    for name in ("q", "k", "v"):
        getattr(case, name)[start : start + target[1]] = getattr(solo, name)
    kv = (None, None) if kv_from_cache else ("new", "new")
    return run(make_backend(plan, case, layer), case, layer, *kv)[start : start + target[1]].clone()


class Graph:
    """A CUDA graph of ``fn`` on the GPU; on the CPU the emulation of standins.graphs."""

    def __init__(self, env: Env, fn: Callable[[], torch.Tensor]) -> None:
        self.fn, self.cuda, self.name = fn, env.device == "cuda", f"graph {id(self)}"
        fn()  # compile / JIT outside the capture
        if self.cuda:
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.out = fn()
        else:
            from tests.support.standins.graphs import RECORDER

            self.recorder = RECORDER
            with RECORDER.capture(self.name):
                fn()

    def replay(self) -> torch.Tensor:
        if self.cuda:
            self.graph.replay()
            return self.out
        with self.recorder.replay(self.name):
            return self.fn()
