"""A CPU stand-in of the FlashInfer API the backends call (FlashInfer 0.7.2 signatures).

``plan()`` checks what the kernels need (monotone int32 indptr from 0, one length per request,
page ids inside the cache, ``last_page_len`` in ``[1, page_size]``, GQA head counts, a custom mask of
``sum(qo_len * kv_len)`` entries and none on the fa3 family, fa3 only at its head dims and never over an FP8 cache,
``fixed_split_size`` positive, the CUDA-graph buffers' batch size and capacity, a graph's custom-mask buffers) and
raises ``ValueError`` listing every problem. A custom mask and ``window_left`` apply together, as in FlashInfer. It
keeps exactly what it was given (graph wrappers: copied into their static buffers, which ``run()``
then reads, as a replayed graph does). Split-KV follows FlashInfer: with ``fixed_split_size`` the KV
is cut every that many pages (ragged: tokens); otherwise a batch-dependent heuristic decides, and
``disable_split_kv`` turns splitting off. ``return_lse`` gives the log-sum-exp in base 2, as FlashInfer.
``fast_decode_plan`` re-plans a planned decode wrapper without copying anything, as FlashInfer's.
Where the real kernel's result is undefined the stand-in returns NaN: the fa3 paged kernel over a
request with no keys (measured: finite garbage where fa2 gives lse -inf and output 0).
"""

from __future__ import annotations

import itertools
import math
import types

import torch

from tests.support.standins.graphs import RECORDER
from tests.support.standins.kernel_math import attend, heuristic_chunk, request_mask

FAMILIES = ("auto", "fa2", "fa3")
MIN_CHUNK_TOKENS = 128


class _Problems(list):
    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)

    def raise_any(self, where: str) -> None:
        if self:
            raise ValueError(f"{where}: " + "; ".join(self))


def _check_indptr(problems: _Problems, name: str, indptr: torch.Tensor, batch_size: int | None = None) -> None:
    if indptr.dtype != torch.int32 or indptr.dim() != 1 or indptr.numel() == 0:
        problems.append(
            f"{name} must be a 1-D int32 tensor of batch_size + 1 entries, got {indptr.dtype} {tuple(indptr.shape)}"
        )
        return
    if int(indptr[0]) != 0 or bool((indptr[1:] < indptr[:-1]).any()):
        problems.append(f"{name} must start at 0 and never decrease, got {indptr.tolist()[:8]}")
    if batch_size is not None and indptr.numel() != batch_size + 1:
        problems.append(f"{name} has {indptr.numel()} entries for batch size {batch_size}")


def _check_common(
    problems: _Problems, num_qo_heads: int, num_kv_heads: int, window_left: int, logits_soft_cap, fixed_split_size
) -> None:
    problems.check(
        num_kv_heads > 0 and num_qo_heads % num_kv_heads == 0,
        f"num_qo_heads {num_qo_heads} must be a multiple of num_kv_heads {num_kv_heads}",
    )
    problems.check(window_left >= -1, f"window_left {window_left} must be -1 (no window) or >= 0")
    problems.check(logits_soft_cap is None or logits_soft_cap >= 0, f"logits_soft_cap {logits_soft_cap} must be >= 0")
    problems.check(
        fixed_split_size in (None, -1) or fixed_split_size > 0, f"fixed_split_size {fixed_split_size} must be positive"
    )


def _split_chunk(
    units: list[int],
    *,
    fixed_split_size,
    disable_split_kv: bool,
    heads: int,
    min_chunk: int,
    tiles: list[int] | None = None,
) -> int | None:
    """The split-KV chunk in plan units (pages or tokens): fixed, heuristic or none."""
    if disable_split_kv:
        return None
    if fixed_split_size not in (None, -1):
        return fixed_split_size
    return heuristic_chunk(units, heads=heads, min_chunk=min_chunk, tiles=tiles)


