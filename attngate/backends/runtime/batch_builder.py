"""Build pools, request tables and ForwardBatches from (prefix_len, new_len) pairs, for tests and benchmarks.

Pages are handed out in a shuffled order, so a request's slots are scattered over the pool and a
page-table bug shows up as wrong output rather than passing by luck.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from attngate.backends.runtime.forward_batch import ForwardBatch
from attngate.backends.runtime.kv_cache import PageAllocator, ReqToTokenPool
from attngate.errors import Problem, UsageError, argument_problems, count_problems
from attngate.facts.modes import ForwardMode


@dataclass
class BatchSetup:
    batch: ForwardBatch
    req_to_token_pool: ReqToTokenPool
    allocator: PageAllocator
    slots: list[torch.Tensor]  # per request: the slots of all its tokens (encoder, prefix, new), int64


def build_batch(
    requests: list[tuple[int, int]],
    mode: ForwardMode,
    *,
    page_size: int,
    num_slots: int,
    max_context_len: int,
    encoder_lens: list[int] | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
    allocator: PageAllocator | None = None,
    req_to_token_pool: ReqToTokenPool | None = None,
) -> BatchSetup:
    """A ForwardBatch for ``requests`` = [(prefix_len, new_len), ...] in ``mode``.

    Pages come from ``allocator`` (default: a fresh one over ``num_slots`` with shuffled pages);
    each request gets whole pages for encoder + prefix + new tokens. Raises KVCacheExhausted when
    the pool is too small, UsageError naming every bad argument. The caller fills the prefix K/V
    (``slots[r][enc:enc+prefix]``).
    """
    _check_arguments(requests, mode, page_size, num_slots, max_context_len, encoder_lens)
    rng = random.Random(seed)
    if allocator is None:
        order = list(range(num_slots // page_size))
        rng.shuffle(order)
        allocator = PageAllocator(len(order), page_size, order)
    rtp = req_to_token_pool or ReqToTokenPool(max(len(requests), 1), max_context_len, device)
    encoder_lens = encoder_lens or [0] * len(requests)
    width = rtp.req_to_token.shape[1]
    too_long = [
        Problem(
            f"request {r}",
            f"holds {e + p + n} tokens, more than the {width} of a req_to_token row (max_context_len)",
            code="batch-metadata.request-too-long",
        )
        for r, ((p, n), e) in enumerate(zip(requests, encoder_lens))
        if e + p + n > width
    ]
    if too_long:
        raise UsageError(too_long)
    rows, slots, new_locs, enc_locs = [], [], [], []
    for (prefix, new), enc in zip(requests, encoder_lens):
        total = enc + prefix + new
        pages = allocator.alloc_pages(-(-total // page_size))
        s = torch.tensor([p * page_size + i for p in pages for i in range(page_size)][:total], dtype=torch.int64)
        row = rtp.alloc()
        rtp.req_to_token[row, :total] = s.to(torch.int32).to(rtp.req_to_token.device)
        rows.append(row)
        slots.append(s)
        new_locs.append(s[enc + prefix :])
        enc_locs.append(s[:enc])
    if mode == ForwardMode.IDLE:
        requests, rows = [], []
    as_i32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
    seq = [e + p + n for (p, n), e in zip(requests, encoder_lens)]
    batch = ForwardBatch(
        forward_mode=mode,
        batch_size=len(requests),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=device),
        seq_lens=as_i32(seq),
        seq_lens_cpu=torch.tensor(seq, dtype=torch.int32),
        extend_prefix_lens=as_i32([p for p, _ in requests]),
        extend_seq_lens=as_i32([n for _, n in requests]),
        out_cache_loc=(torch.cat(new_locs) if requests else torch.empty(0, dtype=torch.int64)).to(device),
        encoder_lens=as_i32(encoder_lens[: len(requests)]) if any(encoder_lens) else None,
        encoder_out_cache_loc=torch.cat(enc_locs).to(device) if any(encoder_lens) and requests else None,
        extend_seq_lens_cpu=[n for _, n in requests],
        encoder_lens_cpu=torch.tensor(encoder_lens[: len(requests)], dtype=torch.int32) if any(encoder_lens) else None,
    )
    return BatchSetup(batch, rtp, allocator, slots)


def _check_arguments(
    requests: object, mode: object, page_size: object, num_slots: object, max_context_len: object, encoder_lens: object
) -> None:
    problems = count_problems(
        ("page_size", page_size, 1), ("num_slots", num_slots, 1), ("max_context_len", max_context_len, 1)
    )
    problems += argument_problems(
        ("requests", requests, (list, tuple), "[(prefix_len, new_len), ...]"),
        ("mode", mode, (ForwardMode, str), "e.g. ForwardMode.DECODE"),
        ("encoder_lens", encoder_lens, (list, tuple, type(None)), "one count per request"),
    )
    if isinstance(requests, (list, tuple)):
        problems += [
            Problem(
                f"requests[{i}]",
                f"takes (prefix_len, new_len), two integers >= 0, not {r!r:.80}",
                code="usage.request-shape",
            )
            for i, r in enumerate(requests)
            if not isinstance(r, (list, tuple)) or len(r) != 2 or count_problems(("", r[0], 0), ("", r[1], 0))
        ][:10]
        if isinstance(encoder_lens, (list, tuple)) and len(encoder_lens) != len(requests):
            problems.append(
                Problem(
                    "encoder_lens",
                    f"holds {len(encoder_lens)} counts for {len(requests)} requests",
                    code="usage.encoder-lens-count",
                )
            )
    if isinstance(encoder_lens, (list, tuple)):
        problems += count_problems(*((f"encoder_lens[{i}]", e, 0) for i, e in enumerate(encoder_lens)))[:10]
    if problems:
        raise UsageError(problems)
