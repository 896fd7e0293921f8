"""The plain transformers path's kernel calls (:mod:`attngate.integrations.transformers_plain`) as operators of the
``attngate`` namespace, each with a fake (meta) implementation: to torch.compile each is one opaque op of the graph (as
vLLM registers its attention), so a compiled model keeps one graph around it, and a kernel package's Python, which no
graph can hold, runs at call time. An op that needs its layer's decisions takes the layer by its stable name, as vLLM's
``unified_attention`` takes ``layer_name`` (:func:`attngate.integrations.transformers_context.named`). What each passes
is decided from the Plan by the caller; where a decode step is split (:func:`decode_split_keys`: this path's own way
round flash_attn.cute having no split-KV on SM90) the pieces are sized to the GPU, or fixed where the plan fixes them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attngate.backends import fa_padded, varlen
from attngate.integrations.transformers_context import LayerDecisions, named
from attngate.integrations.transformers_rows import PaddedBatch, unpad

# Every op is defined on the dispatcher directly (one Python kernel for every device, no autograd: this path serves
# inference) rather than through torch.library.custom_op, whose Python wrappers (autograd_impl, backend_impl and their
# checks) cost host time at every layer of a compiled step (measured: bench/RESULTS.md, commit b1962ee).
_LIB = torch.library.Library("attngate", "FRAGMENT")


def _define(
    schema: str, kernel: Callable[..., Any], fake: Callable[..., Any], eager: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """Define one op of the ``attngate`` namespace on the dispatcher.

    Parameters
    ----------
    schema : str
        The op's schema, ``"name(Tensor q, ..., str layer_name, ...) -> Tensor"``.
    kernel : callable
        Its implementation on every device (``CompositeExplicitAutograd``: no autograd), taking the schema's arguments
        positionally.
    fake : callable
        Its meta implementation: empty outputs of the right shapes and dtypes, for torch.compile.
    eager : callable, optional
        What eager calls instead (default ``kernel``), say one returning None where the op must return a tensor.

    Returns
    -------
    callable
        The call: in a graph the op (``torch.ops.attngate.<name>.default``, one opaque node), in eager ``eager``
        itself, with no dispatcher's host cost.
    """
    name = schema.partition("(")[0]
    _LIB.define(schema)
    _LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"attngate::{name}", fake, lib=_LIB)
    op, eager = getattr(torch.ops.attngate, name).default, eager or kernel

    def call(*args: Any) -> Any:
        return (op if torch.compiler.is_compiling() else eager)(*args)

    call.__name__ = call.__qualname__ = name
    return call


def _kernel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    visible: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sinks: torch.Tensor | None,
    layer_name: str,
    kernel: str,
    scale: float,
) -> torch.Tensor:
    """``attngate::plain_kernel_attention``: the call on a GPU kernel over the batch unpadded into varlen rows (the
    varlen lengths read to the host here).

    Parameters
    ----------
    query : torch.Tensor
        ``[B, H, S, D]`` bf16/fp16.
    key, value : torch.Tensor
        ``[B, H_kv, S_kv, D]`` and ``[B, H_kv, S_kv, Dv]`` (transformers' cache included).
    visible : torch.Tensor
        ``[B, S, S_kv]`` bool: the keys each query sees as transformers masks it.
    attention_mask : torch.Tensor or None
        transformers' (``visible`` is made from it): it names the batch's layout, so every layer it reaches shares one
        unpadding.
    sinks : torch.Tensor or None
        ``[H]`` learned sink logits.
    layer_name : str
        The layer (:attr:`LayerDecisions.name`), whose decisions as kept give causality, window, soft-cap and rows.
    kernel : str
        ``"fa"`` (FA4's varlen kernel) or ``"flashinfer"`` (its ragged prefill wrapper).
    scale : float
        The softmax scale.

    Returns
    -------
    torch.Tensor
        ``[B, S, H, Dv]`` in the query's dtype, zeros at padding queries.
    """
    context, d = named(layer_name)
    batch = PaddedBatch(attention_mask, query.shape[0], query.shape[2], key.shape[2], query.device, context.masks)
    rows = unpad(query, key, value, visible, d, batch)
    cu_q, cu_k = rows.cu_seqlens
    common = dict(
        cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, scale=scale, causal=d.causal, window_left=d.window, softcap=d.logit_cap
    )
    if kernel == "fa":
        out, _ = varlen.fa4_varlen(
            rows.q,
            rows.k,
            rows.v,
            max_seqlen_q=int(rows.lens[0].max()),
            max_seqlen_k=int(rows.lens[1].max()),
            sinks=sinks,
            **common,
        )
    else:
        if (
            sinks is not None
        ):  # the plan refuses FlashInfer for sinks (flashinfer.no-attention-sinks); a config edited since
            raise ValueError(
                "FlashInfer runs no learned attention sinks; configure() the model again with another attention_backend"
            )
        out = varlen.flashinfer_ragged(
            rows.q,
            rows.k,
            rows.v,
            lens=rows.lens,
            kernel_family=d.prefill_kernel_family,
            workspace_size_mb=d.workspace_size_mb,
            **common,
        )
    return rows.pad_back(out, query, value)


def _kernel_attention_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any) -> torch.Tensor:
    b, h, s, _ = query.shape
    return query.new_empty(b, s, h, value.shape[-1])


# the unpadding path (FlashInfer's ragged wrapper, and FA on cross-attention and chunked-local layers)
kernel_attention = _define(
    "plain_kernel_attention(Tensor query, Tensor key, Tensor value, Tensor visible, Tensor? attention_mask, "
    "Tensor? sinks, str layer_name, str kernel, float scale) -> Tensor",
    _kernel_attention,
    _kernel_attention_fake,
)

# A decode step on the padded FA path is split (attngate.backends.fa_padded.split_rows) where its query reads more than
# DECODE_SPLIT_KEYS keys: splitting costs host time (the query copied per piece, the states merged) that only long requests repay. Pieces
# are sized so the kernel's CTAs (one per row and KV head) fill the SMs, each of at least DECODE_MIN_PIECE_KEYS keys
# (shorter ones merge more than they save). GPU time of one call on an H100, 4 KV heads (bench/RESULTS.md): one 16k
# request 168 us unsplit, 20.5 us in 16 pieces of 1024 (sdpa's flash-decoding 13); 8 of them 169 us, 99 us in 4 pieces
DECODE_SPLIT_KEYS = 4096
DECODE_MIN_PIECE_KEYS = 1024


def decode_split_keys(d: LayerDecisions, b: int, h_kv: int, s_kv: int, device: torch.device) -> int | None:
    """Keys per piece of a decode step on the padded FA path, or None: unsplit.

    Parameters
    ----------
    d : LayerDecisions
        Its ``decode_split_keys`` (the plan's ``fa.decode_fixed_split_keys``): where set (deterministic inference),
        every step is split at those fixed points of each request, so a request's result never depends on its batch.
    b, h_kv, s_kv : int
        Requests, KV heads and padded keys per request (of which a window layer's query reads its window's).
    device : torch.device
        The queries' device; on a GPU pieces are sized to its SM count (:func:`_sm_count`), elsewhere (the CPU
        stand-ins) and for a length traced symbolically they are DECODE_SPLIT_KEYS keys.

    Returns
    -------
    int or None
        Keys per piece; None where a query reads at most DECODE_SPLIT_KEYS keys, or the batch's rows fill the GPU
        unsplit.
    """
    if d.decode_split_keys is not None:
        return d.decode_split_keys
    span = fa_padded.decode_span(s_kv, d.window)  # a window reads its last keys alone
    if span <= DECODE_SPLIT_KEYS:
        return None
    sms = _sm_count(device) if isinstance(span, int) else None
    if sms is None:
        return DECODE_SPLIT_KEYS
    pieces = sms // (b * h_kv)
    if pieces < 2:  # the batch's rows fill the SMs alone
        return None
    split = max(DECODE_MIN_PIECE_KEYS, -(-span // pieces))
    return split if split < span else None


def _sm_count(device: torch.device) -> int | None:
    """The SMs of a CUDA device (a constant to torch.compile, which reads the device's properties itself), None
    elsewhere. Eager, kept per device: ``get_device_properties`` costs a few µs of host time a call."""
    if device.type != "cuda":
        return None
    if torch.compiler.is_compiling():
        return torch.cuda.get_device_properties(device).multi_processor_count
    index = device.index if device.index is not None else torch.cuda.current_device()
    count = _SM_COUNTS.get(index)
    if count is None:
        count = _SM_COUNTS[index] = torch.cuda.get_device_properties(index).multi_processor_count
    return count


_SM_COUNTS: dict[int, int] = {}


def reads_in_place(batch: PaddedBatch, causal: bool) -> bool:
    """Whether :func:`fa_in_place` reads this batch: where each request's valid queries and keys are one run each
    (left padding, a right-padded prompt's own forward). Eager: one host read per mask; a decode step after right
    padding (the prompt, its padding, then what it generated) goes to the unpadding path instead. In a graph
    (torch.compile, CUDA-graph capture), which cannot read the host, always True: see :func:`fa_in_place`."""
    if batch.mask is None or _in_graph(batch.mask):
        return True
    return _host_layout(batch, causal)[0]


def _host_layout(batch: PaddedBatch, causal: bool) -> tuple[bool, bool]:
    """Eager, one host read per mask (kept): whether every request's valid queries and keys are one run each, and
    whether every padded query position is a valid query."""

    def make() -> tuple[bool, bool]:
        q_start, q_end, _, _ = batch.extents(causal)
        one_run, full = torch.stack([batch.one_run(causal).all(), (q_end - q_start == batch.s).all()]).tolist()
        return bool(one_run), bool(full)

    return batch.kept(("layout", batch.b, batch.s, batch.s_kv, batch.device, causal), make)


def _in_graph(t: torch.Tensor) -> bool:
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def fa_in_place(
    d: LayerDecisions,
    batch: PaddedBatch,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    sinks: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """FA4 over transformers' padded batch and cache in place (attngate.backends.fa_padded). The metadata is device
    tensors found once per mask (eager) or computed in the graph (compiled); the kernel call is one op. In a graph, a
    request whose valid keys are not one run (:func:`reads_in_place`) comes out NaN, never silently wrong: left-pad a
    compiled model's batch, as transformers asks of decoder-only models.

    Parameters
    ----------
    d : LayerDecisions
        The layer's causality, window and soft-cap.
    batch : PaddedBatch
        The call's mask and shapes, with its model's findings.
    query : torch.Tensor
        ``[B, H, S, D]`` bf16/fp16.
    key, value : torch.Tensor
        ``[B, H_kv, S_kv, D]`` and ``[B, H_kv, S_kv, Dv]``, read in place (transformers' DynamicCache or static cache).
    sinks : torch.Tensor or None
        ``[H]`` learned sink logits.
    scale : float
        The softmax scale.

    Returns
    -------
    torch.Tensor
        ``[B, S, H, Dv]`` in the query's dtype, zeros at padding queries.
    """
    b, h, s, dq = query.shape
    s_kv = key.shape[2]
    # [B * S, H, D]: one view where S is 1 (a decode step), else transformers' transposed projection as it lies
    q = query.reshape(b, h, dq) if s == 1 else query.transpose(1, 2).reshape(b * s, h, dq)
    k, v, k_row = fa_padded.same_layout(key, value)
    extents = batch.extents(d.causal)
    split = decode_split_keys(d, b, k.shape[1], s_kv, query.device) if s == 1 else None
    if split is not None:
        cu_q, cu_k, used_k, pieces, valid = batch.kept(  # by every value they are made from (extents: causality)
            ("fa split", b, s_kv, k_row, d.causal, d.window, split, query.device),
            lambda: (*fa_padded.split_rows(extents, k_row, s_kv, d.window, split), fa_padded.valid_queries(extents, 1)),
        )
        q_rows = q[:, None].expand(b, pieces, h, dq).reshape(b * pieces, h, dq)
        out, lse = fa_varlen(
            q_rows, k, v, cu_q, cu_k, None, used_k, 1, split, None, scale, False, -1, d.logit_cap, True
        )
        merged = fa_padded.merge_split(out, lse, pieces, sinks)
        if not _every_query_valid(batch, d.causal):  # a padding query's row holds its piece rows' merge
            merged = fa_padded.zero_padding(merged, valid)
        return _unless_one_run(merged, d, batch, query)
    cu_q, cu_k, used_q, used_k, valid = batch.kept(
        ("fa rows", b, s, s_kv, k_row, d.causal, query.device),
        lambda: (*fa_padded.rows(extents, s, k_row), fa_padded.valid_queries(extents, s)),
    )
    window = -1 if d.window is None else d.window
    out, _ = fa_varlen(
        q, k, v, cu_q, cu_k, used_q, used_k, s, s_kv, sinks, scale, d.causal, window, d.logit_cap, False
    )  # fmt: skip
    out = out.view(b, s, h, -1)
    if not _every_query_valid(batch, d.causal):  # rows the kernel did not write hold whatever was there
        out = fa_padded.zero_padding(out, valid)
    return _unless_one_run(out, d, batch, query)


def _every_query_valid(batch: PaddedBatch, causal: bool) -> bool:
    """Whether every padded query position is a valid query (nothing to zero): without a mask, true; eager, as
    :func:`_host_layout` finds it; in a graph, which cannot look, False (the graph zeroes on the device)."""
    if batch.mask is None:
        return True
    return False if _in_graph(batch.mask) else _host_layout(batch, causal)[1]


def _unless_one_run(out: torch.Tensor, d: LayerDecisions, batch: PaddedBatch, query: torch.Tensor) -> torch.Tensor:
    """``out: [B, S, H, Dv]``, NaN for each request whose valid queries or keys are not one run, in a graph (where
    :func:`reads_in_place` could not send the batch elsewhere); as it is otherwise."""
    if batch.mask is None or not _in_graph(query):  # the mask first: _in_graph asks the CUDA driver
        return out
    return torch.where(batch.one_run(d.causal)[:, None, None, None], out, float("nan"))


def _fa_varlen_eager(
    q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, sinks, scale, causal, window_left, softcap, return_lse
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attngate.backends.varlen.fa4_varlen` over the padded batch in place (``q: [B * S, H, D]``, ``k``/``v``:
    transformers' ``[B, H_kv, S_kv, D]``, read through :func:`attngate.backends.fa_padded.token_rows`; ``window_left``
    -1: no window): ``(out [total_q, H, Dv], lse [H, total_q] fp32 or None without return_lse)``."""
    return varlen.fa4_varlen(
        q, fa_padded.token_rows(k)[0], fa_padded.token_rows(v)[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        seqused_q=used_q, seqused_k=used_k, max_seqlen_q=max_q, max_seqlen_k=max_k, scale=scale, causal=causal,
        window_left=None if window_left < 0 else window_left, softcap=softcap, sinks=sinks, return_lse=return_lse,
    )  # fmt: skip


def _fa_varlen_kernel(*args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's kernel: :func:`_fa_varlen_eager`, its lse ``[0]`` without return_lse (an op returns tensors)."""
    out, lse = _fa_varlen_eager(*args)
    return out, lse if lse is not None else out.new_empty(0, dtype=torch.float32)


def _fa_varlen_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
    lse_shape = (q.shape[1], q.shape[0]) if args[-1] else (0,)  # return_lse
    return q.new_empty(q.shape[0], q.shape[1], v.shape[-1]), q.new_empty(lse_shape, dtype=torch.float32)


# the padded FA path's kernel call, whose metadata and epilogues are traced torch ops around it
fa_varlen = _define(
    "fa_varlen(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, Tensor? seqused_q, "
    "Tensor seqused_k, SymInt max_seqlen_q, SymInt max_seqlen_k, Tensor? sinks, float scale, bool causal, "
    "int window_left, float softcap, bool return_lse) -> (Tensor, Tensor)",
    _fa_varlen_kernel,
    _fa_varlen_fake,
    eager=_fa_varlen_eager,
)
