"""Paged KV cache pools, the request-to-token table, and a page allocator (SGLang's layout).

Slots are token-granular indices into per-layer buffers; slot ``s`` lies in page ``s // page_size``.
A request's tokens are listed, in order, in ``req_to_token[req_pool_index, :seq_len]``.
"""

from __future__ import annotations

from collections import Counter

import torch

from attngate.errors import (
    BatchMetadataError,
    KVCacheExhausted,
    Problem,
    UsageError,
    argument_problems,
    check_arguments,
    count_problems,
)
from attngate.facts.model import ModelFacts


def check_pool_arguments(*counts: tuple[str, object, int], dtype: object = torch.int32, device: object = "cpu") -> None:
    """UsageError naming every bad argument of a pool: each ``(name, value, least)`` count, a ``dtype`` that is no
    torch.dtype, a ``device`` torch cannot parse (checked before anything is allocated)."""
    problems = count_problems(*counts) + argument_problems(("dtype", dtype, torch.dtype, "e.g. torch.bfloat16"))
    try:
        if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
            raise TypeError
        torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        problems.append(
            Problem(
                "device",
                f"takes a torch device ('cpu', 'cuda:0', torch.device), not {device!r:.80}",
                code="usage.device",
            )
        )
    if problems:
        raise UsageError(problems)


class PageAllocator:
    """Hands out whole pages of ``page_size`` slots and takes them back.

    ``order`` (optional) fixes the order pages are handed out in, e.g. a shuffled order so that a
    request's pages are not contiguous.
    """

    def __init__(self, num_pages: int, page_size: int, order: list[int] | None = None):
        """UsageError naming every bad argument: counts below 1, an ``order`` that is no permutation of the pages."""
        problems = count_problems(("num_pages", num_pages, 1), ("page_size", page_size, 1))
        problems += argument_problems(("order", order, (list, tuple, range, type(None)), "a permutation of the pages"))
        if problems:
            raise UsageError(problems)
        self.page_size = page_size
        self.num_pages = num_pages
        self._free: list[int] = list(order) if order is not None else list(range(num_pages))
        if any(isinstance(p, bool) or not isinstance(p, int) for p in self._free) or sorted(self._free) != list(
            range(num_pages)
        ):
            raise UsageError(Problem("order", "must be a permutation of range(num_pages)", code="usage.page-order"))
        self._free.reverse()  # pop() from the end hands pages out in `order`
        self._in_use: set[int] = set()

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def alloc_pages(self, n: int) -> list[int]:
        """``n`` page indices. Raises KVCacheExhausted when fewer are free."""
        if n > len(self._free):
            raise KVCacheExhausted(
                Problem(
                    "kv pool",
                    f"need {n} pages of {self.page_size} tokens, {len(self._free)} of {self.num_pages} free",
                    code="kv-cache-exhausted.pages",
                )
            )
        pages = [self._free.pop() for _ in range(n)]
        self._in_use.update(pages)
        return pages

    def free(self, pages: list[int]) -> None:
        """Take ``pages`` back. BatchMetadataError naming every page that is not handed out (freed twice, or never
        allocated), nothing freed: a page on the free list twice would go to two requests, each reading the other's KV."""
        counts = Counter(pages)  # linear: a long request frees many thousands of pages at page_size 1
        stray = sorted(p for p in counts if p not in self._in_use)
        twice = sorted(p for p, n in counts.items() if n > 1 and p in self._in_use)
        problems = (
            [
                Problem(
                    "kv pool",
                    f"pages {stray[:8]} are not in use (freed twice, or never allocated)",
                    code="batch-metadata.pages-not-in-use",
                )
            ]
            if stray
            else []
        )
        problems += (
            [Problem("kv pool", f"pages {twice[:8]} are given more than once", code="batch-metadata.pages-twice")]
            if twice
            else []
        )
        if problems:
            raise BatchMetadataError(problems)
        self._in_use.difference_update(pages)
        self._free.extend(reversed(pages))


