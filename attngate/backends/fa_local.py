"""Chunked local attention (Llama 4, ``attention_chunk_size``) on FA: SGLang's local virtual batches
(``make_local_attention_virtual_batches``). Each request's queries are cut at chunk boundaries; each piece is one
causal varlen entry whose keys start at its chunk's first token, its page-table row at that page (so
``attention_chunk_size`` is a multiple of ``page_size``)."""

from __future__ import annotations

import torch

from attngate.backends.fa_kernels import FaMetadata
from attngate.backends.page_ids import page_table


def local_virtual_batches(
    req_to_token: torch.Tensor, rows: torch.Tensor, seq: list[int], new: list[int], chunk: int, page_size: int
) -> FaMetadata:
    """Local virtual batches: request r's queries at positions [seq - new, seq) cut at multiples of the chunk;
    a piece in chunk c attends causally to keys [c * chunk, its last query]. Host lengths, one copy to the device."""
    cu, used, req, start_tok = [0], [], [], []
    for r, (s, n) in enumerate(zip(seq, new)):
        pos = s - n
        while pos < s:
            c0 = pos // chunk * chunk
            end = min(s, c0 + chunk)
            cu.append(cu[-1] + end - pos)
            used.append(end - c0)
            req.append(r)
            start_tok.append(c0)
            pos = end
    host = torch.tensor([*cu, *used, *req, *start_tok], dtype=torch.int64)
    dev = host.to(req_to_token.device, non_blocking=True)
    v = len(used)
    cu_d, used_d, req_d, start_d = (
        dev[: v + 1],
        dev[v + 1 : 2 * v + 1],
        dev[2 * v + 1 : 3 * v + 1],
        dev[3 * v + 1 :],
    )
    pages = -(-max(used, default=1) // page_size)
    table = page_table(req_to_token, rows[req_d], pages, page_size, start_d)  # starts are chunk-, hence page-aligned
    max_q = max((b - a for a, b in zip(cu, cu[1:])), default=1)
    return FaMetadata(cu_d.to(torch.int32), max_q, used_d.to(torch.int32), table)


def local_decode_in_place(
    md: FaMetadata, req_to_token: torch.Tensor, rows: torch.Tensor, seqused: torch.Tensor, chunk: int, page_size: int
) -> None:
    """DECODE's local batches on the device (one query per request): the same shapes on every replay."""
    start = (seqused.long() - 1).clamp(min=0) // chunk * chunk
    md.local.seqused_k.copy_(seqused - start)
    page_table(req_to_token, rows, md.local.page_table.shape[1], page_size, start, out=md.local.page_table)
