"""DP-attention padding: every rank runs a decode batch of the same size, as SGLang pads to the global maximum.

Under ``--enable-dp-attention`` each rank attends over its own requests, but the layers around attention
exchange tokens across ranks, so all ranks must run the same number of tokens, and the same CUDA graph.
SGLang pads every rank's batch to the largest batch size of any rank; a rank without requests pads its
IDLE batch the same way instead of skipping the forward. Padded requests decode one token: they write
it to a reserved ``padding_slot`` and read the first slot of a reserved ``padding_row`` of
``req_to_token``; their output rows are to be dropped. The global maximum comes from
:func:`attngate.integrations.distributed.dp_max_batch_size`.
"""

from __future__ import annotations

import torch

from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.errors import BatchMetadataError, Problem
from attngate.facts.modes import ForwardMode


def pad_decode_batch(batch: ForwardBatch, batch_size: int, *, padding_row: int, padding_slot: int) -> ForwardBatch:
    """``batch`` (DECODE or IDLE, ``b`` requests) as a DECODE batch of ``batch_size`` requests: the first ``b`` are
    ``batch``'s own, the rest read ``req_to_token[padding_row, :1]`` and write slot ``padding_slot`` (both reserved
    by the server: nothing else may write that slot, and that row's first entry must be a slot of the pool).
    ``q``, ``k`` and ``v`` need ``batch_size`` rows (any values in the padded ones); output rows ``b:`` are padding.

    Raises BatchMetadataError listing every problem: another forward mode, a smaller ``batch_size``,
    encoder tokens (encoder-decoder models are not served under DP attention), negative indices.
    """
    problems = []
    if batch.forward_mode not in (ForwardMode.DECODE, ForwardMode.IDLE):
        problems.append(
            Problem(
                "forward_mode",
                f"only DECODE and IDLE batches are padded, not {batch.forward_mode.value}",
                code="usage.dp-padding-mode",
            )
        )
    if batch_size < batch.batch_size:
        problems.append(
            Problem(
                "batch_size",
                f"{batch_size} is smaller than the batch's {batch.batch_size} requests",
                code="usage.dp-padding-size",
            )
        )
    if batch.encoder_lens is not None:
        problems.append(
            Problem(
                "encoder_lens",
                "encoder-decoder batches are not padded for DP attention",
                code="usage.dp-padding-encoder",
            )
        )
    if padding_row < 0 or padding_slot < 0:
        problems.append(
            Problem(
                "padding_row / padding_slot",
                f"must be >= 0, got {padding_row} / {padding_slot}",
                code="usage.dp-padding-negative",
            )
        )
    if problems:
        raise BatchMetadataError(problems)
    n, dev = batch_size - batch.batch_size, batch.seq_lens.device

    def grow(t: torch.Tensor, fill: int) -> torch.Tensor:
        return torch.cat([t[: batch.batch_size], t.new_full((n,), fill)])

    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=batch_size,
        req_pool_indices=grow(batch.req_pool_indices.to(dev, torch.int64), padding_row),
        seq_lens=grow(batch.seq_lens, 1),
        seq_lens_cpu=grow(batch.seq_lens_cpu, 1),
        extend_prefix_lens=grow(batch.extend_prefix_lens, 0),
        extend_seq_lens=grow(batch.extend_seq_lens, 1),
        out_cache_loc=grow(batch.out_cache_loc.to(dev, torch.int64), padding_slot),
        extend_seq_lens_cpu=[1] * batch_size,
    )