class _PagedKv:
    """What a paged plan holds: indptr, indices, last_page_len (copies, or views of the graph buffers)."""

    def __init__(
        self, problems: _Problems, indptr, indices, last_page_len, page_size: int, buffers=None, adopt: bool = False
    ):
        bs = indptr.numel() - 1
        _check_indptr(problems, "paged_kv_indptr", indptr)
        problems.check(indices.dtype == torch.int32, f"paged_kv_indices must be int32, got {indices.dtype}")
        problems.check(
            last_page_len.dtype == torch.int32 and last_page_len.numel() == bs,
            f"paged_kv_last_page_len must be {bs} int32 values, got {last_page_len.dtype} {tuple(last_page_len.shape)}",
        )
        if indptr.numel() and indices.numel() < int(indptr[-1]):
            problems.append(f"paged_kv_indices has {indices.numel()} entries, paged_kv_indptr[-1] is {int(indptr[-1])}")
        if last_page_len.numel() and not bool(((last_page_len >= 1) & (last_page_len <= page_size)).all()):
            problems.append(f"paged_kv_last_page_len must lie in [1, {page_size}], got {last_page_len.tolist()[:8]}")
        if buffers is not None:
            ib, xb, lb = buffers
            problems.check(
                ib.numel() == bs + 1, f"batch size {bs} differs from the {ib.numel() - 1} of the CUDA-graph buffers"
            )
            problems.check(
                indices.numel() <= xb.numel(),
                f"{indices.numel()} page indices exceed the CUDA-graph buffer of {xb.numel()}",
            )
        if problems:
            return
        if (
            adopt
        ):  # fast_decode_plan: run() reads these very tensors (a graph's static buffers, as the caller left them)
            self.indptr, self.indices, self.last = indptr, indices, last_page_len
        elif buffers is not None:  # plan() fills the static buffers in place; run() reads them
            ib, xb, lb = buffers
            ib.copy_(indptr)
            xb[: indices.numel()].copy_(indices)
            lb.copy_(last_page_len)
            self.indptr, self.indices, self.last = ib, xb, lb
        else:
            self.indptr, self.indices, self.last = indptr.clone(), indices.clone(), last_page_len.clone()
        self.page_size = page_size

    def pages(self) -> list[int]:
        return (self.indptr[1:] - self.indptr[:-1]).tolist()

    def kv_lens(self) -> list[int]:
        return [
            max(n - 1, 0) * self.page_size + int(last) if n else 0 for n, last in zip(self.pages(), self.last.tolist())
        ]

    def request_kv(self, b: int, cache: torch.Tensor) -> torch.Tensor:
        pages = self.indices[int(self.indptr[b]) : int(self.indptr[b + 1])].long()
        if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= cache.shape[0]):
            raise ValueError(
                f"request {b} reads pages {pages.tolist()[:8]} outside the cache of {cache.shape[0]} pages"
            )
        return cache[pages.to(cache.device)].flatten(0, 1)[: self.kv_lens()[b]]


def _check_caches(paged_kv_cache, planned: dict, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(paged_kv_cache, tuple) and len(paged_kv_cache) == 2):
        raise ValueError("paged_kv_cache must be a (k_cache, v_cache) tuple in the NHD layout")
    k, v = paged_kv_cache
    problems = _Problems()
    for name, t in (("k_cache", k), ("v_cache", v)):
        problems.check(
            t.dim() == 4 and t.shape[1] == page_size and t.shape[2] == planned["num_kv_heads"],
            f"{name} must be [pages, {page_size}, {planned['num_kv_heads']}, head_dim], got {tuple(t.shape)}",
        )
        problems.check(t.dtype == planned["kv_data_type"], f"{name} is {t.dtype}, planned {planned['kv_data_type']}")
    problems.raise_any("run")
    return k, v


def _check_q(q: torch.Tensor, tokens: int, planned: dict) -> None:
    problems = _Problems()
    problems.check(
        tuple(q.shape[:2]) == (tokens, planned["num_qo_heads"]),
        f"q must be [{tokens}, {planned['num_qo_heads']}, head_dim], got {tuple(q.shape)}",
    )
    problems.check(q.dtype == planned["q_data_type"], f"q is {q.dtype}, planned {planned['q_data_type']}")
    problems.raise_any("run")


def _lse2(lse: torch.Tensor) -> torch.Tensor:
    return lse / math.log(2)


class _Wrapper:
    def __init__(self, float_workspace_buffer, kv_layout="NHD", use_cuda_graph=False, backend="auto", **buffers):
        problems = _Problems()
        problems.check(kv_layout == "NHD", f"kv_layout {kv_layout!r}: the stand-in models NHD only")
        problems.check(backend in FAMILIES, f"backend {backend!r} is not one of {FAMILIES}")
        if use_cuda_graph:
            missing = [name for name, buf in buffers.items() if buf is None and name in self.GRAPH_BUFFERS]
            problems.check(not missing, f"use_cuda_graph needs the static buffers {missing}")
        problems.raise_any(type(self).__name__)
        self.backend, self.use_cuda_graph, self.buffers = backend, use_cuda_graph, buffers
        self.planned: dict | None = None
        self.plans = 0

    def _run_state(self, name: str):
        if self.planned is None:
            raise ValueError(f"{type(self).__name__}.run before plan()")
        RECORDER.launch(f"{type(self).__name__}.run", wrapper=id(self), **self._launch_args())
        return self.planned

    def _launch_args(self) -> dict:
        """The metadata tensors the kernel reads: a graph wrapper's static buffers, else plan()'s own copies."""
        p = self.planned
        kv = {"indptr": p["kv"].indptr, "indices": p["kv"].indices, "last": p["kv"].last} if "kv" in p else {}
        mask = p.get("custom_mask")  # a graph's mask mode is captured: a replay planned without its mask differs here
        masked = {
            "custom_mask": "none"
            if mask is None
            else (mask.buf, mask.indptr)
            if isinstance(mask, _GraphMask)
            else "eager"
        }
        return {**kv, **masked, **{name: p[name] for name in ("qo_indptr", "kv_indptr") if name in p}}


