"""The FA4 fast launch (attngate.backends.fa4_launch) on the CPU: the public call runs wherever the launch cannot be
trusted (a stand-in without flash_attn.cute's compile cache, another flash-attn-4 version, a launch that passes a
tensor of its own); a signature whose launch was recorded replays it with the new tensors and never calls the public
function again. The compiled function here is the stand-in's math behind an interface laid out as flash-attn-4
4.0.0b36's (``_flash_attn_fwd.compile_cache[key](q, k, v, out, lse, scale, cu_q, cu_k, used_q, used_k, page_table,
window_left, window_right, sink, aux)``); tests/gpu/test_fa4_launch.py holds the real one bitwise to the public call."""

from __future__ import annotations

import sys
import types

import pytest

torch = pytest.importorskip("torch")

from attngate.backends import fa4_launch  # noqa: E402
from tests.support.standins import flash_attn_cute  # noqa: E402


class _Aux:
    """A constant argument of the launch (flash-attn-4 passes AuxData(aux_tensors, aux_scalars))."""


def _fake_cute(extra_tensor: bool = False) -> tuple[types.ModuleType, dict[str, int]]:
    """``flash_attn.cute`` with an interface whose ``_flash_attn_fwd`` launches through a compile cache; ``counts``
    counts the public calls and the kernel launches. ``extra_tensor``: the launch also takes a tensor the interface
    makes per call (as split-KV partials or scheduler metadata are)."""
    counts = {"public": 0, "launch": 0}
    interface = types.ModuleType("flash_attn.cute.interface")

    def kernel(q, k, v, out, lse, scale, cu_q, cu_k, used_q, used_k, page_table, left, right, sink, aux, *extra):
        counts["launch"] += 1
        window = (left, right) if left is not None else (None, None)
        got = flash_attn_cute.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_q=used_q, seqused_k=used_k, softmax_scale=scale,
            causal=right == 0 and left is None, window_size=window, learnable_sink=sink, return_lse=lse is not None,
        )  # fmt: skip
        out.copy_(got[0] if isinstance(got, tuple) else got)
        if lse is not None:
            lse.copy_(got[1])

    def _flash_attn_fwd(q, k, v, cu_q, cu_k, used_q, used_k, scale, causal, window, sink, return_lse):
        key = (q.dtype, q.shape[-1], causal, window)
        if key not in _flash_attn_fwd.compile_cache:
            _flash_attn_fwd.compile_cache[key] = kernel
        out = torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
        lse = torch.empty(q.shape[1], q.shape[0]) if return_lse else None
        left, right = window if window != (None, None) else (None, 0 if causal else None)
        extra = (torch.zeros(1),) if extra_tensor else ()
        args = (q.detach(), k.detach(), v.detach(), out, lse, scale, cu_q, cu_k, used_q, used_k, None, left, right)
        _flash_attn_fwd.compile_cache[key](*args, sink, _AUX, *extra)
        return out, lse

    _flash_attn_fwd.compile_cache = {}
    interface._flash_attn_fwd = _flash_attn_fwd

    def flash_attn_varlen_func(q, k, v, *, cu_seqlens_q, cu_seqlens_k, seqused_q=None, seqused_k=None, **kw):
        counts["public"] += 1
        out, lse = interface._flash_attn_fwd(
            q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, kw["softmax_scale"], kw["causal"],
            kw["window_size"], kw["learnable_sink"], kw.get("return_lse", False),
        )  # fmt: skip
        return (out, lse) if kw.get("return_lse") else out

    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func, cute.interface = flash_attn_varlen_func, interface
    return cute, counts


_AUX = _Aux()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(fa4_launch, "_LAUNCHES", {})
    monkeypatch.setattr(fa4_launch.metadata, "version", lambda name: fa4_launch.PINNED)
    fa4_launch._interface.cache_clear()  # kept once a process: each test installs its own interface
    yield
    fa4_launch._interface.cache_clear()