class ReqToTokenPool:
    """``req_to_token: [max_requests, max_context_len]`` int32: each request's slots, in token order."""

    def __init__(self, max_requests: int, max_context_len: int, device: torch.device | str = "cpu"):
        """UsageError naming every bad argument: counts below 1, a device torch does not know."""
        check_pool_arguments(("max_requests", max_requests, 1), ("max_context_len", max_context_len, 1), device=device)
        self.req_to_token = torch.zeros((max_requests, max_context_len), dtype=torch.int32, device=device)
        self._free = list(range(max_requests - 1, -1, -1))
        self._in_use: set[int] = set()

    @property
    def max_context_len(self) -> int:
        return self.req_to_token.shape[1]

    def alloc(self) -> int:
        if not self._free:
            raise KVCacheExhausted(
                Problem(
                    "req_to_token",
                    f"all {self.req_to_token.shape[0]} request slots are in use",
                    code="kv-cache-exhausted.requests",
                )
            )
        index = self._free.pop()
        self._in_use.add(index)
        return index

    def free(self, index: int) -> None:
        """Take row ``index`` back; BatchMetadataError for a row not in use (two requests would share it)."""
        if index not in self._in_use:
            raise BatchMetadataError(
                Problem(
                    "req_to_token",
                    f"row {index} is not in use (freed twice, or never allocated)",
                    code="batch-metadata.row-not-in-use",
                )
            )
        self._in_use.remove(index)
        self._free.append(index)


def _as_words(buf: torch.Tensor) -> torch.Tensor:
    """``buf: [num_slots, ..., row]`` viewed as 8-byte words along its last dim where its layout allows, else unchanged.

    A row scatter moves one element per thread; moving 8-byte words instead of 2-byte bf16
    elements makes the KV write several times faster on a GPU (bench/bench_kv_write.py).
    """
    try:
        return buf.view(torch.int64)
    except RuntimeError:  # a row that is no whole number of words
        return buf


def _scatter_rows(buf_words: torch.Tensor, loc: torch.Tensor, src: torch.Tensor, dtype: torch.dtype) -> None:
    """``buf[loc] = src`` for ``buf_words = _as_words(buf)`` of ``dtype``, ``loc: [n]`` int64 (int32 is widened) and
    ``src: [n, ...]`` of buf's shape per slot. A handful of Python calls: this runs for every layer of every step
    (bench/RESULTS.md, host time per step)."""
    if src.dtype != dtype:
        src = src.to(dtype)
    if src.dim() != buf_words.dim():  # e.g. k as [n, num_kv_heads * head_dim]: per slot as the buffer holds it
        src = src.reshape(src.shape[0], *buf_words.shape[1:-1], -1)
    if buf_words.dtype != dtype:
        try:
            src = src.view(buf_words.dtype)
        except RuntimeError:  # a slice starting off a word boundary (of a fused qkv): copy it to match the word view
            src = src.contiguous().view(buf_words.dtype)
    buf_words.index_copy_(0, loc if loc.dtype == torch.int64 else loc.long(), src)


class _PoolBase:
    num_slots: int

    def check_loc(self, loc: torch.Tensor, what: str = "out_cache_loc") -> None:
        """Raise BatchMetadataError when a slot index lies outside the pool (costs a host sync)."""
        if loc.numel() and (int(loc.min()) < 0 or int(loc.max()) >= self.num_slots):
            bad = loc[(loc < 0) | (loc >= self.num_slots)][:4].tolist()
            raise BatchMetadataError(
                Problem(
                    what,
                    f"slot indices {bad} lie outside the pool of {self.num_slots} slots",
                    code="batch-metadata.slots-outside-pool",
                )
            )