class BatchDecodeWithPagedKVCacheWrapper(_Wrapper):
    GRAPH_BUFFERS = ("paged_kv_indptr_buffer", "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer")

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        use_tensor_cores=False,
        paged_kv_indptr_buffer=None,
        paged_kv_indices_buffer=None,
        paged_kv_last_page_len_buffer=None,
        backend="auto",
        jit_args=None,
    ):
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            backend,
            paged_kv_indptr_buffer=paged_kv_indptr_buffer,
            paged_kv_indices_buffer=paged_kv_indices_buffer,
            paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer,
        )
        self.use_tensor_cores = use_tensor_cores

    def plan(
        self,
        indptr,
        indices,
        last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim,
        page_size,
        pos_encoding_mode="NONE",
        window_left=-1,
        logits_soft_cap=None,
        q_data_type="float16",
        kv_data_type=None,
        data_type=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        non_blocking=True,
        block_tables=None,
        seq_lens=None,
        fixed_split_size=None,
        disable_split_kv=False,
    ):
        problems = _Problems()
        _check_common(problems, num_qo_heads, num_kv_heads, window_left, logits_soft_cap, fixed_split_size)
        buffers = tuple(self.buffers[n] for n in self.GRAPH_BUFFERS) if self.use_cuda_graph else None
        kv = _PagedKv(problems, indptr, indices, last_page_len, page_size, buffers)
        problems.raise_any("BatchDecodeWithPagedKVCacheWrapper.plan")
        pages = kv.pages()
        self.planned = dict(
            kv=kv,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            page_size=page_size,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap or 0.0,
            q_data_type=q_data_type,
            kv_data_type=kv_data_type or q_data_type,
            sm_scale=sm_scale if sm_scale is not None else head_dim**-0.5,
            fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv,
            chunk_pages=_split_chunk(
                pages,
                fixed_split_size=fixed_split_size,
                disable_split_kv=disable_split_kv,
                heads=num_kv_heads,
                min_chunk=-(-MIN_CHUNK_TOKENS // page_size),
            ),
        )
        self.plans += 1

    def run(self, q, paged_kv_cache, *, return_lse=False, **_):
        p = self._run_state("run")
        kv = p["kv"]
        bs = kv.indptr.numel() - 1
        scheduled = p.get("scheduled_indptr")  # fast_decode_plan scheduled the split-KV work from a host indptr
        if scheduled is not None and not torch.equal(scheduled, kv.indptr):
            raise ValueError(
                f"run: kv_indptr {kv.indptr.tolist()[:8]} is not the indptr fast_decode_plan scheduled "
                f"({scheduled.tolist()[:8]}): the kernel would read outside its work items"
            )
        _check_q(q, bs, p)
        k_cache, v_cache = _check_caches(paged_kv_cache, p, p["page_size"])
        chunk = p["chunk_pages"] * p["page_size"] if p["chunk_pages"] else None
        outs, lses = [], []
        for b in range(bs):
            k, v = kv.request_kv(b, k_cache), kv.request_kv(b, v_cache)
            mask = request_mask(1, k.shape[0], causal=False, window_left=p["window_left"])
            o, lse = attend(
                q[b : b + 1],
                k,
                v,
                mask,
                scale=p["sm_scale"],
                out_dtype=q.dtype,
                chunk=chunk,
                softcap=p["logits_soft_cap"],
            )
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs) if outs else q.new_empty(0, q.shape[1], v_cache.shape[-1])
        return (out, _lse2(torch.cat(lses))) if return_lse else out


