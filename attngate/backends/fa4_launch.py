"""FA4's compiled forward kernel launched straight from ``flash_attn.cute``'s compile cache: the fast launch.

``flash_attn.cute.flash_attn_varlen_func`` costs 170 to 313 µs of host time a call (an autograd Function and
``_flash_attn_fwd``'s argument checks and tile heuristics in Python) around a launch of a few µs; on the plain
transformers path that is most of a small compiled decode step. For one *call signature* (dtypes, per-token shapes,
which optional tensors are given and which the caller passed as one, the scalar arguments and the length bounds,
everything the interface's heuristics read; of the strides only their alignment, :func:`_layout`) the interface always
launches the same compiled function with the same constant arguments. So the first call of a signature goes through
the public function with the compile cache wrapped to record that launch; the record is kept only where every tensor
it passed is one of the caller's (or the output the interface allocated), told apart from the others, and every other
argument is a constant of the signature; later calls of the signature allocate the output and launch the recorded
function with the new tensors.

Taken only where flash-attn-4 is the pinned version (:data:`PINNED`) and its interface has the compile cache this
module reads (``flash_attn.cute.interface._flash_attn_fwd.compile_cache``); anything else (another version, a
stand-in, a launch that passed a tensor of its own such as split-KV partials or scheduler metadata, autograd, an
empty batch) runs the public call. ``tests/gpu/test_fa4_launch.py`` holds the two calls' outputs bitwise equal over
a grid of head dims, GQA ratios, causal and window, soft-cap, sinks, varlen and seqused, bf16 and fp16.

Shapes: ``q: [total_q, num_q_heads, head_dim]``, ``k: [total_k, num_kv_heads, head_dim]``, ``v: [total_k,
num_kv_heads, v_head_dim]`` (bf16/fp16, CUDA); ``cu_seqlens_q``/``cu_seqlens_k``: ``[batch + 1]`` int32 on the device;
``seqused_q``/``seqused_k``: ``[batch]`` int32 or None; ``learnable_sink: [num_q_heads]`` fp32 or None.
"""

from __future__ import annotations

import functools
import importlib
import itertools
import math
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import torch

#: The flash-attn-4 release whose launch layout this module knows (pyproject's gpu extra pins it).
PINNED = "4.0.0b36"

#: The tensors a launch may pass, by their index in a call's tensor tuple: the caller's, then the outputs.
_TENSORS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "seqused_q", "seqused_k", "learnable_sink", "out", "lse")


@dataclass(frozen=True)
class _Launch:
    """A recorded launch: the compiled function and its arguments, those of the signature as they were (constants)
    and, at ``tensor_slots``, the call's tensors by their index in :data:`_TENSORS`."""

    function: Any
    arguments: tuple[Any, ...]
    tensor_slots: tuple[tuple[int, int], ...]  # (argument position, index in _TENSORS)

    def __call__(self, tensors: tuple[torch.Tensor | None, ...]) -> None:
        arguments = list(self.arguments)
        for position, index in self.tensor_slots:
            arguments[position] = tensors[index]
        self.function(*arguments)


# per call signature: the launch to replay, or None where only the public call may run
_LAUNCHES: dict[tuple, _Launch | None] = {}


@functools.cache
def _interface() -> Any | None:
    """flash_attn.cute's interface module where it is the pinned release with the compile cache, else None. Looked up
    once a process: ``metadata.version`` parses the package's METADATA file (about 0.5 ms, once per attention call
    before it was kept)."""
    try:
        if metadata.version("flash-attn-4") != PINNED:
            return None
        interface = importlib.import_module("flash_attn.cute.interface")
    except Exception:  # noqa: BLE001 - not installed, a stand-in without the module, or one that fails to load
        return None
    fwd = getattr(interface, "_flash_attn_fwd", None)
    return interface if fwd is not None and hasattr(fwd, "compile_cache") else None


class _Recording:
    """The compile cache, standing in for the duration of one public call: each compiled function it hands out is
    wrapped to note its arguments."""

    def __init__(self, cache: Any) -> None:
        self.cache, self.calls = cache, []

    def __contains__(self, key: Any) -> bool:
        return key in self.cache

    def __setitem__(self, key: Any, value: Any) -> None:
        self.cache[key] = value

    def __getitem__(self, key: Any) -> Any:
        function = self.cache[key]

        def recorded(*args: Any) -> Any:
            self.calls.append((function, args))
            return function(*args)

        return recorded


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype


