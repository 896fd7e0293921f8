"""MLA on FlashInfer against the reference backend on the GPU (chunked-local attention on FA: tests/support/suites/fa_backend.py).

MLA at DeepSeek's latent geometry (kv_lora_rank 512 + qk_rope 64 cached per token; q/k 192, v 128)
with 16 heads (DeepSeek-V2-Lite) and 128 heads (DeepSeek-V3).
Cold run: FlashInfer JIT-builds one MLA (fa3) and one ragged (fa2, 192/128) variant, about 40 s.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashinfer")

from attngate import ForwardMode  # noqa: E402
from attngate.backends.flashinfer import flashinfer_backend  # noqa: E402
from attngate.backends.flashinfer_mla import FlashInferMLABackend  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.forward_batch import ForwardBatch  # noqa: E402
from attngate.backends.runtime.kv_cache import MLATokenToKVPool  # noqa: E402
from attngate.backends.runtime.layer import AttentionLayer  # noqa: E402
from tests.support.backend_cases import GPU, MODE_OF, plan_for, rel_err, requests_around_page  # noqa: E402

M = ForwardMode
RANK, ROPE, NOPE, VDIM = 512, 64, 128, 128
MLA_MODELS = {16: "DeepSeek-V2-Lite", 128: "DeepSeek-V3"}
REQUESTS = requests_around_page(64)  # uneven requests on both sides of a 64-token page boundary, for every page size


def mla_layer(heads: int, gen: torch.Generator) -> AttentionLayer:
    w = lambda *shape: (torch.randn(*shape, device="cuda", generator=gen) / RANK**0.5).to(GPU.dtype)  # noqa: E731
    return AttentionLayer(
        0,
        heads,
        1,
        NOPE + ROPE,
        VDIM,
        (NOPE + ROPE) ** -0.5,
        is_mla=True,
        kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE,
        w_kc=w(heads, NOPE, RANK),
        w_vc=w(heads, RANK, VDIM),
    )


def mla_case(requests, mode, page_size, heads, seed=0, num_slots=1 << 16):
    """A batch, two latent pools holding the same cached prefix, q and the new tokens' latent."""
    s = build_batch(
        requests, mode, page_size=page_size, num_slots=num_slots, max_context_len=8192, seed=seed, device="cuda"
    )
    gen = torch.Generator(device="cuda").manual_seed(seed)
    pools = [MLATokenToKVPool(num_slots, page_size, 1, RANK, ROPE, dtype=GPU.dtype, device="cuda") for _ in range(2)]
    new = []
    for (prefix, n), slots in zip(requests, s.slots):
        latent = torch.randn(prefix + n, 1, RANK + ROPE, device="cuda", generator=gen).to(GPU.dtype)
        for pool in pools:
            pool.set_kv_buffer(0, slots[:prefix].cuda(), latent[:prefix])
        new.append(latent[prefix:])
    q = torch.randn(s.batch.num_tokens, heads, NOPE + ROPE, device="cuda", generator=gen).to(GPU.dtype)
    return s, pools, q, torch.cat(new)