def _install(monkeypatch, cute: types.ModuleType) -> None:
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", cute.interface)


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _call(
    cute, lengths: list[int], seed: int, *, k_lengths=None, causal=True, window=(None, None), sinks=False,
    return_lse=False,
):  # fmt: skip
    """One call: queries of ``lengths`` over keys of ``k_lengths`` (None: the queries' lengths, one tensor passed as
    both cu_seqlens_q and cu_seqlens_k, as a prefill over its own keys may)."""
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, 4, 16, generator=g)
    k, v = (torch.randn(sum(k_lengths or lengths), 2, 16, generator=g) for _ in range(2))
    cu_q = _cu(lengths)
    cu_k = cu_q if k_lengths is None else _cu(k_lengths)
    sink = torch.randn(4, generator=g) if sinks else None
    kw = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, seqused_q=None, seqused_k=None, max_seqlen_q=max(lengths))
    kw |= dict(max_seqlen_k=256, softmax_scale=0.25, causal=causal, window_size=window, learnable_sink=sink)
    got = fa4_launch.flash_attn_varlen(cute, q, k, v, **kw, softcap=0.0, return_lse=return_lse)
    expected = flash_attn_cute.flash_attn_varlen_func(q, k, v, **kw, return_lse=return_lse)
    return got, expected if isinstance(expected, tuple) else (expected, None)


def test_the_public_call_runs_where_the_compile_cache_is_missing(monkeypatch):
    """The stand-in has no ``interface._flash_attn_fwd.compile_cache``: every call is the public one, nothing recorded."""
    modules = flash_attn_cute.modules()
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    for seed in range(3):
        (out, _), (expected, _) = _call(modules["flash_attn.cute"], [5, 3], seed)
        assert torch.allclose(out, expected)
    assert fa4_launch.launches() == {}


@pytest.mark.parametrize("return_lse", [False, True])
@pytest.mark.parametrize("options", [{}, {"sinks": True}, {"causal": False, "window": (3, 0)}])
def test_a_recorded_signature_launches_its_kernel_with_the_new_tensors(monkeypatch, options, return_lse):
    cute, counts = _fake_cute()
    _install(monkeypatch, cute)
    for seed in range(4):  # one signature (same lengths' shapes per token), new tensors each call
        k_lengths = [7 - seed, 5 + seed]  # other keys each call, the same bounds
        (out, lse), (expected, expected_lse) = _call(
            cute, [5, 3], seed, k_lengths=k_lengths, **options, return_lse=return_lse
        )
        assert torch.allclose(out, expected, atol=1e-6)
        assert (lse is None) == (not return_lse) and (lse is None or torch.allclose(lse, expected_lse, atol=1e-6))
    assert counts == {"public": 1, "launch": 4}
    assert list(fa4_launch.launches().values()) == [True]


def test_a_launch_recorded_with_one_tensor_passed_twice_replays_only_where_one_is_passed_twice(monkeypatch):
    """A first call passes one tensor as cu_seqlens_q and cu_seqlens_k (a prefill over its own keys). A later call of
    otherwise the same signature over other keys is another signature: it attends to its own keys (a replay of the
    first launch would read cu_seqlens_q there), and each kind replays its own launch."""
    cute, counts = _fake_cute()
    _install(monkeypatch, cute)
    for seed, k_lengths in [(0, None), (1, [2, 6]), (2, [6, 2]), (3, None)]:
        (out, _), (expected, _) = _call(cute, [5, 3], seed, k_lengths=k_lengths)
        assert torch.allclose(out, expected, atol=1e-6), k_lengths
    assert counts == {"public": 2, "launch": 4} and list(fa4_launch.launches().values()) == [True, True]


def test_a_launch_that_passes_a_tensor_of_its_own_keeps_the_public_call(monkeypatch):
    cute, counts = _fake_cute(extra_tensor=True)
    _install(monkeypatch, cute)
    for seed in range(3):
        (out, _), (expected, _) = _call(cute, [4, 4], seed)
        assert torch.allclose(out, expected, atol=1e-6)
    assert counts == {"public": 3, "launch": 3} and list(fa4_launch.launches().values()) == [False]


def test_another_flash_attn_4_version_keeps_the_public_call(monkeypatch):
    cute, counts = _fake_cute()
    _install(monkeypatch, cute)
    monkeypatch.setattr(fa4_launch.metadata, "version", lambda name: "4.0.0b37")
    for seed in range(2):
        _call(cute, [6], seed)
    assert counts["public"] == 2 and fa4_launch.launches() == {}