class MHATokenToKVPool(_PoolBase):
    """Per-layer K and V buffers: ``k: [num_slots, num_kv_heads, head_dim]``, ``v: [num_slots, num_kv_heads, v_head_dim]``.

    ``layer_shapes``: ``(num_kv_heads, head_dim, v_head_dim)`` of each of the ``num_layers`` layers, for a model whose
    layer kinds differ in shape (MiMo-V2's sliding-window layers: 8 KV heads beside 4); given, it replaces the three
    shared values. UsageError naming every bad argument."""

    def __init__(
        self,
        num_slots: int,
        page_size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        v_head_dim: int | None = None,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
        *,
        layer_shapes: list[tuple[int, int, int]] | None = None,
    ):
        counts = [
            ("num_kv_heads", num_kv_heads, 1),
            ("head_dim", head_dim, 1),
            *([("v_head_dim", v_head_dim, 1)] if v_head_dim is not None else []),
        ]
        if layer_shapes is not None:
            counts = [
                (f"layer_shapes[{i}].{name}", value, 1)
                for i, shape in enumerate(layer_shapes)
                for name, value in zip(("num_kv_heads", "head_dim", "v_head_dim"), shape)
            ]
        check_pool_arguments(
            ("num_slots", num_slots, 1),
            ("page_size", page_size, 1),
            ("num_layers", num_layers, 0),
            *counts,
            dtype=dtype,
            device=device,
        )
        if layer_shapes is not None and len(layer_shapes) != num_layers:
            raise UsageError(
                Problem(
                    "layer_shapes",
                    f"gives {len(layer_shapes)} layers' shapes for num_layers={num_layers}",
                    code="usage.layer-shapes-count",
                )
            )
        self.num_slots, self.page_size, self.dtype = num_slots, page_size, dtype
        shapes = layer_shapes or [(num_kv_heads, head_dim, v_head_dim or head_dim)] * num_layers
        self.k_buffer = [torch.zeros((num_slots, h, d), dtype=dtype, device=device) for h, d, _ in shapes]
        self.v_buffer = [torch.zeros((num_slots, h, dv), dtype=dtype, device=device) for h, _, dv in shapes]
        self._k_words = [_as_words(b) for b in self.k_buffer]
        self._v_words = [_as_words(b) for b in self.v_buffer]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k: [n, num_kv_heads, head_dim]`` and ``v`` into slots ``loc: [n]`` int64 (int32 is widened)."""
        _scatter_rows(self._k_words[layer_id], loc, k, self.dtype)
        _scatter_rows(self._v_words[layer_id], loc, v, self.dtype)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]


class MLATokenToKVPool(_PoolBase):
    """One buffer per layer: ``[num_slots, 1, kv_lora_rank + qk_rope_head_dim]``, the compressed latent then the rope part."""

    def __init__(
        self,
        num_slots: int,
        page_size: int,
        num_layers: int,
        kv_lora_rank: int,
        qk_rope_head_dim: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ):
        check_pool_arguments(
            ("num_slots", num_slots, 1),
            ("page_size", page_size, 1),
            ("num_layers", num_layers, 0),
            ("kv_lora_rank", kv_lora_rank, 1),
            ("qk_rope_head_dim", qk_rope_head_dim, 0),
            dtype=dtype,
            device=device,
        )
        self.num_slots, self.page_size, self.dtype = num_slots, page_size, dtype
        self.kv_lora_rank, self.qk_rope_head_dim = kv_lora_rank, qk_rope_head_dim
        self.kv_buffer = [
            torch.zeros((num_slots, 1, kv_lora_rank + qk_rope_head_dim), dtype=dtype, device=device)
            for _ in range(num_layers)
        ]
        self._kv_words = [_as_words(b) for b in self.kv_buffer]

    def set_kv_buffer(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """Write ``k: [n, 1, kv_lora_rank + qk_rope_head_dim]`` (latent ++ rope) into slots ``loc``; ``v`` is unused."""
        _scatter_rows(self._kv_words[layer_id], loc, k, self.dtype)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) views: K is latent ++ rope, V is the latent."""
        buf = self.kv_buffer[layer_id]
        return buf, buf[..., : self.kv_lora_rank]


def kv_pool_for(
    model: ModelFacts, num_slots: int, page_size: int, num_layers: int, dtype: torch.dtype, device: torch.device | str
) -> MHATokenToKVPool | MLATokenToKVPool:
    """The KV pool a model's layers write: the latent cache (ckv ++ kpe) for MLA, else K and V per KV head. UsageError
    naming every bad argument (the pool's own checks, and a ``model`` that is no ModelFacts)."""
    check_arguments(("model", model, ModelFacts, "ModelFacts.from_hf_config(path)"))
    if model.use_mla:
        return MLATokenToKVPool(
            num_slots, page_size, num_layers, model.kv_lora_rank, model.qk_rope_head_dim, dtype=dtype, device=device
        )
    shapes = None
    if model.swa_shape is not None:  # the layer kinds differ: each layer's own K/V rows
        if num_layers != len(model.layer_kinds):
            raise UsageError(
                Problem(
                    "num_layers",
                    f"is {num_layers}; {model.source} has {len(model.layer_kinds)} attention layers",
                    code="usage.layer-count",
                )
            )
        shapes = [(s.num_key_value_heads, s.head_dim, s.v_head_dim) for s in map(model.shape, model.layer_kinds)]
    return MHATokenToKVPool(
        num_slots,
        page_size,
        num_layers,
        model.num_key_value_heads,
        model.head_dim,
        model.v_head_dim,
        dtype=dtype,
        device=device,
        layer_shapes=shapes,
    )
