"""FA4 (``flash_attn.cute``) MLA on SM100, on the CPU through the flash_attn.cute stand-in (tests/support/standins).

The lent GPUs are Hopper, where flash_attn.cute runs no absorbed MLA (the plan refuses FA for MLA there), so
this is the only test of the SM100 path: absorbed decode and verify as ``q_rope`` against kpe plus ``qv``
against the latent ckv through the page table, extend as ragged non-absorbed attention over the decompressed
prefix and new tokens, in the form the plan names per forward mode, eager and in (emulated) CUDA-graph replay.
"""

from __future__ import annotations

import sys

import pytest

torch = pytest.importorskip("torch")

from attngate import ForwardMode, ModelFacts, Platform, ServerArgs, resolve  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from tests.support.backend_cases import (  # noqa: E402
    assert_mla_matches_reference,
    assert_mla_replays_match_reference,
    mla_cpu_batch,
    mla_cpu_layer,
)
from tests.support.helpers import MODELS  # noqa: E402
from tests.support.standins import flash_attn_cute  # noqa: E402

H, RANK, ROPE, NOPE, VDIM = 8, 32, 8, 16, 12
REQUESTS = [(0, 5), (17, 3), (40, 1), (3, 9)]
BLACKWELL = Platform.from_name("sm100", kernels=["flashinfer", "flash_attn.cute"])


@pytest.fixture(autouse=True)
def calls(monkeypatch) -> list[dict]:
    """The stand-in installed as flash_attn.cute; each ``flash_attn_varlen_func`` call's keywords, in order."""
    recorded: list[dict] = []
    modules = flash_attn_cute.modules()

    def varlen(q, k, v, **kw):
        recorded.append(dict(q=q, k=k, v=v, **kw))
        return flash_attn_cute.flash_attn_varlen_func(q, k, v, **kw)

    modules["flash_attn.cute"].flash_attn_varlen_func = modules["flash_attn.cute.interface"].flash_attn_varlen_func = (
        varlen
    )
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    return recorded


def _plan(page_size: int, **flags):
    plan = resolve(
        ServerArgs(attention_backend="fa4", page_size=page_size, **flags),
        ModelFacts.from_hf_config(MODELS / "DeepSeek-V2-Lite.json"),
        BLACKWELL,
    ).plan
    assert plan.fa.provider == "flash_attn.cute" and plan.common.page_size == page_size
    return plan


def _batch(requests, mode: ForwardMode, page_size: int, gen: torch.Generator, seed: int = 1):
    return mla_cpu_batch(
        requests, mode, page_size, gen, heads=H, nope=NOPE, rank=RANK, rope=ROPE, seed=seed, num_slots=1024
    )


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize(
    "mode, flags, requests, absorbed",
    [
        (ForwardMode.EXTEND, {}, REQUESTS, False),  # non-absorbed over the decompressed prefix and new tokens
        (ForwardMode.EXTEND, {}, [(0, n) for _, n in REQUESTS], False),  # no prefix: this forward's latent alone
        (
            ForwardMode.EXTEND,
            {"disable_chunked_prefix_cache": True},
            [(p + 1, n) for p, n in REQUESTS],
            True,
        ),  # all have one
        (ForwardMode.EXTEND, {"disable_chunked_prefix_cache": True}, [(0, n) for _, n in REQUESTS], False),
        (ForwardMode.DECODE, {}, [(p + 1, 1) for p, _ in REQUESTS], True),
        (ForwardMode.TARGET_VERIFY, {}, [(p + 1, 3) for p, _ in REQUESTS], True),
    ],
    ids=["extend", "extend-no-prefix", "extend-absorbed", "extend-absorbed-form-no-prefix", "decode", "verify"],
)
def test_fa4_mla_on_sm100_in_the_form_the_plan_names(calls, mode, flags, requests, absorbed, page_size):
    plan = _plan(page_size, **flags)
    gen = torch.Generator().manual_seed(5)
    layer = mla_cpu_layer(gen, heads=H, nope=NOPE, rank=RANK, rope=ROPE, v_head_dim=VDIM)
    assert_mla_matches_reference(FlashAttentionBackend, plan, layer, _batch(requests, mode, page_size, gen))
    (call,) = calls
    if absorbed:  # q_rope vs kpe, qv vs ckv; the latent cache paged, its lengths per request
        assert call["q"].shape[-1] == ROPE and call["qv"].shape[-1] == RANK and call["v"].shape[-1] == RANK
        assert call["page_table"] is not None and call["seqused_k"].tolist() == [p + n for p, n in requests]
    else:
        assert call.get("qv") is None and call.get("page_table") is None
        assert call["cu_seqlens_k"][-1] == sum(p + n for p, n in requests)


@pytest.mark.parametrize("mode", [ForwardMode.DECODE, ForwardMode.TARGET_VERIFY])
def test_fa4_mla_cuda_graph_replay_on_sm100_follows_each_round(mode):
    plan = _plan(16)
    assert plan.mode(mode).common.capture_cuda_graph
    gen = torch.Generator().manual_seed(5)
    layer = mla_cpu_layer(gen, heads=H, nope=NOPE, rank=RANK, rope=ROPE, v_head_dim=VDIM)
    assert_mla_replays_match_reference(
        FlashAttentionBackend, plan, layer, mode, lambda requests, m, seed: _batch(requests, m, 16, gen, seed)
    )
