"""The Triton merge of a split decode step (attngate/backends/fa_padded_triton.py) against the torch ops the CPU
suite checks (attngate.backends.fa_padded.merge_split off CUDA), and its batch invariance on the GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _torch_merge(out, lse, pieces, sinks):
    from attngate.backends import fa_padded

    return fa_padded.merge_split(out.cpu(), lse.cpu(), pieces, None if sinks is None else sinks.cpu())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("b, pieces, h, dv", [(1, 16, 32, 128), (8, 4, 16, 256), (3, 5, 8, 80), (32, 1, 64, 64)])
@pytest.mark.parametrize("sinks", [False, True])
def test_the_triton_merge_matches_the_torch_ops(b, pieces, h, dv, sinks, dtype):
    from attngate.backends import fa_padded_triton

    g = torch.Generator(device="cuda").manual_seed(b * pieces + h)
    out = torch.randn(b * pieces, h, dv, device="cuda", generator=g).to(dtype)
    lse = torch.randn(h, b * pieces, device="cuda", generator=g) * 4
    lse.view(h, b, pieces)[:, 0, pieces // 2 :] = -float("inf")  # request 0's last pieces hold no key
    out.view(b, pieces, h, dv)[0, pieces // 2 :] = 0
    sink_logits = torch.randn(h, device="cuda", generator=g) if sinks else None
    got = fa_padded_triton.merge_split(out, lse, pieces, sink_logits)
    expected = _torch_merge(out, lse, pieces, sink_logits)
    assert got.shape == (b, 1, h, dv) and got.dtype == dtype
    torch.testing.assert_close(got.cpu().float(), expected.float(), atol=2e-2, rtol=1e-2)


def test_a_request_without_keys_merges_to_zeros_and_more_empty_pieces_change_nothing():
    from attngate.backends import fa_padded_triton

    h, dv = 4, 128
    out = torch.randn(2 * 3, h, dv, device="cuda").bfloat16()
    lse = torch.randn(h, 2 * 3, device="cuda")
    lse.view(h, 2, 3)[:, 1] = -float("inf")
    out.view(2, 3, h, dv)[1] = 0
    merged = fa_padded_triton.merge_split(out, lse, 3, None)
    assert torch.equal(merged[1], torch.zeros_like(merged[1]))
    # request 0 with two more empty pieces after its own: bitwise the same
    wider_out = torch.cat([out.view(2, 3, h, dv)[:1], torch.zeros(1, 2, h, dv, device="cuda").bfloat16()], 1)
    wider_lse = torch.cat([lse.view(h, 2, 3)[:, :1], torch.full((h, 1, 2), -float("inf"), device="cuda")], 2)
    wider = fa_padded_triton.merge_split(wider_out.view(5, h, dv), wider_lse.reshape(h, 5), 5, None)
    assert torch.equal(wider[0], merged[0])


@pytest.mark.parametrize(
    "b, pieces, h, dv, sinks", [(1, 16, 32, 128, False), (8, 4, 16, 256, True), (3, 5, 8, 80, False)]
)
def test_the_merge_launches_its_compiled_kernel_directly_bitwise_as_triton_dispatches_it(b, pieces, h, dv, sinks):
    """After the first launch of a specialization (Triton's dispatch, then one direct launch checked against it), the
    merge launches the compiled kernel directly: this Triton's launcher takes the arguments as given, and the result
    is the dispatched launch's bit for bit, for other batches and pieces of the same specialization too."""
    from attngate.backends import fa_padded_triton

    fa_padded_triton._COMPILED.clear()
    g = torch.Generator(device="cuda").manual_seed(pieces)
    sink_logits = torch.randn(h, device="cuda", generator=g) if sinks else None
    results = []
    for batch, p in [(b, pieces), (b + 1, pieces + 3), (b, pieces)]:
        out = torch.randn(batch * p, h, dv, device="cuda", generator=g).bfloat16()
        lse = torch.randn(h, batch * p, device="cuda", generator=g) * 4
        results.append((out, lse, p, fa_padded_triton.merge_split(out, lse, p, sink_logits)))
    assert list(fa_padded_triton._COMPILED.values()) and all(fa_padded_triton._COMPILED.values())
    for out, lse, p, got in results:
        dispatched = fa_padded_triton._merge_kernel  # the same launch through Triton's dispatch
        expected = got.new_empty(got.shape)
        block_d = fa_padded_triton.triton.next_power_of_2(dv)
        dispatched[(got.shape[0], h)](
            out, lse, lse if sink_logits is None else sink_logits, expected, p, out.stride(0), out.stride(1),
            lse.stride(0), expected.stride(0), expected.stride(2), dv, HAS_SINKS=sinks, BLOCK_D=block_d,
        )  # fmt: skip
        assert torch.equal(got, expected)
