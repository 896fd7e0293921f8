"""The shared per-batch metadata (attngate.backends.runtime.batch_metadata): host lengths from the batch's CPU
copies, KV page ranges and page ids, against a per-request brute-force definition."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st

from attngate import ForwardMode  # noqa: E402
from attngate.backends.page_ids import page_ids  # noqa: E402
from attngate.backends.runtime.batch_builder import build_batch  # noqa: E402
from attngate.backends.runtime.batch_metadata import (
    BatchLengths,  # noqa: E402
    check_page_aligned,  # noqa: E402
)
from attngate.errors import BatchMetadataError  # noqa: E402

requests_st = st.lists(st.tuples(st.integers(0, 70), st.integers(1, 20)), min_size=1, max_size=5)


def _setup(requests, page_size, encoder_lens=None, mode=ForwardMode.EXTEND):
    return build_batch(
        requests, mode, page_size=page_size, num_slots=4096, max_context_len=256, encoder_lens=encoder_lens
    )


def _visible_slots(setup, r: int, lens: BatchLengths, *, window_left: int, prefix_only: bool, cross: bool) -> list[int]:
    """Brute force: the slots of every key some query of request r may read, in token order."""
    enc, prefix, new = int(lens.enc[r]), int(lens.prefix[r]), int(lens.new[r])
    if cross:
        return setup.slots[r][:enc].tolist()
    first_key = enc if window_left < 0 else max(enc, enc + prefix - window_left)
    end = enc + prefix + (0 if prefix_only else new)
    return setup.slots[r][first_key:end].tolist()


@settings(max_examples=60, deadline=None)
@given(
    requests=requests_st,
    page_size=st.sampled_from([1, 4, 16]),
    window_left=st.sampled_from([-1, 0, 5, 33]),
    prefix_only=st.booleans(),
    cross=st.booleans(),
)
def test_page_ranges_and_ids_cover_exactly_the_readable_keys(requests, page_size, window_left, prefix_only, cross):
    enc = [page_size * (i % 3) for i in range(len(requests))] if cross else None
    s = _setup(requests, page_size, enc)
    lens = BatchLengths.from_batch(s.batch)
    rng = lens.kv_pages(page_size, window_left=-1 if cross else window_left, prefix_only=prefix_only, cross=cross)
    ids = page_ids(s.req_to_token_pool.req_to_token, lens.rows, rng, page_size)
    assert ids.dtype == torch.int32 and ids.numel() == rng.total_pages
    for r in range(len(requests)):
        want = _visible_slots(
            s, r, lens, window_left=-1 if cross else window_left, prefix_only=prefix_only, cross=cross
        )
        pages = ids[rng.indptr[r] : rng.indptr[r + 1]].tolist()
        read = [p * page_size + i for p in pages for i in range(page_size)]
        read = read[: int(rng.kv_len[r])]  # ranges start on a page
        assert read[len(read) - len(want) :] == want  # the kernel's range ends exactly at the last readable key
        assert len(read) - len(want) < page_size  # and starts at most one page early (whole pages)
        assert 1 <= rng.last_page_len[r] <= page_size
        if rng.counts[r]:
            assert (rng.counts[r] - 1) * page_size + rng.last_page_len[r] == rng.kv_len[r]


def test_lengths_come_from_the_host_copies_and_match_the_device_tensors():
    s = _setup([(0, 5), (30, 1), (7, 12)], 4, encoder_lens=[4, 0, 8])
    lens = BatchLengths.from_batch(s.batch)
    b = s.batch
    assert lens.seq.tolist() == b.seq_lens.tolist()
    assert lens.new.tolist() == b.extend_seq_lens.tolist()
    assert lens.prefix.tolist() == b.extend_prefix_lens.tolist()
    assert lens.enc.tolist() == [4, 0, 8]
    assert lens.qo_indptr.tolist() == [0, 5, 6, 18] and lens.num_tokens == b.num_tokens
    assert (lens.max_new, lens.max_seq, lens.has_prefix) == (12, 31, True)
    # device tensors that disagree with the host copies are not read: the host copies are the source
    b.extend_seq_lens = torch.zeros_like(b.extend_seq_lens)
    assert BatchLengths.from_batch(b).new.tolist() == [5, 1, 12]


def test_decode_and_graph_lengths():
    s = _setup([(9, 1), (0, 1)], 1, mode=ForwardMode.DECODE)
    lens = BatchLengths.from_batch(s.batch)
    assert (
        lens.new.tolist() == [1, 1]
        and lens.prefix.tolist() == [9, 0]
        and not BatchLengths.from_batch(_setup([(0, 1)], 1).batch).has_prefix
    )
    g = BatchLengths.for_graph(
        ForwardMode.TARGET_VERIFY, s.batch.req_pool_indices, torch.tensor([13, 4], dtype=torch.int32), 4, None
    )
    assert g.new.tolist() == [4, 4] and g.prefix.tolist() == [9, 0] and g.qo_indptr.tolist() == [0, 4, 8]


def test_unaligned_encoder_lengths_name_the_field():
    with pytest.raises(BatchMetadataError, match="encoder_lens.*page_size 16.*FA"):
        check_page_aligned(np.array([16, 3]), 16, "encoder_lens", "FA")
    check_page_aligned(np.array([3]), 1, "encoder_lens", "FA")


def test_empty_ranges_give_no_page_ids():
    s = _setup([(0, 3)], 4)
    lens = BatchLengths.from_batch(s.batch)
    rng = lens.kv_pages(4, prefix_only=True)
    assert rng.total_pages == 0 and rng.last_page_len.tolist() == [4]
    assert page_ids(s.req_to_token_pool.req_to_token, lens.rows, rng, 4).numel() == 0


def test_checked_mode_names_a_host_copy_that_disagrees_with_its_device_tensor():
    from attngate.backends.checks import check_batch

    s = _setup([(3, 2), (0, 4)], 1)
    s.batch.seq_lens_cpu = torch.tensor([5, 5], dtype=torch.int32)  # stale: the device says [5, 4]
    s.batch.extend_seq_lens_cpu = [2, 3]
    with pytest.raises(BatchMetadataError) as err:
        check_batch(s.batch, s.req_to_token_pool.req_to_token, 4096)
    assert [p.where for p in err.value.problems] == ["seq_lens_cpu", "extend_seq_lens_cpu"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_page_table_is_the_padded_layout_of_page_ids(page_size):
    from attngate.backends.page_ids import page_table

    s = _setup([(0, 5), (30, 1), (7, 12)], page_size)
    lens = BatchLengths.from_batch(s.batch)
    rtt, rng = s.req_to_token_pool.req_to_token, lens.kv_pages(page_size)
    flat = page_ids(rtt, lens.rows, rng, page_size)
    width = int(rng.counts.max())
    table = page_table(rtt, lens.rows, width, page_size)
    assert table.dtype == torch.int32 and table.shape == (3, width)
    for r in range(3):
        assert table[r, : rng.counts[r]].tolist() == flat[rng.indptr[r] : rng.indptr[r + 1]].tolist()
    first = torch.tensor([0, 2 * page_size, page_size])  # page-aligned starts: the rows shifted left by whole pages
    shifted = page_table(rtt, lens.rows, 2, page_size, first)
    for r in range(3):
        assert shifted[r].tolist() == [
            int(rtt[lens.rows[r], min(int(first[r]) + j * page_size, rtt.shape[1] - 1)]) // page_size for j in range(2)
        ]
