"""The Triton page-id kernel (attngate/backends/page_ids_triton.py) against the torch ops the CPU suite
runs, on realistic batches: uneven requests, windows, prefix-only and encoder ranges, page sizes 1 and 16."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from attngate import ForwardMode  # noqa: E402
from attngate.backends import batch_metadata  # noqa: E402
from attngate.backends.batch_builder import build_batch  # noqa: E402
from attngate.backends.batch_metadata import BatchLengths, page_ids  # noqa: E402


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("ranges", [dict(), dict(window_left=100), dict(prefix_only=True), dict(cross=True)])
def test_triton_page_ids_equal_the_torch_ops(page_size, ranges):
    requests = [(0, 1), (15, 2), (2000, 1), (700, 45), (0, 1300), (31, 33)]
    enc = [page_size * i for i in range(len(requests))] if ranges.get("cross") else None
    s = build_batch(requests, ForwardMode.EXTEND, page_size=page_size, num_slots=1 << 16, max_context_len=4096,
                    encoder_lens=enc, device="cuda")
    lens = BatchLengths.from_batch(s.batch)
    rng = lens.kv_pages(page_size, **ranges)
    rtt = s.req_to_token_pool.req_to_token
    assert batch_metadata._triton_page_ids() is not None
    fast = page_ids(rtt, lens.rows, rng, page_size)
    saved = batch_metadata._TRITON[:]
    batch_metadata._TRITON[:] = [None]
    try:
        slow = page_ids(rtt, lens.rows, rng, page_size)
    finally:
        batch_metadata._TRITON[:] = saved
    assert fast.dtype == slow.dtype == torch.int32 and fast.numel() == rng.total_pages > 0
    assert torch.equal(fast, slow)
