"""The Triton page-id kernel (attngate/backends/page_ids_triton.py) against the torch ops the CPU suite
runs, on realistic batches: uneven requests, windows, prefix-only and encoder ranges, page sizes 1 and 16;
both layouts (FlashInfer's kv_indices, FA's padded page_table), into fresh and static buffers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attngate import ForwardMode  # noqa: E402
from attngate.backends import page_ids as page_id_ops  # noqa: E402
from attngate.backends.page_ids import page_ids, page_table  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.batch_metadata import BatchLengths  # noqa: E402


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("ranges", [dict(), dict(window_left=100), dict(prefix_only=True), dict(cross=True)])
def test_triton_page_ids_equal_the_torch_ops(page_size, ranges):
    requests = [(0, 1), (15, 2), (2000, 1), (700, 45), (0, 1300), (31, 33)]
    enc = [page_size * i for i in range(len(requests))] if ranges.get("cross") else None
    s = build_batch(
        requests,
        ForwardMode.EXTEND,
        page_size=page_size,
        num_slots=1 << 16,
        max_context_len=4096,
        encoder_lens=enc,
        device="cuda",
    )
    lens = BatchLengths.from_batch(s.batch)
    rng = lens.kv_pages(page_size, **ranges)
    rtt = s.req_to_token_pool.req_to_token
    assert page_id_ops._triton_page_ids() is not None
    fast = page_ids(rtt, lens.rows, rng, page_size)
    slow = _without_triton(lambda: page_ids(rtt, lens.rows, rng, page_size))
    assert fast.dtype == slow.dtype == torch.int32 and fast.numel() == rng.total_pages > 0
    assert torch.equal(fast, slow)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("first", [False, True])
def test_triton_page_table_equals_the_torch_ops(page_size, first):
    requests = [(0, 1), (15, 2), (2000, 1), (700, 45), (31, 33)]
    s = build_batch(
        requests, ForwardMode.EXTEND, page_size=page_size, num_slots=1 << 16, max_context_len=4096, device="cuda"
    )
    rtt, rows = s.req_to_token_pool.req_to_token, s.batch.req_pool_indices
    first_token = (
        torch.tensor([0, 16, 1024, 64, 4080], dtype=torch.int32, device="cuda") // page_size * page_size
        if first
        else None
    )
    width = 4096 // page_size  # past a row's end the columns clamp to its last entry
    fast = page_table(rtt, rows, width, page_size, first_token)
    slow = _without_triton(lambda: page_table(rtt, rows, width, page_size, first_token))
    static = torch.full((len(requests), width), -1, dtype=torch.int32, device="cuda")
    assert page_table(rtt, rows, width, page_size, first_token, out=static) is static
    assert fast.dtype == torch.int32 and fast.shape == (len(requests), width)
    assert torch.equal(fast, slow) and torch.equal(static, fast)


def _without_triton(fn):
    saved = page_id_ops._triton_page_ids
    page_id_ops._triton_page_ids = lambda: None
    try:
        return fn()
    finally:
        page_id_ops._triton_page_ids = saved
