"""The checks every backend shares, each listing every problem: a batch against the pool and the request table,
a CUDA-graph capture or replay against the plan, the layers and the KV pool against the plan, a speculative tree's
mask against the plan's verify mode."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BackendRefusal, BatchMetadataError, Problem, UsageError
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.schema import Plan


def tree_mask_of(
    plan: Plan, mode: ForwardMode, spec_tree_mask: torch.Tensor | None, new: Sequence[int]
) -> torch.Tensor | None:
    """``spec_tree_mask`` (a ForwardBatch's, or a CUDA-graph replay's) where the plan's ``mode`` verifies a speculative
    tree (``common.tree_mask``), None where its draft tokens attend causally. ``new``: each request's new tokens, on
    the host. BatchMetadataError listing every problem when the batch and the plan disagree (a tree under a chain
    plan, a tree plan without its mask: a graph captured for a tree would replay a stale one) or the mask does not fit
    (``[batch_size, D, D]`` bool, D new tokens in every request); host-side checks, no sync."""
    mask = spec_tree_mask
    if not plan.mode(mode).common.tree_mask:
        if mask is not None:
            raise BatchMetadataError(
                Problem(
                    "spec_tree_mask",
                    f"given, but the plan's {mode.value} attends causally "
                    "(common.tree_mask false: no speculative tree, speculative_eagle_topk <= 1)",
                    code="batch-metadata.tree-mask-unexpected",
                )
            )
        return None
    if mask is None:
        raise BatchMetadataError(
            Problem(
                "spec_tree_mask",
                f"missing: the plan's {mode.value} verifies a speculative tree "
                "(common.tree_mask), and a causal mask would mix its sibling branches",
                code="batch-metadata.tree-mask-missing",
            )
        )
    d = new[0] if len(new) else 0
    problems = []
    if any(n != d for n in new):
        problems.append(
            Problem(
                "extend_seq_lens",
                f"a tree verify has the same draft tokens in every request, got {list(new)[:8]}",
                code="batch-metadata.tree-draft-tokens",
            )
        )
    if mask.dtype != torch.bool or tuple(mask.shape) != (len(new), d, d):
        problems.append(
            Problem(
                "spec_tree_mask",
                f"must be [{len(new)}, {d}, {d}] bool, got {mask.dtype} {tuple(mask.shape)}",
                code="batch-metadata.tree-mask-shape",
            )
        )
    if problems:
        raise BatchMetadataError(problems)
    return mask


def check_batch(batch: ForwardBatch, req_to_token: torch.Tensor, num_slots: int) -> None:
    """Validate a batch against the pool and the request table; raise BatchMetadataError listing every problem.

    Shared by every backend's checked mode (costs host syncs; the reference backend always runs it).
    """
    problems: list[Problem] = []
    b = batch.batch_size
    for name in ("req_pool_indices", "seq_lens", "extend_prefix_lens", "extend_seq_lens"):
        if getattr(batch, name).shape[0] != b:
            problems.append(
                Problem(
                    name,
                    f"has {getattr(batch, name).shape[0]} entries for batch_size {b}",
                    code="batch-metadata.batch-size",
                )
            )
    if problems:
        raise BatchMetadataError(problems)
    seq_lens, prefix, ext = batch.seq_lens.cpu(), batch.extend_prefix_lens.cpu(), batch.extend_seq_lens.cpu()
    enc = batch.encoder_lens.cpu() if batch.encoder_lens is not None else torch.zeros_like(seq_lens)
    width = req_to_token.shape[1]
    if b and int(seq_lens.max()) > width:
        problems.append(
            Problem(
                "seq_lens",
                f"max {int(seq_lens.max())} exceeds the req_to_token width {width}",
                code="batch-metadata.seq-lens-too-long",
            )
        )
    rows = batch.req_pool_indices.cpu()
    if b and (int(rows.min()) < 0 or int(rows.max()) >= req_to_token.shape[0]):
        problems.append(
            Problem(
                "req_pool_indices",
                f"rows outside req_to_token's {req_to_token.shape[0]} rows",
                code="batch-metadata.rows-outside-table",
            )
        )
    host_copies = (
        ("seq_lens_cpu", batch.seq_lens_cpu, seq_lens),
        ("encoder_lens_cpu", batch.encoder_lens_cpu, enc),
        (
            "extend_seq_lens_cpu",
            None if batch.extend_seq_lens_cpu is None else torch.tensor(batch.extend_seq_lens_cpu),
            ext,
        ),
    )
    for name, copy, device_value in host_copies:  # backends size kernels from the host copies
        if copy is not None and copy.tolist() != device_value.tolist():
            problems.append(
                Problem(
                    name,
                    f"{copy.tolist()[:8]} differs from the device tensor {device_value.tolist()[:8]}",
                    code="batch-metadata.host-copy-differs",
                )
            )
    if not torch.equal(enc + prefix + ext, seq_lens):
        problems.append(
            Problem(
                "seq_lens",
                "must equal encoder_lens + extend_prefix_lens + extend_seq_lens (post-write lengths)",
                code="batch-metadata.seq-lens-sum",
            )
        )
    if int(ext.sum()) != batch.num_tokens:
        problems.append(
            Problem(
                "out_cache_loc",
                f"has {batch.num_tokens} slots for {int(ext.sum())} new tokens",
                code="batch-metadata.slot-count",
            )
        )
    for name, loc in (("out_cache_loc", batch.out_cache_loc), ("encoder_out_cache_loc", batch.encoder_out_cache_loc)):
        if loc is not None and loc.numel() and (int(loc.min()) < 0 or int(loc.max()) >= num_slots):
            bad = loc[(loc < 0) | (loc >= num_slots)][:4].tolist()
            problems.append(
                Problem(
                    name,
                    f"slot indices {bad} lie outside the pool of {num_slots} slots",
                    code="batch-metadata.slots-outside-pool",
                )
            )
    if not problems and b:
        used = torch.cat([req_to_token[int(r), : int(s)].cpu() for r, s in zip(rows, seq_lens)])
        if used.numel() and (int(used.min()) < 0 or int(used.max()) >= num_slots):
            problems.append(
                Problem(
                    "req_to_token",
                    f"rows of this batch hold slots outside the pool of {num_slots} slots",
                    code="batch-metadata.slots-outside-pool",
                )
            )
    if problems:
        raise BatchMetadataError(problems)


def check_graph_batch(
    backend: Any,  # the AttentionBackend replaying: its req_to_token and kv_pool
    bs: int,
    per_req: int,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    encoder_lens: torch.Tensor | None,
    forward_mode: ForwardMode,
    encoder_lens_cpu: torch.Tensor | None = None,
) -> None:
    """``check_batch`` for a CUDA-graph replay: ``per_req`` new tokens per request (their slots are in the
    graph's static buffers, so only lengths, rows and ``req_to_token`` are checked)."""
    new = torch.full_like(seq_lens, per_req)
    prefix = seq_lens - new - (encoder_lens if encoder_lens is not None else 0)
    no_slots = torch.zeros(bs * per_req, dtype=torch.int64, device=seq_lens.device)
    batch = ForwardBatch(
        forward_mode,
        bs,
        req_pool_indices,
        seq_lens,
        seq_lens_cpu,
        prefix,
        new,
        no_slots,
        encoder_lens,
        encoder_lens_cpu=encoder_lens_cpu,
    )
    check_batch(batch, backend.req_to_token, backend.kv_pool.num_slots)


def check_capture_mode(plan: Plan, bs: int, mode: ForwardMode, max_bs: int | None) -> None:
    """UsageError unless a backend may capture a CUDA graph of ``bs`` requests in ``mode``: the plan's
    ``capture_cuda_graph`` table is the one source; an IDLE batch replays the DECODE graph, padded to its batch
    size (:func:`attngate.backends.runtime.dp_padding.pad_decode_batch`, as SGLang does), so it has no graph of its own.
    ``max_bs``: what ``init_cuda_graph_state`` sized the static buffers for (None: it was not called); a larger
    batch would read slices of them shorter than itself."""
    if mode == ForwardMode.IDLE:
        raise UsageError(
            Problem(
                "forward_mode",
                "IDLE batches replay the DECODE graph padded to its batch size "
                "(attngate.backends.runtime.dp_padding.pad_decode_batch); capture DECODE",
                code="usage.cuda-graph-idle",
            )
        )
    if not plan.mode(mode).common.capture_cuda_graph:
        raise UsageError(
            Problem(
                "forward_mode",
                f"the plan captures no CUDA graph for forward mode {mode.value}",
                code="usage.cuda-graph-mode",
            )
        )
    if max_bs is None:
        raise UsageError(
            Problem(
                "init_cuda_graph_state",
                "not called: it sizes the static buffers a capture reads",
                code="usage.cuda-graph-uninitialised",
            )
        )
    if not 1 <= bs <= max_bs:
        raise UsageError(
            Problem(
                "bs",
                f"a CUDA graph serves 1 to {max_bs} requests (init_cuda_graph_state's max_bs), not {bs}",
                code="usage.cuda-graph-batch-size",
            )
        )


def captured_graph(graphs: dict, mode: ForwardMode, bs: int):
    """The graph state a backend captured for ``(mode, bs)``; UsageError naming what was captured when there is none
    (a replay of a batch size or mode never captured would otherwise read another graph's buffers)."""
    graph = graphs.get((mode, bs))
    if graph is None:
        have = (
            ", ".join(f"{m.value} x {n}" for m, n in sorted(graphs, key=lambda key: (key[0].value, key[1]))) or "none"
        )
        raise UsageError(
            Problem(
                "bs",
                f"no CUDA graph was captured for forward mode {mode.value} at batch size {bs} (captured: {have})",
                code="usage.cuda-graph-not-captured",
            )
        )
    return graph


def check_heads_per_rank(plan: Plan, layers: list[AttentionLayer]) -> None:
    """Under attention TP (``plan.common.attn_tp_size > 1``) every layer carries the plan's per-rank heads for its kind
    (``plan.heads_per_rank``; build the layers with ``layers_from_model(model, plan)``); BatchMetadataError naming each
    layer that does not."""
    tp = plan.common.attn_tp_size
    if tp == 1:
        return
    problems = [
        Problem(
            f"layer {lay.layer_id}",
            f"has {lay.num_q_heads}/{lay.num_kv_heads} query/KV heads; attention TP "
            f"{tp} gives each rank of its {lay.kind.value} layers {want[0]}/{want[1]}",
            code="batch-metadata.heads-per-rank",
        )
        for lay in layers
        if (lay.num_q_heads, lay.num_kv_heads) != (want := plan.heads_per_rank(lay.kind))
    ]
    if problems:
        raise BatchMetadataError(problems)


def check_served_layers(layers: list[AttentionLayer]) -> None:
    """Encoder-only layers beside cross-attention layers are an encoder-decoder model's encoder, which attends over
    the encoder input (Whisper's audio frames), not over a batch's tokens: a paged backend cannot serve them with the
    batch's metadata. BatchMetadataError naming them (build the layers with ``include_encoder=False``)."""
    if not any(lay.kind == LayerKind.CROSS_ATTENTION for lay in layers):
        return
    encoder = [lay.layer_id for lay in layers if lay.kind == LayerKind.ENCODER_ONLY]
    if encoder:
        raise BatchMetadataError(
            Problem(
                f"layers {', '.join(map(str, encoder))}",
                (
                    "an encoder-decoder model's encoder layers: they attend over the encoder input, outside the paged backend (SGLang's "
                    "Whisper runs them with SDPA); build the backend's layers with layers_from_model(..., include_encoder=False)"
                ),
                code="batch-metadata.encoder-layers",
            )
        )


#: The KV cache dtypes attngate's pools store, by ``kv_cache_dtype`` ("auto": the model's dtype). SGLang's FP4 and MXFP8
#: caches also carry per-block scale tensors, which no attngate pool or backend keeps.
KV_STORAGE_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def kv_storage_dtype(plan: Plan, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype a KV pool for this plan holds: ``common.kv_cache_dtype``, the model's for "auto". BackendRefusal
    for a dtype attngate does not store (nvfp4, fp4_e2m1, fp4_mx_block16, mxfp8)."""
    name = plan.common.kv_cache_dtype
    if name == "auto":
        return model_dtype
    if name not in KV_STORAGE_DTYPES:
        raise BackendRefusal(
            Problem(
                "common.kv_cache_dtype",
                f"{name!r}: attngate's KV pools store "
                f"{', '.join(sorted(KV_STORAGE_DTYPES))} or the model's dtype ('auto'); "
                "FP4 and MXFP8 caches need per-block scales they do not keep",
                code="backend-refusal.kv-cache-dtype",
            )
        )
    return KV_STORAGE_DTYPES[name]


def check_pool_dtype(plan: Plan, kv_pool) -> None:
    """The pool holds what the plan's ``common.kv_cache_dtype`` says (any floating dtype under "auto");
    BatchMetadataError otherwise, so that a plan resolved for an FP8 cache never runs on a 16-bit one or back."""
    dtype = getattr(kv_pool, "dtype", None)
    if plan.common.kv_cache_dtype == "auto" or dtype is None:
        return
    want = kv_storage_dtype(plan, dtype)
    if dtype != want:
        raise BatchMetadataError(
            Problem(
                "kv_pool",
                f"holds {dtype}, the plan's kv_cache_dtype {plan.common.kv_cache_dtype!r} "
                f"is {want}: build the pool with kv_storage_dtype(plan, model_dtype)",
                code="batch-metadata.pool-dtype",
            )
        )


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def check_pool_page_size(plan: Plan, kv_pool) -> int:
    """The plan's page_size; UsageError when the KV pool was built with another (every paged GPU backend)."""
    if kv_pool.page_size != plan.common.page_size:
        raise UsageError(
            Problem(
                "kv_pool",
                f"has page_size {kv_pool.page_size}, the plan {plan.common.page_size}",
                code="usage.pool-page-size",
            )
        )
    return plan.common.page_size