def mla_pair(plan, s, pools, layer):
    rtt = s.req_to_token_pool.req_to_token
    return (
        flashinfer_backend(plan, pools[0], rtt, [layer], "cuda", checked=True),
        ReferenceBackend(plan, pools[1], rtt, [layer], "cuda"),
    )


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("heads", sorted(MLA_MODELS))
@pytest.mark.parametrize(
    "shape, flags",
    [(shape, {}) for shape in sorted(MODE_OF)] + [("extend_prefix", {"disable_chunked_prefix_cache": True})],
)
def test_flashinfer_mla_matches_reference(shape, flags, heads, page_size):
    plan = plan_for(GPU, "flashinfer", page_size, MLA_MODELS[heads], **flags)
    assert plan.flashinfer.mla_kernel_family == "fa3"
    mode = MODE_OF[shape]
    s, pools, q, latent = mla_case(REQUESTS[shape], mode, page_size, heads)
    layer = mla_layer(heads, torch.Generator(device="cuda").manual_seed(7))
    fi, ref = mla_pair(plan, s, pools, layer)
    assert isinstance(fi, FlashInferMLABackend)
    outs = []
    for backend in (fi, ref):
        backend.init_forward_metadata(s.batch)
        outs.append(backend.forward(q, latent, None, layer, s.batch))
    assert outs[0].shape == (s.batch.num_tokens, heads, VDIM)
    assert rel_err(*outs) < 2e-2, f"{shape} {flags}: form {plan.mode(mode).common.mla_form}"
    loc = s.batch.out_cache_loc
    assert torch.equal(pools[0].kv_buffer[0][loc], latent)  # the latent is written in every form


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("mode", [M.DECODE, M.TARGET_VERIFY])
def test_flashinfer_mla_cuda_graph_replay(mode, page_size):
    heads, bs = 16, 4
    per_req = 1 if mode == M.DECODE else 3
    plan = plan_for(GPU, "flashinfer", page_size, MLA_MODELS[heads])
    layer = mla_layer(heads, torch.Generator(device="cuda").manual_seed(7))
    rounds = [
        [(p, per_req) for p in prefixes] for prefixes in ([5, 300, 127, 64], [1000, 2, 129, 255], [17, 17, 900, 3])
    ]
    s0, pools0, q0, lat0 = mla_case(rounds[0], mode, page_size, heads)
    rtt = s0.req_to_token_pool.req_to_token
    fi = flashinfer_backend(plan, pools0[0], rtt, [layer], "cuda")
    fi.init_cuda_graph_state(bs, bs * per_req)
    b = s0.batch
    static_batch = ForwardBatch(
        mode,
        bs,
        b.req_pool_indices.clone(),
        b.seq_lens.clone(),
        b.seq_lens_cpu.clone(),
        b.extend_prefix_lens.clone(),
        b.extend_seq_lens.clone(),
        b.out_cache_loc.clone(),
    )
    q_static, lat_static = q0.clone(), lat0.clone()
    fi.init_forward_metadata_capture_cuda_graph(
        bs, bs * per_req, static_batch.req_pool_indices, static_batch.seq_lens, None, mode
    )
    fi.forward(q_static, lat_static, None, layer, static_batch)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fi.forward(q_static, lat_static, None, layer, static_batch)
    for i, requests in enumerate(rounds):
        s, pools, q, latent = mla_case(requests, mode, page_size, heads, seed=i + 1)
        pools0[0].kv_buffer[0].copy_(pools[0].kv_buffer[0])
        rtt.copy_(s.req_to_token_pool.req_to_token[: rtt.shape[0]])
        q_static.copy_(q)
        lat_static.copy_(latent)
        for name in ("req_pool_indices", "seq_lens", "out_cache_loc"):
            getattr(static_batch, name).copy_(getattr(s.batch, name))
        fi.init_forward_metadata_replay_cuda_graph(
            bs, static_batch.req_pool_indices, static_batch.seq_lens, s.batch.seq_lens_cpu, None, mode
        )
        graph.replay()
        ref = ReferenceBackend(plan, pools[1], s.req_to_token_pool.req_to_token, [layer], "cuda")
        ref.init_forward_metadata(s.batch)
        assert rel_err(static_out, ref.forward(q, latent, None, layer, s.batch)) < 2e-2, f"round {i}"


def test_mla_embedding_fast_path_flags_keep_and_read_the_latent_cache():
    """Seed 000 on a GPU: is_embedding + no chunked prefill + no radix cache must not skip an MLA model's cache."""
    plan = plan_for(
        GPU, "flashinfer", 1, "DeepSeek-V2-Lite", is_embedding=True, chunked_prefill_size=-1, disable_radix_cache=True
    )
    layer = mla_layer(16, torch.Generator(device="cuda").manual_seed(3))
    s, pools, q, latent = mla_case([(0, 40), (0, 7)], M.EXTEND, 1, 16)
    fi, ref = mla_pair(plan, s, pools, layer)
    for backend in (fi, ref):
        backend.init_forward_metadata(s.batch)
    first = fi.forward(q, latent, None, layer, s.batch)
    assert torch.equal(pools[0].kv_buffer[0][s.batch.out_cache_loc], latent)
    assert rel_err(first, ref.forward(q, latent, None, layer, s.batch)) < 2e-2
