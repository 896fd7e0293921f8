"""How the plain path's padded FA decode splits a request's keys (transformers_ops.decode_split_keys): pieces sized
so the kernel's rows fill the GPU's SMs, or the plan's fixed pieces under deterministic inference, where a request's
output must not depend on its batch. Run on the CPU through the flash_attn.cute stand-in, an SM count stood in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from attngate import Platform, ServerArgs  # noqa: E402
from attngate.backends import fa_padded  # noqa: E402
from attngate.facts.modes import LayerKind  # noqa: E402
from attngate.integrations import transformers_ops  # noqa: E402
from attngate.integrations.transformers import configure  # noqa: E402
from attngate.integrations.transformers_context import LayerDecisions  # noqa: E402
from attngate.integrations.transformers_rows import MaskFindings, PaddedBatch  # noqa: E402
from tests.support.transformers_models import MODELS_UNDER_TEST, config_of, model_pair, on_fa_standin  # noqa: E402

FA_HOST = Platform.from_name("sm90", kernels=["flash_attn.cute"])
CUDA = torch.device("cuda")  # only its type is read: the SM count is stood in


@settings(max_examples=400, deadline=None)
@given(
    sms=st.integers(1, 200),
    b=st.integers(1, 64),
    h_kv=st.sampled_from([1, 2, 4, 8, 16]),
    s_kv=st.integers(1, 1 << 20),
    window=st.one_of(st.none(), st.integers(0, 1 << 16)),
)
def test_pieces_fill_the_gpu_and_are_never_short(sms, b, h_kv, s_kv, window):
    d = SimpleNamespace(decode_split_keys=None, window=window)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformers_ops, "_sm_count", lambda device: sms)
        split = transformers_ops.decode_split_keys(d, b, h_kv, s_kv, CUDA)
    rows, least = b * h_kv, transformers_ops.DECODE_MIN_PIECE_KEYS  # rows: the kernel's CTAs unsplit
    span = s_kv if window is None else min(s_kv, window + 1)  # the keys one query reads
    if span <= transformers_ops.DECODE_SPLIT_KEYS or 2 * rows > sms:
        assert split is None  # short reads, and batches that fill the SMs alone, run unsplit
        return
    pieces = -(-span // split)
    assert pieces == fa_padded.split_rows(torch.zeros(4, 1, dtype=torch.int32), s_kv, s_kv, window, split)[3]
    assert least <= split < span and rows * pieces <= sms  # never a piece too short, never more CTAs than SMs
    assert split == least or rows * -(-span // (split - 1)) > sms  # the shortest such pieces


def test_without_a_gpu_or_with_a_fixed_split_the_pieces_do_not_depend_on_the_batch():
    sized = SimpleNamespace(decode_split_keys=None, window=None)
    assert transformers_ops.decode_split_keys(sized, 1, 4, 100_000, torch.device("cpu")) == 4096
    assert transformers_ops.decode_split_keys(sized, 1, 4, 4096, torch.device("cpu")) is None
    fixed = SimpleNamespace(decode_split_keys=512)
    assert {transformers_ops.decode_split_keys(fixed, b, 8, s_kv, CUDA) for b in (1, 64) for s_kv in (3, 10**6)} == {
        512
    }


def _greedy_logits(model, ids, mask):
    out = model.generate(
        ids, attention_mask=mask, max_new_tokens=5, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("name", ["llama", "gpt-oss-sinks"])
def test_a_sized_split_decode_matches_eager(name, monkeypatch):
    """Pieces sized to 8 stood-in SMs (2 requests x the model's KV heads, pieces of at least 3 keys) over 13-token
    prompts: greedy decoding matches eager, with and without learned sinks, and the kernel's rows are the pieces."""
    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, overrides))
    calls = on_fa_standin(monkeypatch)
    monkeypatch.setattr(transformers_ops, "_sm_count", lambda device: 8)
    monkeypatch.setattr(transformers_ops, "DECODE_SPLIT_KEYS", 8)
    monkeypatch.setattr(transformers_ops, "DECODE_MIN_PIECE_KEYS", 3)
    configure(ours, ServerArgs(), FA_HOST)
    ids = torch.randint(1, 96, (2, 13), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    with torch.no_grad():
        (expected, expected_logits), (got, got_logits) = _greedy_logits(ref, ids, mask), _greedy_logits(ours, ids, mask)
    assert torch.equal(got, expected) and (got_logits - expected_logits).abs().max().item() < 1e-4
    h_kv = ours.config.num_key_value_heads
    pieces = 8 // (2 * h_kv)
    split_calls = [call for call in calls if len(call[0]) > 3]  # more rows than requests
    assert split_calls and all(len(call[0]) == 2 * pieces + 1 for call in split_calls)


@settings(max_examples=150, deadline=None)
@given(
    lens=st.lists(st.integers(1, 40), min_size=1, max_size=4),
    alone=st.integers(0, 3),
    split=st.integers(1, 9),
    h_kv=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3]),
    window=st.sampled_from([None, 5]),
    sinks=st.booleans(),
)
def test_a_fixed_split_gives_a_request_the_same_output_in_any_batch(lens, alone, split, h_kv, group, window, sinks):
    """Deterministic inference (``fa.decode_fixed_split_keys``): a decode request's output alone and in a left-padded
    batch of other lengths (more pieces, other padding) is bitwise the same, with a window and learned sinks."""
    alone %= len(lens)
    h, dim = h_kv * group, 8
    gen = torch.Generator().manual_seed(sum(lens) + split)
    keys = [torch.randn(2, h_kv, n, dim, generator=gen) for n in lens]  # K and V of each request
    queries = torch.randn(len(lens), h, 1, dim, generator=gen)
    sink_logits = torch.randn(h, generator=gen) if sinks else None
    d = LayerDecisions(
        name="t.layers.0", layer_id=0, kind=LayerKind.FULL, causal=True, window=window, scaling=dim**-0.5,
        logit_cap=0.0, attention_chunk_size=0, prefill_kernel="fa", decode_kernel="fa", prefill_kernel_family="fa2",
        workspace_size_mb=128, decode_split_keys=split,
    )  # fmt: skip

    def decode(which: list[int]) -> torch.Tensor:
        s_kv = max(lens[i] for i in which)
        kv = torch.zeros(2, len(which), h_kv, s_kv, dim)
        mask = torch.zeros(len(which), 1, 1, s_kv, dtype=torch.bool)
        for row, i in enumerate(which):  # left padding
            kv[:, row, :, s_kv - lens[i] :] = keys[i]
            mask[row, ..., s_kv - lens[i] :] = True
        batch = PaddedBatch(mask, len(which), 1, s_kv, torch.device("cpu"), MaskFindings())
        return transformers_ops.fa_in_place(d, batch, queries[which], kv[0], kv[1], sink_logits, d.scaling)

    with pytest.MonkeyPatch.context() as mp:
        on_fa_standin(mp)
        together, by_itself = decode(list(range(len(lens)))), decode([alone])
    assert torch.equal(together[alone], by_itself[0])