def _record(calls: list, tensors: tuple[torch.Tensor | None, ...]) -> _Launch | None:
    """The launch of one public call, or None where it is not one launch of the call's tensors (:data:`_TENSORS`:
    the caller's, the output and lse the interface allocated) and constants."""
    if len(calls) != 1:
        return None
    function, args = calls[0]
    slots = []
    for position, arg in enumerate(args):
        if isinstance(arg, torch.Tensor):
            matches = [i for i, t in enumerate(tensors) if t is not None and _same(arg, t)]
            # none: a tensor the interface made for this call (partials, scheduler metadata, a copy); several: one
            # the caller passed twice, which the signature must say (_aliases) for a later call to do the same
            if not matches or (len(matches) > 1 and set(matches) not in _ALIASED):
                return None
            slots.append((position, matches[0]))
        elif isinstance(arg, (list, tuple)) and any(isinstance(a, torch.Tensor) for a in arg):
            return None
    constants = tuple(None if any(p == position for p, _ in slots) else arg for position, arg in enumerate(args))
    return _Launch(function, constants, tuple(slots))


def flash_attn_varlen(
    module: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    seqused_q: torch.Tensor | None,
    seqused_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int | None, int | None],
    learnable_sink: torch.Tensor | None,
    softcap: float,
    return_lse: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``module.flash_attn_varlen_func(...)`` -> ``(out: [total_q, num_q_heads, v_head_dim]`` in q's dtype, ``lse:
    [num_q_heads, total_q]`` fp32 or None without ``return_lse``), through the recorded launch of its signature where
    there is one (see the module's doc). ``module``: the ``flash_attn.cute`` module (or a test's stand-in, which always
    takes the public call)."""
    interface = _interface() if module.__name__ == "flash_attn.cute" else None
    key = (
        q.dtype, k.dtype, q.shape[1:], k.shape[1:], v.shape[1:], _layout(q.stride() + k.stride() + v.stride()),
        cu_seqlens_q.shape[0], seqused_q is None, seqused_k is None,
        None if learnable_sink is None else learnable_sink.dtype, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
        window_size, softcap, return_lse, q.get_device(), _aliases(cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k),
    )  # fmt: skip
    launch = _LAUNCHES.get(key) if interface is not None else None
    plain = q.shape[0] > 0 and k.shape[0] > 0 and not (torch.is_grad_enabled() and q.requires_grad | k.requires_grad)
    if launch is not None and plain:
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        lse = q.new_empty(q.shape[1], q.shape[0], dtype=torch.float32) if return_lse else None
        launch((q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, learnable_sink, out, lse))
        return out, lse
    public = dict(
        cu_seqlens_q=cu_seqlens_q,
        cu_seqlens_k=cu_seqlens_k,
        seqused_q=seqused_q,
        seqused_k=seqused_k,
        max_seqlen_q=max_seqlen_q,
        max_seqlen_k=max_seqlen_k,
        softmax_scale=softmax_scale,
        causal=causal,
        window_size=window_size,
        learnable_sink=learnable_sink,
        softcap=softcap,
        return_lse=return_lse,
    )
    if interface is None or key in _LAUNCHES or not plain:
        return _out_and_lse(module.flash_attn_varlen_func(q, k, v, **public))
    fwd = interface._flash_attn_fwd
    cache, recording = fwd.compile_cache, _Recording(fwd.compile_cache)
    fwd.compile_cache = recording
    try:
        out, lse = _out_and_lse(module.flash_attn_varlen_func(q, k, v, **public))
    finally:
        fwd.compile_cache = cache
    tensors = (q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, learnable_sink, out, lse)
    _LAUNCHES[key] = _record(recording.calls, tensors)
    return out, lse


#: The pairs of a call's tensors (indices in _TENSORS) a caller may pass as one tensor, which the signature tells apart
_ALIASED = ({3, 4}, {5, 6})


def _aliases(cu_q: torch.Tensor, cu_k: torch.Tensor, used_q: torch.Tensor | None, used_k: torch.Tensor | None) -> int:
    """Which of the :data:`_ALIASED` pairs the caller passed as one tensor (a prefill over its own keys passes
    cu_seqlens_q as cu_seqlens_k): bit 0 the cu_seqlens, bit 1 the seqused. Part of the signature, so a launch recorded
    with one tensor in two places replays only for calls that pass one tensor there too."""
    same_used = used_q is not None and used_k is not None and used_q.data_ptr() == used_k.data_ptr()
    return (cu_q.data_ptr() == cu_k.data_ptr()) | same_used << 1


def _layout(strides: tuple[int, ...]) -> tuple[int, ...]:
    """What a signature keeps of q's, k's and v's strides: each one's largest power-of-two divisor up to 16 elements.
    The compiled kernel takes its layouts dynamic (``mark_layout_dynamic``: the last stride 1, the others any value, its
    TMA copies needing 16-byte multiples) and the interface's heuristics read shapes alone, so a decode step over a
    DynamicCache, whose head stride grows with every token, keeps its signature (the strides themselves would make one
    signature a token, each paying the public call once and kept for ever)."""
    return tuple(map(math.gcd, strides, itertools.repeat(16)))


def _out_and_lse(result: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    return (result[0], result[1]) if isinstance(result, tuple) else (result, None)


def launches() -> dict[tuple, bool]:
    """Each call signature seen and whether it launches fast (for tests and the profile script)."""
    return {key: launch is not None for key, launch in _LAUNCHES.items()}
