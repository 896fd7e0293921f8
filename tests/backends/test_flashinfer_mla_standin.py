"""FlashInfer MLA backend metadata on the CPU, through the FlashInfer stand-in (tests/support/standins).

Its ``plan()`` checks its arguments as FlashInfer does (monotone indptr starting at 0, page indices
inside the cache, kv_len within each request's pages, the DeepSeek latent geometry) and keeps
exactly what it was given; ``run()`` computes attention in torch from that alone. tests/gpu keeps it
honest against the real kernels on an H100.
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from attngate import ForwardMode, ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.backends.flashinfer import flashinfer_backend  # noqa: E402
from attngate.backends.flashinfer_mla import FlashInferMLABackend  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.kv_cache import MLATokenToKVPool  # noqa: E402
from attngate.backends.runtime.layer import AttentionLayer  # noqa: E402
from attngate.errors import BackendRefusal, BatchMetadataError  # noqa: E402
from tests.support.backend_cases import (  # noqa: E402
    assert_mla_replays_match_reference,
    mla_cpu_batch,
    mla_cpu_layer,
)
from tests.support.helpers import MODELS  # noqa: E402
from tests.support.standins import flashinfer as standin  # noqa: E402

H, RANK, ROPE, NOPE, VDIM = 4, 512, 64, 128, 128  # DeepSeek geometry: the fa3 ragged kernel runs 192/128 only
REQUESTS = {
    ForwardMode.EXTEND: [(0, 5), (17, 3), (70, 9), (3, 1)],
    ForwardMode.DECODE: [(0, 1), (17, 1), (70, 1), (63, 1)],
    ForwardMode.TARGET_VERIFY: [(5, 3), (66, 3)],
    ForwardMode.DRAFT_EXTEND_V2: [(9, 2), (64, 2)],
}


@pytest.fixture(autouse=True)
def flashinfer(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", standin.module())


def _plan(page_size, **args):
    return resolve(
        ServerArgs(attention_backend="flashinfer", page_size=page_size, **args),
        ModelFacts.from_hf_config(MODELS / "DeepSeek-V2-Lite.json"),
        Platform.from_name("sm90"),
    ).plan


def _layer(gen):
    return mla_cpu_layer(gen, heads=H, nope=NOPE, rank=RANK, rope=ROPE, v_head_dim=VDIM)


def _case(requests, mode, page_size, seed=0):
    return mla_cpu_batch(
        requests,
        mode,
        page_size,
        torch.Generator().manual_seed(seed),
        heads=H,
        nope=NOPE,
        rank=RANK,
        rope=ROPE,
        seed=seed,
    )


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "mode, flags, path",
    [
        (ForwardMode.EXTEND, {}, "ragged"),
        (ForwardMode.EXTEND, {"disable_chunked_prefix_cache": True}, "mla"),
        (ForwardMode.DECODE, {}, "mla"),
        (ForwardMode.TARGET_VERIFY, {}, "mla"),
        (ForwardMode.DRAFT_EXTEND_V2, {}, "mla"),
    ],
)
def test_flashinfer_mla_metadata_equals_the_reference(mode, flags, path, page_size):
    plan = _plan(page_size, **flags)
    layer = _layer(torch.Generator().manual_seed(1))
    s, pools, q, latent = _case(REQUESTS[mode], mode, page_size)
    fi = flashinfer_backend(plan, pools[0], s.req_to_token_pool.req_to_token, [layer], "cpu", checked=True)
    assert isinstance(fi, FlashInferMLABackend) and fi.mla_wrapper.backend == "fa3"
    ref = ReferenceBackend(plan, pools[1], s.req_to_token_pool.req_to_token, [layer])
    outs = []
    for backend in (fi, ref):
        backend.init_forward_metadata(s.batch)
        outs.append(backend.forward(q, latent, None, layer, s.batch))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-4, rtol=1e-4)
    assert fi.mla_wrapper.plans == (1 if path == "mla" else 0)


def test_flashinfer_mla_extend_without_prefix_reads_only_this_forwards_latent():
    plan = _plan(1, disable_chunked_prefix_cache=True)
    assert plan.mode("extend").common.mla_form == "non_absorbed_without_prefix"
    layer = _layer(torch.Generator().manual_seed(1))
    s, pools, q, latent = _case([(0, 7), (0, 2)], ForwardMode.EXTEND, 1)
    fi = flashinfer_backend(plan, pools[0], s.req_to_token_pool.req_to_token, [layer], "cpu")
    fi.init_forward_metadata(s.batch)
    out = fi.forward(q, latent, None, layer, s.batch)
    ref = ReferenceBackend(plan, pools[1], s.req_to_token_pool.req_to_token, [layer])
    ref.init_forward_metadata(s.batch)
    torch.testing.assert_close(out, ref.forward(q, latent, None, layer, s.batch), atol=1e-4, rtol=1e-4)
    assert fi.mla_wrapper.plans == 0 and fi._latent_rows is None


def test_flashinfer_mla_refuses_other_geometry_at_construction():
    layer = AttentionLayer(0, H, 1, 24, 12, 0.2, is_mla=True, kv_lora_rank=256, qk_rope_head_dim=64)
    pool = MLATokenToKVPool(64, 1, 1, 256, 64, dtype=torch.float32)
    with pytest.raises(BackendRefusal, match="kv_lora_rank 512"):
        flashinfer_backend(_plan(1), pool, torch.zeros(1, 64, dtype=torch.int32), [layer], "cpu")


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND_V2])
def test_flashinfer_mla_graph_replay_metadata_follows_each_rounds_lengths(mode):
    """Capture with one batch, replay with others (emulated, standins.graphs): the static wrapper is re-planned from
    the replay's lengths, and the graph fills its page ids from the rows handed to the replay (a new tensor each
    round, the requests in other rows), not from the captured ones."""
    plan = _plan(16)
    assert plan.mode(mode).common.capture_cuda_graph
    assert_mla_replays_match_reference(
        flashinfer_backend,
        plan,
        _layer(torch.Generator().manual_seed(1)),
        mode,
        lambda requests, m, seed: _case(requests, m, 16, seed=seed),
    )


def test_flashinfer_mla_graph_forward_must_run_the_first_layer_first():
    """The first MLA layer fills the graph's page ids; a captured forward that starts at another layer would read
    stale ones, so it is refused, naming the layer to run first."""
    plan = _plan(16)
    gen = torch.Generator().manual_seed(1)
    layers = [
        AttentionLayer(
            i,
            H,
            1,
            NOPE + ROPE,
            VDIM,
            0.2,
            is_mla=True,
            kv_lora_rank=RANK,
            qk_rope_head_dim=ROPE,
            w_kc=torch.randn(H, NOPE, RANK, generator=gen),
            w_vc=torch.randn(H, RANK, VDIM, generator=gen),
        )
        for i in (3, 4)
    ]
    s, _, q, latent = _case([(5, 1), (40, 1)], ForwardMode.DECODE, 16)
    pool = MLATokenToKVPool(2048, 16, 5, RANK, ROPE, dtype=torch.float32)
    fi = flashinfer_backend(plan, pool, s.req_to_token_pool.req_to_token, layers, "cpu")
    fi.init_cuda_graph_state(2, 2)
    fi.init_forward_metadata_capture_cuda_graph(
        2, 2, s.batch.req_pool_indices, s.batch.seq_lens, None, ForwardMode.DECODE
    )
    with pytest.raises(BatchMetadataError, match="runs layer 3 first"):
        fi.forward(q, latent, None, layers[1], s.batch)
    fi.forward(q, latent, None, layers[0], s.batch)
    fi.forward(q, latent, None, layers[1], s.batch)  # layer 3 filled them


def test_the_flashinfer_name_builds_the_mla_backend_for_mla_layers_and_the_class_refuses_them():
    """The registry's factory of ``flashinfer`` picks FlashInferMLABackend for MLA layers; FlashInferBackend itself
    serves MHA layers only and names the factory."""
    from attngate.backends import create_backend
    from attngate.backends.flashinfer import FlashInferBackend
    from attngate.errors import UsageError

    plan, layer = _plan(1), _layer(torch.Generator().manual_seed(1))
    s, pools, _, _ = _case(REQUESTS[ForwardMode.DECODE], ForwardMode.DECODE, 1)
    rtt = s.req_to_token_pool.req_to_token
    assert type(create_backend("flashinfer", plan, pools[0], rtt, [layer], "cpu")) is FlashInferMLABackend
    with pytest.raises(UsageError, match="flashinfer_backend"):
        FlashInferBackend(plan, pools[0], rtt, [layer], "cpu")
