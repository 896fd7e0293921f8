"""``attn_implementation="attngate"`` against transformers' eager attention over the space users call it in: a
hypothesis property drawing the architecture, the batch, the prompt lengths, the padding (none, left, right, holes),
the mask (given or None), the cache (dynamic, static: a window model's is its sliding-window cache), the call
(forward; greedy, sampled, beam-search and prompt-lookup generate), the path (float32 torch, FA's in-place varlen call through the
flash_attn.cute stand-in) and the mode (eager, traced by torch.compile); and a second over callers' own 4D masks
(bool or additive, shared or per head, soft biases). CPU, float32: every logit at a valid position within 1e-4.

An unpadded prompt over a static cache (transformers passes no mask: sdpa's top-left causal over the cache's empty
slots) was read bottom-right, over the empty slots: the first property draws it (padding "none", cache "static")."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from attngate import Platform, ServerArgs  # noqa: E402
from attngate.errors import UsageError  # noqa: E402
from attngate.integrations import transformers_ops  # noqa: E402
from attngate.integrations.transformers import configure  # noqa: E402
from attngate.integrations.transformers_plain import plain_attention  # noqa: E402
from tests.support.transformers_models import MODELS_UNDER_TEST, SMALL, config_of, model_pair, on_fa_standin  # noqa: E402

ATOL = 1e-4
VOCAB = SMALL["vocab_size"]
ARCHS = ["llama", "qwen3", "mistral-swa", "gemma2-softcap-swa", "gemma3-pattern", "gpt-oss-sinks", "phi3"]
TORCH_HOST = Platform.from_name("sm90", kernels=["attngate"])  # on the CPU: float32 torch
FA_HOST = Platform.from_name("sm90", kernels=["flash_attn.cute"])


@functools.cache
def pair(name: str):
    """The eager reference and attngate's model of one architecture, same random weights (built once)."""
    if name == "phi3":
        cfg = transformers.Phi3Config(**SMALL, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    else:
        file, overrides, _ = MODELS_UNDER_TEST[name]
        cfg = config_of(file, overrides)
    return model_pair(cfg)


def _mask(lengths: list[int], width: int, padding: str, hole: int) -> torch.Tensor:
    """``[B, width]`` int64: each request's ``lengths[i]`` tokens, padded left or right, or (holes) left-padded with
    one position inside the prompt masked out."""
    rows = []
    for n in lengths:
        pad = width - n
        row = [0] * pad + [1] * n if padding in ("left", "holes", "none") else [1] * n + [0] * pad
        if padding == "holes" and n > 2:
            row[pad + 1 + hole % (n - 2)] = 0  # never the first or the last token of the prompt
        rows.append(row)
    return torch.tensor(rows)


def _close_until_they_part(ref_out, our_out) -> None:
    """Step by step, the logits within ATOL while both fed the same tokens; where the tokens part, a near tie of the
    reference's (top-2 margin below 1e-3) and nothing after it."""
    for step, (a, b) in enumerate(zip(ref_out.logits, our_out.logits)):
        assert (a - b).abs().max().item() < ATOL, f"step {step}: {(a - b).abs().max().item()}"
        width = ref_out.sequences.shape[1] - len(ref_out.logits) + step + 1
        if not torch.equal(ref_out.sequences[:, :width], our_out.sequences[:, :width]):
            top2 = a.topk(2, dim=-1).values
            assert (top2[:, 0] - top2[:, 1]).min().item() < 1e-3
            return


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_plain_path_matches_eager_attention(data):
    name = data.draw(st.sampled_from(ARCHS), label="arch")
    # beam search reorders the cache's rows every step; prompt lookup (assisted decoding, one request) verifies
    # several drafted tokens a step: queries at the end of a longer cache (transformers runs it on a dynamic cache)
    call = data.draw(st.sampled_from(["forward", "greedy", "sampled", "beam", "lookup"]), label="call")
    b = 1 if call == "lookup" else data.draw(st.integers(1, 4), label="batch")
    padding = data.draw(st.sampled_from(["none", "left", "right", "holes"]), label="padding")
    width = data.draw(st.integers(2, 10), label="prompt")
    lengths = [width] * b if padding == "none" else data.draw(st.lists(st.integers(1, width), min_size=b, max_size=b))
    give_mask = padding != "none" or data.draw(st.booleans(), label="mask given")
    cache = "dynamic" if call == "lookup" else data.draw(st.sampled_from(["dynamic", "static"]), label="cache")
    path = data.draw(st.sampled_from(["torch", "fa"]), label="path")
    # FA's decode split (transformers_ops.decode_split_keys), drawn down to these lengths: none, pieces of a fixed
    # size (no GPU: every DECODE_SPLIT_KEYS keys), or sized to a stood-in SM count
    split = data.draw(st.sampled_from(["none", "fixed", "sized"]), label="split") if path == "fa" else "none"
    compiled = call == "forward" and data.draw(st.booleans(), label="compiled")
    # a graph cannot look at the mask: a request whose keys are not one run comes out NaN (documented), not wrong
    assume(not (compiled and padding == "holes"))
    # generate() after right padding starts from a padding query's logits (transformers warns): eager attends it over
    # whatever its mask row shows, uniformly over every key where the window leaves it none, attngate leaves it zero
    # as transformers' flash_attention_2 does. Decoding after right padding: test_transformers_plain.py, step by step
    assume(not (padding == "right" and call != "forward"))
    ids = torch.randint(1, VOCAB, (b, width), generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    ids[:, width // 2 :] = ids[:, : width - width // 2].clone()  # a repeat, for prompt lookup to draft from
    mask = _mask(lengths, width, padding, data.draw(st.integers(0, 7), label="hole"))
    kwargs = {"attention_mask": mask} if give_mask else {}
    ref, ours = pair(name)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if path == "fa":
            on_fa_standin(mp)
        if split != "none":
            mp.setattr(transformers_ops, "DECODE_SPLIT_KEYS", data.draw(st.integers(1, width), label="split past"))
        if split == "sized":
            mp.setattr(transformers_ops, "DECODE_MIN_PIECE_KEYS", data.draw(st.integers(1, 4), label="least piece"))
            sms = data.draw(st.integers(1, 32), label="SMs")
            mp.setattr(transformers_ops, "_sm_count", lambda device: sms)
        configure(ours, ServerArgs(), FA_HOST if path == "fa" else TORCH_HOST)
        if call == "forward":
            model = torch.compile(ours, backend="eager", dynamic=False) if compiled else ours
            past = (
                {}
                if cache == "dynamic"
                else {"past_key_values": transformers.StaticCache(config=ours.config, max_cache_len=width + 5)}
            )
            expected = ref(
                ids,
                **kwargs,
                **(
                    {}
                    if cache == "dynamic"
                    else {"past_key_values": transformers.StaticCache(config=ref.config, max_cache_len=width + 5)}
                ),
            ).logits
            got = model(ids, **kwargs, **past).logits
            valid = mask.bool()
            assert (expected - got)[valid].abs().max().item() < ATOL
            return
        gen = dict(kwargs, max_new_tokens=4, output_logits=True, return_dict_in_generate=True)
        gen |= {
            "greedy": {"do_sample": False},
            "sampled": {"do_sample": True, "top_k": 5},
            "beam": {"do_sample": False, "num_beams": 3, "num_return_sequences": 2},
            "lookup": {"do_sample": False, "prompt_lookup_num_tokens": 3},
        }[call]
        gen |= {} if cache == "dynamic" else {"cache_implementation": "static"}
        outs = []
        for model in (ref, ours):
            torch.manual_seed(3)
            outs.append(model.generate(ids, **gen))
        _close_until_they_part(*outs)


@settings(max_examples=40, deadline=None)
@given(
    name=st.sampled_from(["mistral-swa", "gemma2-softcap-swa", "gemma3-pattern", "gpt-oss-sinks", "llama"]),
    rows=st.lists(st.lists(st.booleans(), min_size=9, max_size=9).filter(any), min_size=1, max_size=3),
    path=st.sampled_from(["torch", "fa"]),
)
def test_any_padding_mask_means_what_it_means_to_eager_attention(name, rows, path):
    """A 2D mask of any pattern (holes anywhere, not only padding at one end): eager's logits at every kept
    position. A window is a distance between positions, so a key masked out inside a window leaves the kernels' rows
    (whose distances it would shorten) for float32 torch, on every windowed layer."""
    ref, ours = pair(name)
    mask = torch.tensor(rows, dtype=torch.int64)
    ids = torch.randint(1, VOCAB, mask.shape, generator=torch.Generator().manual_seed(len(rows)))
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if path == "fa":
            on_fa_standin(mp)
        configure(ours, ServerArgs(), FA_HOST if path == "fa" else TORCH_HOST)
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL


def _custom_mask(kind: str, b: int, h: int, s: int, bias: float) -> torch.Tensor:
    """A caller's 4D mask over ``s`` queries and keys: causal, each request hiding its first key from its last query,
    per head (``per-head-*``: head i also hides key i % s from every query but the first) or biased (``biased``: the
    earlier keys of each query get ``bias`` added, ALiBi-style)."""
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    keep = causal.expand(b, 1, s, s).clone()
    if s > 1:
        keep[:, :, -1, 0] = False
    if kind.startswith("per-head"):
        keep = keep.expand(b, h, s, s).clone()
        for head in range(h):
            keep[:, head, 1:, head % s] = False
            keep[:, head, :, 0] = True  # the first key stays visible: no row without one
    if kind in ("bool", "per-head-bool"):
        return keep
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    if kind == "biased":
        distance = torch.arange(s)[:, None] - torch.arange(s)[None, :]
        additive = additive + bias * distance.clamp(min=0).float()
    return additive


@settings(max_examples=30, deadline=None)
@given(
    name=st.sampled_from(["llama", "gemma2-softcap-swa", "gpt-oss-sinks"]),
    kind=st.sampled_from(["bool", "additive", "per-head-bool", "per-head-additive", "biased"]),
    b=st.integers(1, 3),
    s=st.integers(2, 5),  # within the windows (5): a caller's mask replaces transformers' own, window included
    bias=st.floats(-1.0, -0.05),
    path=st.sampled_from(["torch", "fa"]),
)
def test_a_callers_4d_mask_means_what_it_means_to_eager_attention(name, kind, b, s, bias, path):
    """Per head, additive with soft biases or plain keep/hide (a bool mask keeps, as sdpa reads it): eager's result,
    whichever path the plan names (a mask the kernels cannot express runs in float32 torch, never approximated by its
    first head or its zeros). The plan's window holds on top of a caller's mask (transformers drops the model's own
    mask, window included, for a caller's 4D one): the queries stay within the windows here."""
    ref, ours = pair(name)
    ids = torch.randint(1, VOCAB, (b, s), generator=torch.Generator().manual_seed(s))
    mask = _custom_mask(kind, b, ours.config.num_attention_heads, s, bias)
    with pytest.MonkeyPatch.context() as mp, torch.no_grad():
        if path == "fa":
            on_fa_standin(mp)
        configure(ours, ServerArgs(), FA_HOST if path == "fa" else TORCH_HOST)
        expected, got = ref(ids, attention_mask=_additive(mask)).logits, ours(ids, attention_mask=mask).logits
    assert (expected - got).abs().max().item() < ATOL


def _additive(mask: torch.Tensor) -> torch.Tensor:
    """A bool keep-mask as eager attention must be given it: eager adds a 4D mask to the scores (a bool one as 0/1,
    where sdpa and attngate read it as keep), so the reference takes the same mask made additive."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)


def _module():
    ref, ours = pair("llama")
    return ours.model.layers[0].self_attn


@pytest.mark.parametrize(
    ("mask", "needle"),
    [
        (torch.ones(1, 1, 3, 5, dtype=torch.int64), "dtype torch.int64"),
        (torch.ones(1, 1, 3, 4, dtype=torch.bool), "keys >= 5"),
        (torch.ones(1, 3, 3, 5, dtype=torch.bool), "heads 8 or 1"),
        (torch.ones(3, 5, dtype=torch.bool), "shape [3, 5]"),
    ],
)
def test_a_mask_no_attention_takes_is_refused_naming_it(mask, needle):
    q, k = torch.randn(1, 8, 3, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(UsageError, match="attention_mask") as err:
        plain_attention(_module(), q, k, k, mask)
    assert needle in str(err.value)


def test_no_keys_attend_to_nothing():
    """A call with no keys (an empty cache, an empty encoder output) gives zeros, as eager's empty softmax does."""
    q, k = torch.randn(2, 8, 3, 8), torch.randn(2, 2, 0, 8)
    out, _ = plain_attention(_module(), q, k, k, None)
    assert out.shape == (2, 3, 8, 8) and not out.any()


def test_nan_and_inf_in_an_additive_mask_come_through_as_in_eager():
    ref, ours = pair("llama")
    ids = torch.randint(1, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))
    for value in (float("nan"), float("inf")):
        mask = _custom_mask("additive", 1, 8, 4, 0.0)
        mask[0, 0, 2, 1] = value
        with torch.no_grad():
            expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
        assert expected.isnan().any() and torch.equal(expected.isnan(), got.isnan())
        assert torch.allclose(expected, got, atol=ATOL, rtol=0, equal_nan=True)
