"""The plain transformers path's kernel calls as torch custom ops (:mod:`attngate.integrations.transformers_plain`),
each with a fake (meta) implementation: to torch.compile each is one opaque op of the graph (as vLLM registers its
attention), so a compiled model keeps one graph around it, and a kernel package's Python, which no graph can hold,
runs at call time. What each passes is decided from the Plan by the caller, except where a decode step is split
(:data:`DECODE_SPLIT_KEYS`): this path's own way round flash_attn.cute having no split-KV on SM90, batch-invariant."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attngate.backends import fa_padded, varlen
from attngate.integrations.transformers_rows import (
    DECISIONS,
    LayerDecisions,
    one_run_each,
    padded_extents,
    per_mask,
    unpad,
)

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
        The op's schema, ``"name(Tensor q, ...) -> Tensor"``.
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
    module_id: int,
    kernel: str,
    scale: float,
) -> torch.Tensor:
    """The call on the GPU kernel ``kernel`` ("fa" or "flashinfer") for the attention module ``module_id`` (its
    decisions as kept), over the batch unpadded into varlen rows: ``[B, S, H, Dv]``, zeros at padding queries.
    ``attention_mask``, transformers' (``visible`` is made from it), names the batch's layout: every layer it reaches
    shares one unpadding."""
    d = DECISIONS[module_id]
    rows = unpad(query, key, value, visible, d, attention_mask)
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


# the unpadding path (FlashInfer's ragged wrapper, and FA on cross-attention and chunked-local layers): the varlen
# lengths are read to the host inside the op
kernel_attention = _define(
    "plain_kernel_attention(Tensor query, Tensor key, Tensor value, Tensor visible, Tensor? attention_mask, "
    "Tensor? sinks, int module_id, str kernel, float scale) -> Tensor",
    _kernel_attention,
    _kernel_attention_fake,
)

# keys per split of a decode step on the padded FA path (attngate.backends.fa_padded): 128 CTAs on an H100 for one
# 32k request with 4 KV heads; a fixed count, so a request's split points do not depend on its batch
DECODE_SPLIT_KEYS = 1024


def reads_in_place(attention_mask: torch.Tensor | None, b: int, s: int, s_kv: int, device, causal: bool) -> bool:
    """Whether :func:`fa_in_place` reads this batch: where each request's valid queries and keys are one run each
    (left padding, a right-padded prompt's own forward). Eager: one host read per mask; a decode step after right
    padding (the prompt, its padding, then what it generated) goes to the unpadding path instead. In a graph
    (torch.compile, CUDA-graph capture), which cannot read the host, always True: see :func:`fa_in_place`."""
    if attention_mask is None or _in_graph(attention_mask):
        return True
    return per_mask(
        attention_mask,
        ("in place", b, s, s_kv, device, causal),
        lambda: bool(one_run_each(attention_mask, b, s, s_kv, device, causal).all()),
    )


def _in_graph(t: torch.Tensor) -> bool:
    return torch.compiler.is_compiling() or (t.is_cuda and torch.cuda.is_current_stream_capturing())


def fa_in_place(
    d: LayerDecisions,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    sinks: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """FA4 over transformers' padded batch and cache in place (attngate.backends.fa_padded): ``query: [B, H, S, D]``,
    ``key``/``value: [B, H_kv, S_kv, D/Dv]`` -> ``[B, S, H, Dv]``, zeros at padding queries. The metadata is device
    tensors found once per mask (eager) or computed in the graph (compiled); the kernel call is one op. In a graph, a
    request whose valid keys are not one run (:func:`reads_in_place`) comes out NaN, never silently wrong: left-pad a
    compiled model's batch, as transformers asks of decoder-only models."""
    b, h, s, dq = query.shape
    s_kv = key.shape[2]
    q = query.transpose(1, 2)
    k, v, k_row = fa_padded.same_layout(key.transpose(1, 2), value.transpose(1, 2))
    extents = padded_extents(attention_mask, b, s, s_kv, query.device, d.causal)
    split = DECODE_SPLIT_KEYS
    if s == 1 and split and s_kv > split:
        cu_q, cu_k, used_k, pieces = per_mask(
            attention_mask,
            ("fa split", b, s_kv, k_row, d.window, split, query.device),
            lambda: fa_padded.split_rows(extents, k_row, s_kv, d.window, split),
        )
        q_rows = q.expand(b, pieces, h, dq).reshape(b * pieces, h, dq)
        out, lse = fa_varlen(
            q_rows, k, v, cu_q, cu_k, None, used_k, 1, split, None, scale, False, -1, d.logit_cap, True
        )
        return _unless_one_run(fa_padded.merge_split(out, lse, pieces, sinks, extents), d, query, s_kv, attention_mask)
    cu_q, cu_k, used_q, used_k, valid = per_mask(
        attention_mask,
        ("fa rows", b, s, s_kv, k_row, query.device),
        lambda: (*fa_padded.rows(extents, s, k_row), fa_padded.valid_queries(extents, s)),
    )
    window = -1 if d.window is None else d.window
    out, _ = fa_varlen(
        q.reshape(b * s, h, dq), k, v, cu_q, cu_k, used_q, used_k, s, s_kv, sinks, scale, d.causal, window,
        d.logit_cap, False,
    )  # fmt: skip
    return _unless_one_run(fa_padded.zero_padding(out.view(b, s, h, -1), valid), d, query, s_kv, attention_mask)


def _unless_one_run(
    out: torch.Tensor, d: LayerDecisions, query: torch.Tensor, s_kv: int, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """``out: [B, S, H, Dv]``, NaN for each request whose valid queries or keys are not one run, in a graph (where
    :func:`reads_in_place` could not send the batch elsewhere); as it is otherwise."""
    if not _in_graph(query) or attention_mask is None:
        return out
    b, _, s, _ = query.shape
    one_run = one_run_each(attention_mask, b, s, s_kv, query.device, d.causal)
    return torch.where(one_run[:, None, None, None], out, float("nan"))


def _fa_varlen_eager(
    q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, sinks, scale, causal, window_left, softcap, return_lse
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attngate.backends.varlen.fa4_varlen` over the padded batch in place (``window_left`` -1: no window):
    ``(out [total_q, H, Dv], lse [H, total_q] fp32 or None without return_lse)``."""
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