def fast_decode_plan(
    self,
    indptr,
    indices,
    last_page_len,
    num_qo_heads,
    num_kv_heads,
    head_dim,
    page_size,
    pos_encoding_mode="NONE",
    window_left=-1,
    logits_soft_cap=None,
    q_data_type=None,
    kv_data_type=None,
    data_type=None,
    sm_scale=None,
    rope_scale=None,
    rope_theta=None,
    non_blocking=True,
    fixed_split_size=None,
    disable_split_kv=False,
    q_len_per_req=1,
    global_override_indptr_cpu=None,
):
    """``flashinfer.fast_decode_plan``: re-plans a decode wrapper ``self`` that plan() planned before. It reuses the
    kernel module that plan() chose (FlashInfer checks nothing: other dtypes, head_dim, a window or a soft-cap where
    there was none would run the wrong module, so the stand-in refuses them) and copies nothing: a CUDA-graph wrapper's
    run() reads its static buffers as the caller left them, an eager one the tensors given. The split-KV work is
    scheduled from the host indptr (``global_override_indptr_cpu``, else ``indptr``); a run() whose kv_indptr differs
    from it raises (the real kernel would read outside its work items)."""
    problems = _Problems()
    p = self.planned
    if p is None:
        raise ValueError("fast_decode_plan before plan(): it reuses the kernel module plan() built")
    q_dtype = q_data_type or data_type or "float16"
    module = (q_dtype, kv_data_type or data_type or q_dtype, head_dim, window_left >= 0, bool(logits_soft_cap))
    planned = (p["q_data_type"], p["kv_data_type"], p["head_dim"], p["window_left"] >= 0, p["logits_soft_cap"] > 0)
    problems.check(
        module == planned,
        f"(q dtype, kv dtype, head_dim, window, soft-cap) {module} differ from the {planned} "
        "of the plan() whose kernel module fast_decode_plan reuses",
    )
    problems.check(q_len_per_req == 1, "q_len_per_req > 1 is not modelled")
    _check_common(problems, num_qo_heads, num_kv_heads, window_left, logits_soft_cap, fixed_split_size)
    scheduled = (
        global_override_indptr_cpu if global_override_indptr_cpu is not None else indptr
    ).clone()  # host tensors on CPU
    if self.use_cuda_graph:
        ib, xb, lb = (self.buffers[n] for n in self.GRAPH_BUFFERS)
        problems.check(
            last_page_len.numel() == ib.numel() - 1,
            f"batch size {last_page_len.numel()} differs from the {ib.numel() - 1} of the CUDA-graph buffers",
        )
        problems.check(
            indices.numel() <= xb.numel(),
            f"{indices.numel()} page indices exceed the CUDA-graph buffer of {xb.numel()}",
        )
        kv = _PagedKv(problems, ib, xb, lb, page_size, adopt=True)
    else:
        kv = _PagedKv(problems, indptr, indices, last_page_len, page_size, adopt=True)
    problems.raise_any("fast_decode_plan")
    pages = (scheduled[1:] - scheduled[:-1]).tolist()
    self.planned = p | dict(
        kv=kv,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        page_size=page_size,
        window_left=window_left,
        logits_soft_cap=logits_soft_cap or 0.0,
        sm_scale=sm_scale if sm_scale is not None else head_dim**-0.5,
        fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv,
        scheduled_indptr=scheduled,
        chunk_pages=_split_chunk(
            pages,
            fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv,
            heads=num_kv_heads,
            min_chunk=-(-MIN_CHUNK_TOKENS // page_size),
        ),
    )


# (qk, vo) pairs FlashInfer's prefill kernels run, fa2 and fa3 alike (measured on an H100: head dim 32 raises
# "Invalid configuration", 80 reads out of bounds)
PREFILL_HEAD_DIMS = {(64, 64), (128, 128), (256, 256), (192, 128)}


def _check_family(
    problems: _Problems, backend: str, head_dim_qk: int, head_dim_vo: int | None, kv_data_type=None
) -> None:
    pair = (head_dim_qk, head_dim_vo or head_dim_qk)
    problems.check(pair in PREFILL_HEAD_DIMS, f"no prefill kernel runs head dims {pair} (64, 128, 256; MLA's 192/128)")
    # FlashInfer 0.7.2 on an H100: the SM90 prefill module for 16-bit queries over an FP8 cache fails to compile
    # ("MajorB must be GMMA::Major::K", prefill_sm90.cuh), so no fa3 plan reads an FP8 cache
    problems.check(
        backend != "fa3" or kv_data_type not in (torch.float8_e4m3fn, torch.float8_e5m2),
        f"the fa3 kernel family builds no prefill for a {kv_data_type} KV cache (plan it on fa2)",
    )


def _check_custom_mask(problems: _Problems, custom_mask, qo_lens: list[int], kv_lens: list[int], backend: str) -> None:
    if custom_mask is None:
        return
    problems.check(backend != "fa3", "the fa3 kernel family takes no custom mask (plan such batches on fa2)")
    need = sum(q * k for q, k in zip(qo_lens, kv_lens))
    problems.check(
        custom_mask.dtype == torch.bool and custom_mask.numel() == need,
        f"custom_mask must be {need} bools (sum of qo_len * kv_len), got {custom_mask.dtype} {custom_mask.numel()}",
    )


def _packed_bytes(qo_lens: list[int], kv_lens: list[int]) -> list[int]:
    """Bytes of each request's mask packed by FlashInfer's segment_packbits (one segment per request, whole bytes)."""
    return [-(-q * k // 8) for q, k in zip(qo_lens, kv_lens)]


def _check_graph_mask_buffers(problems: _Problems, buffers: dict, qo_lens: list[int], kv_lens: list[int]) -> None:
    """As FlashInfer's plan() in CUDA-graph mode: a custom mask needs the static mask buffers, large enough."""
    mask_buf, indptr_buf = buffers.get("custom_mask_buf"), buffers.get("mask_indptr_buf")
    if not torch.is_tensor(mask_buf) or not torch.is_tensor(indptr_buf):
        problems.append(
            "custom_mask_buf and mask_indptr_buf must be initialized with a torch.Tensor in cuda graph mode "
            "if we use custom mask in attention computation"
        )
        return
    need = sum(_packed_bytes(qo_lens, kv_lens))
    problems.check(
        mask_buf.dtype == torch.uint8 and mask_buf.numel() >= need,
        f"custom_mask_buf must hold {need} uint8 bytes, got {mask_buf.dtype} {mask_buf.numel()}",
    )
    problems.check(
        indptr_buf.dtype == torch.int32 and indptr_buf.numel() == len(qo_lens) + 1,
        f"mask_indptr_buf must be {len(qo_lens) + 1} int32 values, got {indptr_buf.dtype} {indptr_buf.numel()}",
    )


class _GraphMask:
    """A graph wrapper's custom mask: packed little-endian per request into ``custom_mask_buf`` (``mask_indptr_buf``
    in bytes), unpacked again when the kernel runs, so a replay reads what the last plan() wrote there."""

    def __init__(self, buffers: dict, mask: torch.Tensor, qo_lens: list[int], kv_lens: list[int]):
        self.buf, self.indptr = buffers["custom_mask_buf"], buffers["mask_indptr_buf"]
        self.sizes = [q * k for q, k in zip(qo_lens, kv_lens)]
        nbytes = _packed_bytes(qo_lens, kv_lens)
        self.indptr.copy_(torch.tensor([0, *itertools.accumulate(nbytes)], dtype=torch.int32))
        bits, offset = mask.cpu().to(torch.uint8), 0
        weights = torch.tensor([1 << i for i in range(8)], dtype=torch.int32)  # little-endian bit order
        for r, (size, n) in enumerate(zip(self.sizes, nbytes)):
            seg = torch.zeros(n * 8, dtype=torch.uint8)
            seg[:size] = bits[offset : offset + size]
            packed = (seg.view(n, 8).to(torch.int32) * weights).sum(dim=1).to(torch.uint8)
            self.buf[int(self.indptr[r]) : int(self.indptr[r + 1])].copy_(packed)
            offset += size

    def clone(self) -> "_GraphMask":
        return self

    def __getitem__(self, rows: slice) -> torch.Tensor:
        """The unpacked mask entries ``rows`` (request segments are contiguous in the flattened order)."""
        parts = []
        for r, size in enumerate(self.sizes):
            packed = self.buf[int(self.indptr[r]) : int(self.indptr[r + 1])].cpu().to(torch.int32)
            parts.append(((packed[:, None] >> torch.arange(8)) & 1).flatten()[:size].bool())
        return torch.cat(parts)[rows] if parts else torch.zeros(0, dtype=torch.bool)


def _prefill_masks(p: dict, qo_lens: list[int], kv_lens: list[int]) -> list[torch.Tensor]:
    masks, offset = [], 0
    for lq, lk in zip(qo_lens, kv_lens):
        if (
            p["custom_mask"] is not None
        ):  # FlashInfer applies window_left beside a custom mask (DefaultAttention's LogitsMask)
            custom = p["custom_mask"][offset : offset + lq * lk].view(lq, lk).cpu()
            masks.append(custom & request_mask(lq, lk, causal=False, window_left=p["window_left"]))
            offset += lq * lk
        else:
            masks.append(request_mask(lq, lk, causal=p["causal"], window_left=p["window_left"]))
    return masks


def _prefill_tiles(qo_lens: list[int], group: int) -> list[int]:
    return [max(-(-lq * group // 128), 1) for lq in qo_lens]


class BatchPrefillWithPagedKVCacheWrapper(_Wrapper):
    GRAPH_BUFFERS = ("qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf", "paged_kv_last_page_len_buf")

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        paged_kv_indptr_buf=None,
        paged_kv_indices_buf=None,
        paged_kv_last_page_len_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
    ):
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            backend,
            qo_indptr_buf=qo_indptr_buf,
            paged_kv_indptr_buf=paged_kv_indptr_buf,
            paged_kv_indices_buf=paged_kv_indices_buf,
            paged_kv_last_page_len_buf=paged_kv_last_page_len_buf,
            custom_mask_buf=custom_mask_buf,
            mask_indptr_buf=mask_indptr_buf,
        )

    def plan(
        self,
        qo_indptr,
        paged_kv_indptr,
        paged_kv_indices,
        paged_kv_last_page_len,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        page_size,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        sm_scale=None,
        window_left=-1,
        logits_soft_cap=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        fixed_split_size=None,
        disable_split_kv=False,
        **_,
    ):
        problems = _Problems()
        _check_common(problems, num_qo_heads, num_kv_heads, window_left, logits_soft_cap, fixed_split_size)
        _check_family(problems, self.backend, head_dim_qk, head_dim_vo, kv_data_type)
        _check_indptr(problems, "qo_indptr", qo_indptr, paged_kv_indptr.numel() - 1)
        graph = self.use_cuda_graph
        buffers = tuple(self.buffers[n] for n in self.GRAPH_BUFFERS[1:]) if graph else None
        kv = _PagedKv(problems, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, page_size, buffers)
        if graph:
            problems.check(
                self.buffers["qo_indptr_buf"].numel() == qo_indptr.numel(),
                f"batch size {qo_indptr.numel() - 1} differs from the CUDA-graph buffers'",
            )
        if problems:
            problems.raise_any("BatchPrefillWithPagedKVCacheWrapper.plan")
        qo_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist()
        _check_custom_mask(problems, custom_mask, qo_lens, kv.kv_lens(), self.backend)
        if graph and custom_mask is not None:
            _check_graph_mask_buffers(problems, self.buffers, qo_lens, kv.kv_lens())
        problems.raise_any("BatchPrefillWithPagedKVCacheWrapper.plan")
        qo = self.buffers["qo_indptr_buf"].copy_(qo_indptr) if graph else qo_indptr.clone()
        if (
            graph and custom_mask is not None
        ):  # packed into the static buffers, which run() unpacks, as a replay reads them
            custom_mask = _GraphMask(self.buffers, custom_mask, qo_lens, kv.kv_lens())
        self.planned = dict(
            kv=kv,
            qo_indptr=qo,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            page_size=page_size,
            causal=causal,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap or 0.0,
            custom_mask=None if custom_mask is None else custom_mask.clone(),
            q_data_type=q_data_type,
            kv_data_type=kv_data_type or q_data_type,
            sm_scale=sm_scale if sm_scale is not None else head_dim_qk**-0.5,
            fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv,
            chunk_pages=_split_chunk(
                kv.pages(),
                fixed_split_size=fixed_split_size,
                disable_split_kv=disable_split_kv,
                heads=num_kv_heads,
                min_chunk=-(-MIN_CHUNK_TOKENS // page_size),
                tiles=_prefill_tiles(qo_lens, num_qo_heads // num_kv_heads),
            ),
        )
        self.plans += 1

    def run(self, q, paged_kv_cache, *, return_lse=False, **_):
        p = self._run_state("run")
        kv, qo = p["kv"], p["qo_indptr"]
        _check_q(q, int(qo[-1]), p)
        k_cache, v_cache = _check_caches(paged_kv_cache, p, p["page_size"])
        qo_lens, kv_lens = (qo[1:] - qo[:-1]).tolist(), kv.kv_lens()
        chunk = p["chunk_pages"] * p["page_size"] if p["chunk_pages"] else None
        outs, lses = [], []
        for b, mask in enumerate(_prefill_masks(p, qo_lens, kv_lens)):
            rows = slice(int(qo[b]), int(qo[b + 1]))
            o, lse = attend(
                q[rows],
                kv.request_kv(b, k_cache),
                kv.request_kv(b, v_cache),
                mask,
                scale=p["sm_scale"],
                out_dtype=q.dtype,
                chunk=chunk,
                softcap=p["logits_soft_cap"],
            )
            if (
                kv_lens[b] == 0 and self.backend == "fa3"
            ):  # undefined: FlashInfer 0.7.2's fa3 returns finite garbage here
                o, lse = torch.full_like(o, float("nan")), torch.full_like(lse, float("nan"))
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs) if outs else q.new_empty(0, q.shape[1], v_cache.shape[-1])
        return (out, _lse2(torch.cat(lses))) if return_lse else out


class BatchPrefillWithRaggedKVCacheWrapper(_Wrapper):
    GRAPH_BUFFERS = ("qo_indptr_buf", "kv_indptr_buf")

    def __init__(
        self,
        float_workspace_buffer,
        kv_layout="NHD",
        use_cuda_graph=False,
        qo_indptr_buf=None,
        kv_indptr_buf=None,
        custom_mask_buf=None,
        mask_indptr_buf=None,
        backend="auto",
        jit_args=None,
    ):
        super().__init__(
            float_workspace_buffer,
            kv_layout,
            use_cuda_graph,
            backend,
            qo_indptr_buf=qo_indptr_buf,
            kv_indptr_buf=kv_indptr_buf,
        )

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        head_dim_vo=None,
        custom_mask=None,
        packed_custom_mask=None,
        causal=False,
        pos_encoding_mode="NONE",
        use_fp16_qk_reduction=False,
        window_left=-1,
        logits_soft_cap=None,
        sm_scale=None,
        rope_scale=None,
        rope_theta=None,
        q_data_type="float16",
        kv_data_type=None,
        o_data_type=None,
        non_blocking=True,
        fixed_split_size=None,
        disable_split_kv=False,
        **_,
    ):
        problems = _Problems()
        _check_common(problems, num_qo_heads, num_kv_heads, window_left, logits_soft_cap, fixed_split_size)
        _check_family(problems, self.backend, head_dim_qk, head_dim_vo)
        _check_indptr(problems, "qo_indptr", qo_indptr)
        _check_indptr(problems, "kv_indptr", kv_indptr, qo_indptr.numel() - 1)
        problems.raise_any("BatchPrefillWithRaggedKVCacheWrapper.plan")
        qo_lens, kv_lens = (qo_indptr[1:] - qo_indptr[:-1]).tolist(), (kv_indptr[1:] - kv_indptr[:-1]).tolist()
        _check_custom_mask(problems, custom_mask, qo_lens, kv_lens, self.backend)
        problems.raise_any("BatchPrefillWithRaggedKVCacheWrapper.plan")
        self.planned = dict(
            qo_indptr=qo_indptr.clone(),
            kv_indptr=kv_indptr.clone(),
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            causal=causal,
            window_left=window_left,
            logits_soft_cap=logits_soft_cap or 0.0,
            custom_mask=None if custom_mask is None else custom_mask.clone(),
            q_data_type=q_data_type,
            kv_data_type=kv_data_type or q_data_type,
            sm_scale=sm_scale if sm_scale is not None else head_dim_qk**-0.5,
            fixed_split_size=fixed_split_size,
            disable_split_kv=disable_split_kv,
            chunk=_split_chunk(
                kv_lens,
                fixed_split_size=fixed_split_size,
                disable_split_kv=disable_split_kv,
                heads=num_kv_heads,
                min_chunk=MIN_CHUNK_TOKENS,
                tiles=_prefill_tiles(qo_lens, num_qo_heads // num_kv_heads),
            ),
        )
        self.plans += 1

    def run(self, q, k, v, *, return_lse=False, **_):
        p = self._run_state("run")
        qo, kvp = p["qo_indptr"], p["kv_indptr"]
        _check_q(q, int(qo[-1]), p)
        problems = _Problems()
        for name, t in (("k", k), ("v", v)):
            problems.check(
                t.shape[0] == int(kvp[-1]) and t.shape[1] == p["num_kv_heads"],
                f"{name} must be [{int(kvp[-1])}, {p['num_kv_heads']}, head_dim], got {tuple(t.shape)}",
            )
            problems.check(t.dtype == p["kv_data_type"], f"{name} is {t.dtype}, planned {p['kv_data_type']}")
        problems.raise_any("BatchPrefillWithRaggedKVCacheWrapper.run")
        qo_lens, kv_lens = (qo[1:] - qo[:-1]).tolist(), (kvp[1:] - kvp[:-1]).tolist()
        outs, lses = [], []
        for b, mask in enumerate(_prefill_masks(p, qo_lens, kv_lens)):
            rows, keys = slice(int(qo[b]), int(qo[b + 1])), slice(int(kvp[b]), int(kvp[b + 1]))
            o, lse = attend(
                q[rows],
                k[keys],
                v[keys],
                mask,
                scale=p["sm_scale"],
                out_dtype=q.dtype,
                chunk=p["chunk"],
                softcap=p["logits_soft_cap"],
            )
            outs.append(o)
            lses.append(lse)
        out = torch.cat(outs) if outs else q.new_empty(0, q.shape[1], v.shape[-1])
        return (out, _lse2(torch.cat(lses))) if return_lse else out


def merge_state(v_a, s_a, v_b, s_b):
    """``v: [tokens, heads, dim]``, ``s: [tokens, heads]`` fp32 base-2 log-sum-exp -> the merged ``(v, s)``."""
    problems = _Problems()
    problems.check(
        v_a.shape == v_b.shape and s_a.shape == s_b.shape == v_a.shape[:2],
        f"states disagree: v {tuple(v_a.shape)} / {tuple(v_b.shape)}, s {tuple(s_a.shape)} / {tuple(s_b.shape)}",
    )
    problems.check(s_a.dtype == s_b.dtype == torch.float32, "s_a and s_b must be float32")
    problems.raise_any("merge_state")
    ln2 = math.log(2)
    total = torch.logaddexp(s_a * ln2, s_b * ln2)
    wa, wb = torch.exp(s_a * ln2 - total).nan_to_num(0.0), torch.exp(s_b * ln2 - total).nan_to_num(0.0)
    return (wa[..., None] * v_a.float() + wb[..., None] * v_b.float()).to(v_a.dtype), total / ln2


def merge_state_in_place(v, s, v_other, s_other, mask=None) -> None:
    """Merge ``(v_other, s_other)`` into ``(v, s)`` in place; ``mask: [tokens]`` bool, rows left as they are where False."""
    merged_v, merged_s = merge_state(v, s, v_other, s_other)
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape != v.shape[:1]:
            raise ValueError(
                f"merge_state_in_place: mask must be [{v.shape[0]}] bool, got {mask.dtype} {tuple(mask.shape)}"
            )
        keep = ~mask.to(v.device)
        merged_v[keep], merged_s[keep] = v[keep], s[keep]
    v.copy_(merged_v)
    s.copy_(merged_s)


# ---- MLA ----------------------------------------------------------------------------------------------


class BatchMLAPagedAttentionWrapper:
    """The MLA wrapper over the packed latent cache ``[pages, page_size, kv_lora_rank + qk_rope]``; absorbed,
    bottom-right causal. Graph mode: plan() fills the buffers given at construction, run() reads them."""

    def __init__(
        self,
        float_workspace_buffer,
        use_cuda_graph=False,
        qo_indptr=None,
        kv_indptr=None,
        kv_indices=None,
        kv_len_arr=None,
        backend="auto",
    ):
        if backend not in FAMILIES:
            raise ValueError(f"BatchMLAPagedAttentionWrapper: backend {backend!r} is not one of {FAMILIES}")
        self.backend, self.use_cuda_graph, self.plans = backend, use_cuda_graph, 0
        self.buffers = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)
        if use_cuda_graph and any(b is None for b in self.buffers.values()):
            raise ValueError(
                "BatchMLAPagedAttentionWrapper: use_cuda_graph needs qo_indptr, kv_indptr, kv_indices and kv_len_arr buffers"
            )
        self.m = None

    def plan(
        self,
        *,
        metadata,
        num_heads,
        head_dim_ckv,
        head_dim_kpe,
        page_size,
        causal,
        sm_scale,
        q_data_type,
        kv_data_type,
        query_layout="packed",
        kv_cache_layout="packed",
    ):
        m, problems = metadata, _Problems()
        _check_indptr(problems, "qo_indptr", m.qo_indptr)
        _check_indptr(problems, "kv_indptr", m.kv_indptr, m.qo_indptr.numel() - 1)
        problems.check(
            (head_dim_ckv, head_dim_kpe) == (512, 64),
            f"head dims ({head_dim_ckv}, {head_dim_kpe}): the kernels run (512, 64)",
        )
        problems.check(query_layout == kv_cache_layout == "packed", "the backend plans the packed layouts")
        if not problems:
            pages = m.kv_indptr[1:] - m.kv_indptr[:-1]
            kv_len = m.kv_len_arr.long()
            problems.check(
                bool(((kv_len > (pages - 1) * page_size) & (kv_len <= pages * page_size)).all()),
                f"kv_len_arr {kv_len.tolist()[:8]} outside the requests' pages",
            )
            problems.check(m.kv_indices.numel() >= int(m.kv_indptr[-1]), "kv_indices shorter than kv_indptr[-1]")
        problems.raise_any("BatchMLAPagedAttentionWrapper.plan")
        if self.use_cuda_graph:
            b = self.buffers
            if b["qo_indptr"].numel() != m.qo_indptr.numel() or b["kv_indices"].numel() < m.kv_indices.numel():
                raise ValueError("BatchMLAPagedAttentionWrapper.plan: the batch does not fit the CUDA-graph buffers")
            src, buf = (
                m.kv_indices,
                b["kv_indices"],
            )  # FlashInfer allows a view of the buffer itself, nothing else overlapping
            if (
                src.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
                and src.storage_offset() != buf.storage_offset()
            ):
                raise ValueError(
                    "BatchMLAPagedAttentionWrapper.plan: kv_indices overlaps the reserved kv_indices buffer; "
                    "only exact same-source/same-target reuse is allowed"
                )
            b["qo_indptr"].copy_(m.qo_indptr)
            b["kv_indptr"].copy_(m.kv_indptr)
            b["kv_indices"][: m.kv_indices.numel()].copy_(m.kv_indices)
            b["kv_len_arr"].copy_(m.kv_len_arr)
            m = types.SimpleNamespace(**b)
        else:
            m = types.SimpleNamespace(
                **{k: getattr(m, k).clone() for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr")}
            )
        self.m, self.page_size, self.heads, self.scale, self.rank = m, page_size, num_heads, sm_scale, head_dim_ckv
        self.q_dtype, self.plans = q_data_type, self.plans + 1

    def run(self, *, query, kv_cache):
        if self.m is None:
            raise ValueError("BatchMLAPagedAttentionWrapper.run before plan()")
        RECORDER.launch("BatchMLAPagedAttentionWrapper.run", wrapper=id(self), **vars(self.m))
        m, ps = self.m, self.page_size
        problems = _Problems()
        problems.check(
            query.shape[1] == self.heads and query.dtype == self.q_dtype, f"query {tuple(query.shape)} {query.dtype}"
        )
        problems.check(
            kv_cache.dim() == 3 and kv_cache.shape[1] == ps,
            f"kv_cache must be [pages, {ps}, latent], got {tuple(kv_cache.shape)}",
        )
        used = m.kv_indices[: int(m.kv_indptr[-1])]
        problems.check(
            not used.numel() or (int(used.min()) >= 0 and int(used.max()) < kv_cache.shape[0]),
            f"page indices outside the cache of {kv_cache.shape[0]} pages",
        )
        problems.raise_any("BatchMLAPagedAttentionWrapper.run")
        out = []
        for b in range(m.kv_len_arr.numel()):
            pages = m.kv_indices[int(m.kv_indptr[b]) : int(m.kv_indptr[b + 1])].long()
            rows = kv_cache[pages].flatten(0, 1)[: int(m.kv_len_arr[b])][:, None, :]
            q = query[int(m.qo_indptr[b]) : int(m.qo_indptr[b + 1])]
            o, _ = attend(
                q,
                rows,
                rows[..., : self.rank],
                request_mask(q.shape[0], rows.shape[0], causal=True),
                scale=self.scale,
                out_dtype=query.dtype,
            )
            out.append(o)
        return torch.cat(out)


def _csr(qo_indptr, kv_indptr, kv_indices, kv_len_arr):
    return types.SimpleNamespace(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len_arr=kv_len_arr)


def module() -> types.ModuleType:
    """A fresh ``flashinfer`` module object to put in ``sys.modules``."""
    fi = types.ModuleType("flashinfer")
    fi.__stand_in__ = True
    fi.BatchDecodeWithPagedKVCacheWrapper = BatchDecodeWithPagedKVCacheWrapper
    fi.BatchPrefillWithPagedKVCacheWrapper = BatchPrefillWithPagedKVCacheWrapper
    fi.BatchPrefillWithRaggedKVCacheWrapper = BatchPrefillWithRaggedKVCacheWrapper
    fi.fast_decode_plan = fast_decode_plan
    fi.merge_state = merge_state
    fi.merge_state_in_place = merge_state_in_place
    fi.mla = types.SimpleNamespace(
        BatchMLAPagedAttentionWrapper=BatchMLAPagedAttentionWrapper, MLAPlanMetadata=types.SimpleNamespace(csr=_csr)
    )
    return fi
