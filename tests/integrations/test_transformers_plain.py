"""``attn_implementation="attngate"`` without a runtime: ``model(ids)`` and ``generate()`` against eager on
the CPU (float32), for every architecture of the differential tests, with a left-padded batch,
transformers' DynamicCache and static cache, greedy and sampled decoding."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from attngate import Platform, ServerArgs  # noqa: E402
from attngate.integrations.transformers import AttngateRuntime, configure  # noqa: E402
from attngate.integrations.transformers_plain import plan_of  # noqa: E402
from tests.support.transformers_models import (
    MODELS_UNDER_TEST,
    config_of,
    mllama_pair,
    model_pair,
    on_fa_standin,
    two_images,
)

ATOL = 1e-4
FA_HOST = Platform.from_name("sm90", kernels=["flash_attn.cute"])  # the plan runs FA through flash_attn.cute


def _batch():
    ids = torch.randint(1, 96, (2, 13), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    return ids, mask


@pytest.mark.parametrize("name", sorted(MODELS_UNDER_TEST))
def test_forward_and_generate_match_eager(name):
    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, overrides))
    ids, mask = _batch()
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL
    greedy = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)
    reference = ref.generate(ids, **greedy)
    assert torch.equal(ours.generate(ids, **greedy), reference)  # DynamicCache
    assert torch.equal(ours.generate(ids, **greedy, cache_implementation="static"), reference)
    sampled = []
    for model in (ref, ours):
        torch.manual_seed(3)
        sampled.append(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=True, top_k=5))
    assert torch.equal(*sampled)


def test_the_plans_window_is_what_the_layers_attend_with():
    """The window comes from the plan's layer spec, not from transformers' mask: narrowing it changes the output."""
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["mistral-swa"][:2]))
    ids, mask = _batch()
    resolution = configure(ours, ServerArgs(page_size=16))
    assert resolution.server_args.page_size == 16
    with torch.no_grad():
        expected = ref(ids, attention_mask=mask).logits
        assert (expected - ours(ids, attention_mask=mask).logits)[mask.bool()].abs().max().item() < ATOL
        _, layers = plan_of(ours)
        for layer in layers:
            layer.sliding_window_size = 1
        narrowed = ours(ids, attention_mask=mask).logits
    assert (expected - narrowed)[mask.bool()].abs().max().item() > 1e-2


def test_from_pretrained_finds_attngate_by_name(tmp_path):
    ref, _ = model_pair(config_of(*MODELS_UNDER_TEST["llama"][:2]))
    ref.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="attngate", dtype=torch.float32
    )
    ids, mask = _batch()
    with torch.no_grad():
        diff = (ref(ids, attention_mask=mask).logits - model(ids, attention_mask=mask).logits)[mask.bool()]
    assert diff.abs().max().item() < ATOL
    model.save_pretrained(tmp_path / "again")  # the plan is kept off the config transformers serializes
    assert "attngate" not in (tmp_path / "again" / "config.json").read_text().replace('"attn_implementation"', "")


@pytest.mark.parametrize("name", ["llama", "mistral-swa", "gemma2-softcap-swa"])
def test_the_flashinfer_path_unpads_plans_once_per_forward_and_matches_eager(name, monkeypatch):
    """The GPU path's metadata code on the CPU: FlashInfer's ragged wrapper (the stand-in) over the unpadded
    rows of a left-padded batch, prefill and cached decode; one plan() per forward and layer spec."""
    import sys

    from attngate.backends import varlen
    from attngate.integrations import transformers_plain
    from tests.support.standins import flashinfer as fi_standin

    module = fi_standin.module()
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr(transformers_plain, "_on_gpu", lambda t: True)
    monkeypatch.setattr(varlen, "_RAGGED", {})
    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, {**overrides, "head_dim": 64}))  # the smallest head dim FlashInfer runs
    resolution = configure(ours, ServerArgs(attention_backend="flashinfer"))
    assert resolution.plan.prefill_backend == resolution.plan.decode_backend == "flashinfer"
    plans = []
    original = module.BatchPrefillWithRaggedKVCacheWrapper.plan
    monkeypatch.setattr(
        module.BatchPrefillWithRaggedKVCacheWrapper,
        "plan",
        lambda self, *a, **k: (plans.append(k.get("window_left")), original(self, *a, **k))[1],
    )
    ids, mask = _batch()
    greedy = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
        assert (expected - got)[mask.bool()].abs().max().item() < ATOL
        specs = len(varlen._RAGGED)
        assert len(plans) == specs  # every layer of the forward reused its spec's plan
        assert torch.equal(ours.generate(ids, **greedy), ref.generate(ids, **greedy))
    assert specs == (2 if name == "gemma2-softcap-swa" else 1)  # gemma-2 alternates window and full layers


@pytest.mark.parametrize("name, per_forward", [("llama", 1), ("gemma2-softcap-swa", 2)])
def test_the_unpadding_path_finds_a_masks_valid_positions_once_per_forward(name, per_forward, monkeypatch):
    """FlashInfer's ragged path: the varlen rows' positions (host syncs) are found once per forward and mask (one per
    layer type: gemma-2's window and full layers), not at every layer; an in-place edit of a mask is a new layout."""
    import sys

    from attngate.integrations import transformers_context, transformers_plain, transformers_rows
    from tests.support.standins import flashinfer as fi_standin

    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, {**overrides, "head_dim": 64}))
    monkeypatch.setitem(sys.modules, "flashinfer", fi_standin.module())
    monkeypatch.setattr(transformers_plain, "_on_gpu", lambda t: True)
    configure(ours, ServerArgs(attention_backend="flashinfer"))
    found, original = [], transformers_rows._ValidPositions

    def counted(*args):
        found.append(args)
        return original(*args)

    monkeypatch.setattr(transformers_rows, "_ValidPositions", counted)
    ids, mask = _batch()
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL
    assert len(found) == per_forward
    assert not len(transformers_context.context_of(ours).masks)  # dropped with the forward's masks

    visible = torch.ones(2, 1, 5, dtype=torch.bool)
    four_d = visible[:, None].clone()
    batch = transformers_rows.PaddedBatch(four_d, 2, 1, 5, visible.device, transformers_rows.MaskFindings())
    first = batch.valid_positions(visible, True)
    assert batch.valid_positions(visible, True) is first
    four_d[1, 0, 0, :2] = False
    edited = four_d[:, 0]
    assert batch.valid_positions(edited, True).lens.tolist() == [[1, 1], [5, 3]]


# plain full attention, soft-cap with alternating windows, learned sinks
@pytest.mark.parametrize("name", ["llama", "gemma2-softcap-swa", "gpt-oss-sinks"])
def test_the_fa_path_reads_the_padded_batch_and_cache_in_place(name, monkeypatch):
    """FA's varlen call (the flash_attn.cute stand-in, which leaves unread rows NaN) over transformers' padded batch as
    it lies: each request's row starts at its own padded offset (cu_seqlens, on the device) and runs for its own
    length (seqused); the DynamicCache and the static cache are read head-major in place (a request's row holds every
    head's 13 keys, or 18 slots). Decode splits a request's keys every DECODE_SPLIT_KEYS keys into rows
    of one query each, merged: greedy generation matches eager either way."""
    from attngate.integrations import transformers_ops

    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, overrides))
    calls = on_fa_standin(monkeypatch)
    configure(ours, ServerArgs(), FA_HOST)
    ids, mask = _batch()  # 2 x 13, the second request left-padded by 4
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
        assert (expected - got)[mask.bool()].abs().max().item() < ATOL
        kv_heads = ours.config.num_key_value_heads
        # keys in the DynamicCache's [B, H_kv, S, D]: request 1's row starts after both heads of request 0
        assert calls[0] == ([0, 17, 26], [0, kv_heads * 13 + 4, kv_heads * 26], True, [13, 9], [13, 9])
        greedy = dict(attention_mask=mask, max_new_tokens=6, do_sample=False)
        reference = ref.generate(ids, **greedy)
        calls.clear()
        static = dict(greedy, cache_implementation="static")
        assert torch.equal(ours.generate(ids, **static), reference)
        # generate()'s static cache holds 13 + 6 - 1 slots a head: request 1's keys start after its padding
        assert calls[0][1][:2] == [0, kv_heads * 18 + 4] or name != "llama"  # window layers: their own cache
        monkeypatch.setattr(transformers_ops, "DECODE_SPLIT_KEYS", 4)
        calls.clear()
        assert torch.equal(ours.generate(ids, **greedy), reference)
    if name == "llama":  # the last step's last layer: 18 and 14 keys, cut into 5 pieces of 4 (1 query each)
        assert calls[-1][0] == list(range(11)) and calls[-1][4] == [4, 4, 4, 4, 2, 4, 4, 4, 2, 0]


@pytest.mark.parametrize("kernel", ["fa", "flashinfer"])
@pytest.mark.parametrize("name", ["llama", "mistral-swa"])
def test_a_right_padded_prefill_counts_its_padding_queries_out(kernel, name, monkeypatch):
    """Under transformers' causal mask a right-padding query sees the valid keys before it; it is padding all the same
    (its last visible key is its neighbour's), so FA's in-place rows run for the valid queries only (counting it in
    aligned the queries bottom-right against fewer keys), and FlashInfer's unpadded rows leave it out."""
    import sys

    from attngate.backends import varlen
    from attngate.integrations import transformers_plain
    from tests.support.standins import flashinfer as fi_standin

    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, {**overrides, "head_dim": 64}))
    if kernel == "fa":
        calls = on_fa_standin(monkeypatch)
        configure(ours, ServerArgs(), FA_HOST)
    else:
        monkeypatch.setitem(sys.modules, "flashinfer", fi_standin.module())
        monkeypatch.setattr(transformers_plain, "_on_gpu", lambda t: True)
        monkeypatch.setattr(varlen, "_RAGGED", {})
        configure(ours, ServerArgs(attention_backend="flashinfer"))
    ids, mask = _batch()
    mask = mask.flip(1)  # the second request right-padded by 4
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL
    if kernel == "fa":
        assert calls[0][3:] == ([13, 9], [13, 9])  # seqused_q, seqused_k


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["llama", "mistral-swa", "gpt-oss-sinks"])
def test_decoding_after_right_padding_reads_only_the_valid_keys(name, cache, monkeypatch):
    """After a right-padded prompt a request's keys are its prompt, its padding, then what it generated: not one run,
    which FA's in-place rows would read whole. Eager, such a step goes unpadded instead (its valid keys gathered, host
    lengths) and matches eager; in a graph, which cannot look at the mask, that request comes out NaN rather than
    wrong, the others as in place. (The prompt's last position is padding, zeros here as in transformers'
    flash_attention_2: the steps are fed their tokens rather than generate()'s.)"""
    from attngate.integrations import transformers_ops

    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, overrides))
    calls = on_fa_standin(monkeypatch)
    configure(ours, ServerArgs(), FA_HOST)
    ids, mask = _batch()
    mask = mask.flip(1)  # the second request right-padded by 4
    caches = [
        transformers.DynamicCache(config=m.config)
        if cache == "dynamic"
        else transformers.StaticCache(config=m.config, max_cache_len=20)
        for m in (ref, ours)
    ]

    def decode_step(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Both models' logits for one more token (the mask grows by one valid key; the static cache's is its size)."""
        seen = torch.cat([mask, torch.ones(2, step + 1, dtype=mask.dtype)], 1)
        full = seen if cache == "dynamic" else torch.nn.functional.pad(seen, (0, 20 - seen.shape[1]))
        args = dict(input_ids=ids[:, step : step + 1], attention_mask=full, cache_position=torch.tensor([13 + step]))
        return tuple(m(**args, past_key_values=kv).logits for m, kv in zip((ref, ours), caches))

    with torch.no_grad():
        for model, kv in zip((ref, ours), caches):
            model(ids, attention_mask=mask, past_key_values=kv, cache_position=torch.arange(13))
        assert calls[0][3:] == ([13, 9], [13, 9])  # the prompts in place: each request's valid tokens one run
        for step in range(3):
            expected, got = decode_step(step)
            assert (expected - got).abs().max().item() < ATOL
        # the last step's 13 + 3 and 9 + 3 valid keys gathered: host lengths, no seqused (mistral-swa's window of 5
        # leaves the hole behind: one run, read in place)
        assert calls[-1][1:] == ([0, 16, 28], True, None, None) or name == "mistral-swa"
        monkeypatch.setattr(transformers_ops, "_in_graph", lambda t: True)
        expected, got = decode_step(3)
    assert (expected[0] - got[0]).abs().max().item() < ATOL
    assert got[1].isnan().all() or (name == "mistral-swa" and (expected[1] - got[1]).abs().max().item() < ATOL)


def test_a_decode_step_on_the_fa_path_compiles_to_one_graph_without_host_syncs(monkeypatch):
    """torch._dynamo.explain of a static-cache decode step through FA's padded path (the stand-in): one graph, no
    break; the lengths the kernel reads are computed in the graph (tensors), not read back to the host."""
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama"][:2]))
    calls = on_fa_standin(monkeypatch)
    configure(ours, ServerArgs(), FA_HOST)
    ids, mask = _batch()
    cache = transformers.StaticCache(config=ours.config, max_cache_len=24)
    with torch.no_grad():
        logits = ours(ids, attention_mask=mask, past_key_values=cache).logits[:, -1]
        step = dict(
            input_ids=logits.argmax(-1, keepdim=True),
            attention_mask=torch.cat([mask, torch.ones(2, 11, dtype=mask.dtype)], 1),  # the cache's length: one shape
            past_key_values=cache,
            cache_position=torch.tensor([13]),
        )
        torch._dynamo.reset()
        explained = torch._dynamo.explain(ours)(**step)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert calls[-1][3] == [1, 1]  # one query per request, over its cached keys
    ops = {str(node.target) for graph in explained.graphs for node in graph.graph.nodes}
    assert "attngate.fa_varlen.default" in ops
    assert not {op for op in ops if op in ("item", "tolist", "cpu", "nonzero") or "_local_scalar_dense" in op}


def test_the_fa_path_runs_chunked_local_layers_as_one_row_per_chunk(monkeypatch):
    """Llama 4 through FA's varlen call (the flash_attn.cute stand-in): a chunked-local layer's queries go in one row
    per request and chunk, each over that chunk's keys, chunk starts taken from transformers' mask (after the left
    padding, and in decode over its cache of the last attention_chunk_size - 1 keys); a full layer in one row per
    request. A plan whose chunk is narrower than the model's is refused, naming the layer."""
    from attngate.errors import BatchMetadataError

    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama4-chunked"][:2]))
    calls = on_fa_standin(monkeypatch)
    resolution = configure(ours, ServerArgs(), FA_HOST)
    assert resolution.plan.prefill_backend == "fa3" and resolution.plan.fa.provider == "flash_attn.cute"
    ids, mask = _batch()  # 13 tokens; the second row has 4 of left padding, so its chunks start at 4, 8, 12
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
        assert (expected - got)[mask.bool()].abs().max().item() < ATOL
        chunk_rows = [0, 4, 8, 12, 13, 17, 21, 22]  # 4 + 4 + 4 + 1 queries, then 4 + 4 + 1
        assert calls[0][:3] == (chunk_rows, chunk_rows, True)  # layer 0 is chunked local: each row over its own chunk
        # layer 3 is full attention: the padded batch in place (its DynamicCache head-major)
        kv_heads = ours.config.get_text_config().num_key_value_heads
        assert calls[3] == ([0, 17, 26], [0, kv_heads * 13 + 4, kv_heads * 26], True, [13, 9], [13, 9])
        greedy = dict(attention_mask=mask, max_new_tokens=8, do_sample=False)
        assert torch.equal(ours.generate(ids, **greedy), ref.generate(ids, **greedy))
        _, layers = plan_of(ours)
        for layer in layers:
            if layer.attention_chunk_size:
                layer.attention_chunk_size = 2
        with pytest.raises(
            BatchMetadataError,
            match="layer 0: transformers' mask shows a query 4 keys, more than the plan's attention_chunk_size 2",
        ):
            ours(ids, attention_mask=mask)


@pytest.mark.parametrize("path", ["torch", "fa_varlen"])
def test_cross_attention_keeps_each_querys_images(path, monkeypatch):
    """Mllama's cross-attention layers: which image tiles a text token sees is request data in transformers' mask, kept
    per query (not the union over a request's queries, which showed every token the tiles any token sees). Through FA's
    varlen call (the stand-in) each run of queries that see the same tiles is one non-causal row over those tiles."""
    ref, ours, _ = mllama_pair()
    if path == "fa_varlen":
        calls = on_fa_standin(monkeypatch)
        configure(ours.model.language_model, ServerArgs(), FA_HOST)
    inputs = two_images()
    with torch.no_grad():
        expected, got = ref(**inputs).logits, ours(**inputs).logits
        assert (expected - got).abs().max().item() < ATOL
        greedy = dict(max_new_tokens=4, do_sample=False)
        assert torch.equal(ours.generate(**inputs, **greedy), ref.generate(**inputs, **greedy))
    if path == "fa_varlen":
        # layer 1 (cross): request 0 runs 0-2 (no image yet: Mllama shows it every tile, then zeroes its output), 3-6
        # (first image, 10 keys), 7-11 (second, 10); request 1 the same but its second image's 5 visible keys
        assert calls[1][:3] == ([0, 3, 7, 12, 15, 19, 24], [0, 20, 30, 40, 60, 70, 75], False)


def test_a_vision_towers_attention_is_refused_naming_its_sub_config():
    """One attn_implementation for the whole of Mllama sends the vision tower's attention to attngate, whose plans are
    for language models: a ModelConfigError that says how to give the tower its own implementation."""
    from attngate.errors import ModelConfigError

    _, _, cfg = mllama_pair()
    model = transformers.MllamaForConditionalGeneration._from_config(
        cfg, attn_implementation="attngate", dtype=torch.float32
    ).eval()
    with pytest.raises(
        ModelConfigError, match="attn_implementation=\\{'text_config': 'attngate', 'vision_config': 'sdpa'\\}"
    ):
        with torch.no_grad():
            model(**two_images())


def test_configure_names_a_bad_argument():
    from attngate.errors import UsageError

    with pytest.raises(UsageError, match="model: takes a transformers model .*, not str"):
        configure("Llama-3.1-8B")
    with pytest.raises(UsageError, match="server_args: takes ServerArgs, not dict"):
        configure(
            transformers.LlamaForCausalLM(
                transformers.LlamaConfig(
                    num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4, vocab_size=64
                )
            ),
            {"page_size": 16},
        )


@pytest.mark.parametrize("path", ["torch", "fa_varlen"])
def test_an_encoder_decoder_places_each_attention_module_in_the_plan(path, monkeypatch):
    """Whisper: the encoder's modules carry no layer_idx (non-causal, one spec), each decoder layer a causal self and a
    non-causal cross attention with the layer's index; forward and greedy generate() match eager, and through FA's
    varlen call each of the three runs one row per request with the plan's causality."""
    cfg = transformers.WhisperConfig(
        vocab_size=128,
        num_mel_bins=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        d_model=64,
        encoder_ffn_dim=96,
        decoder_ffn_dim=96,
        max_source_positions=20,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    ref, ours = model_pair(cfg, auto=transformers.AutoModelForSpeechSeq2Seq)
    if path == "fa_varlen":
        calls = on_fa_standin(monkeypatch)
        configure(ours, ServerArgs(), FA_HOST)
    features = torch.randn(2, 16, 40, generator=torch.Generator().manual_seed(1))
    decoder_ids = torch.randint(3, 120, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(input_features=features, decoder_input_ids=decoder_ids).logits
        got = ours(input_features=features, decoder_input_ids=decoder_ids).logits
        assert (expected - got).abs().max().item() < ATOL
        greedy = dict(max_new_tokens=6, do_sample=False)
        assert torch.equal(ours.generate(features, **greedy), ref.generate(features, **greedy))
    resolution, layers = plan_of(ours)
    assert [layer.kind for layer in layers] == ["encoder_only"] * 2 + ["full", "cross_attention"] * 2
    if path == "fa_varlen":  # 20 encoder frames per request, 7 decoder tokens: encoder, self, cross
        assert (calls[0][0], calls[0][2:]) == ([0, 20, 40], (False, [20, 20], [20, 20]))  # encoder, in place
        assert (calls[2][0], calls[2][2:]) == ([0, 7, 14], (True, [7, 7], [7, 7]))  # decoder self attention
        assert calls[3][:3] == ([0, 7, 14], [0, 20, 40], False)  # cross attention: unpadded rows


def test_a_hybrid_model_attends_by_its_attention_layers_plan():
    """Qwen3-Next: linear-attention (Gated DeltaNet) layers 0 and 2 run in transformers, softmax attention layers 1
    and 3 through attngate, found by their model layer index (the plan lists attention layers only); a left-padded
    batch and greedy decoding match eager."""
    cfg = transformers.Qwen3NextConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "full_attention"] * 2,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    ref, ours = model_pair(cfg)
    ids, mask = _batch()
    with torch.no_grad():
        expected, got = ref(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL
    resolution, layers = plan_of(ours)
    assert resolution.model.attention_layer_ids == (1, 3) and len(layers) == 2
    greedy = dict(attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert torch.equal(ours.generate(ids, **greedy), ref.generate(ids, **greedy))
    with pytest.raises(ValueError, match="recurrent state AttngateRuntime does not keep") as err:
        AttngateRuntime(ours)
    assert (
        err.value.problems[0].code == "usage.recurrent-layers"
        and "transformers' own cache" in err.value.problems[0].help
    )


def test_a_bidirectional_decoder_matches_eager():
    """EmbeddingGemma's shape: a Gemma3TextModel with use_bidirectional_attention, every layer non-causal and the
    sliding-window layers' window on both sides of a query (transformers: |q - k| < sliding_window // 2 + 1), in a
    left-padded batch; the plan says so (R33 makes it an embedding server)."""
    overrides = {
        "num_hidden_layers": 4,
        "sliding_window": 6,
        "use_bidirectional_attention": True,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "num_key_value_heads": 1,
        "query_pre_attn_scalar": 8,
        "architectures": ["Gemma3TextModel"],
    }
    ref, ours = model_pair(config_of("gemma-3-1b-it", overrides), auto=transformers.AutoModel)
    ids, mask = _batch()
    with torch.no_grad():
        expected, got = (
            ref(ids, attention_mask=mask).last_hidden_state,
            ours(ids, attention_mask=mask).last_hidden_state,
        )
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL
    resolution, layers = plan_of(ours)
    window = resolution.plan.layer("sliding_window").common
    assert not window.causal and window.use_window and resolution.server_args.is_embedding
    assert {layer.sliding_window_size for layer in layers if layer.kind == "sliding_window"} == {3}  # 6 // 2 each side


def _graph_counter() -> tuple[list, Any]:
    """A torch.compile backend that records each graph dynamo hands it and runs it as traced (no C++ toolchain)."""
    graphs: list = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, backend


# soft-cap with alternating windows, learned sinks, MLA (decompressed K/V), and the plain full-attention case
@pytest.mark.parametrize("name", ["llama", "gemma2-softcap-swa", "gpt-oss-sinks", "deepseek-v3-mla"])
def test_torch_compile_traces_the_plans_attention_in_one_graph(name):
    """``torch.compile(fullgraph=True)`` of a configured model traces attngate's attention with no graph break (a break
    would raise), prefill and static-cache decode match eager; the graph reads the module's decisions, and configure()
    after a config edit retraces it (the graph guards on them), so no stale decision outlives a new plan."""
    file, overrides, _ = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, overrides))
    configure(ours)
    ids, mask = _batch()
    graphs, backend = _graph_counter()
    torch._dynamo.reset()
    eager_forward = ours.forward
    ours.forward = torch.compile(eager_forward, backend=backend, fullgraph=True)
    with torch.no_grad():
        before = ours(ids, attention_mask=mask).logits
        assert (ref(ids, attention_mask=mask).logits - before)[mask.bool()].abs().max().item() < ATOL
        assert len(graphs) == 1
        greedy = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, cache_implementation="static")
        assert torch.equal(ours.generate(ids, **greedy), ref.generate(ids, **greedy))
    if name != "gemma2-softcap-swa":
        return
    traced = len(graphs)
    ours.config.attn_logit_softcapping = 0.01  # read by the next configure() only: transformers keeps its own
    configure(ours)
    with torch.no_grad():
        got = ours(ids, attention_mask=mask).logits  # before any eager call, which would refresh the decisions itself
        expected = eager_forward(ids, attention_mask=mask).logits
    assert len(graphs) == traced + 1  # retraced under the new plan
    assert (expected - got)[mask.bool()].abs().max().item() < ATOL
    assert (before - got)[
        mask.bool()
    ].abs().max().item() > 1e-3  # the new soft-cap is what it attends with (noise: 1e-6)


def test_torch_compile_of_a_model_never_configured_resolves_its_plan_outside_the_graph():
    """A model compiled before any configure() or eager call: fullgraph=True refuses it, naming configure(); without
    fullgraph the first trace resolves the plan outside the graph and the model matches eager."""
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama"][:2]))
    ids, mask = _batch()
    torch._dynamo.reset()
    strict = torch.compile(ours.forward, backend=_graph_counter()[1], fullgraph=True)
    with torch.no_grad(), pytest.raises(Exception, match=r"configure\(model\) before torch.compile"):
        strict(ids, attention_mask=mask)
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama"][:2]))
    torch._dynamo.reset()
    ours.forward = torch.compile(ours.forward, backend=_graph_counter()[1])
    with torch.no_grad():
        assert (ref(ids, attention_mask=mask).logits - ours(ids, attention_mask=mask).logits)[
            mask.bool()
        ].abs().max().item() < ATOL
    assert plan_of(ours) is not None


def test_torch_compile_breaks_the_graph_only_where_a_chunked_local_mask_is_checked():
    """Llama 4's chunked-local layers check transformers' mask on the host (a graph break); compiled without fullgraph
    the model still matches eager, prefill and static-cache decode."""
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama4-chunked"][:2]))
    ids, mask = _batch()
    graphs, backend = _graph_counter()
    torch._dynamo.reset()
    ours.forward = torch.compile(ours.forward, backend=backend)
    with torch.no_grad():
        assert (ref(ids, attention_mask=mask).logits - ours(ids, attention_mask=mask).logits)[
            mask.bool()
        ].abs().max().item() < ATOL
        assert len(graphs) > 1
        greedy = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, cache_implementation="static")
        assert torch.equal(ours.generate(ids, **greedy), ref.generate(ids, **greedy))


def test_a_compiled_model_runs_eagerly_inside_the_runtime():
    """AttngateRuntime over a model whose forward is torch.compile'd: the runtime's forwards run it eagerly, so its
    attention goes through the runtime's paged cache and matches eager transformers (prefill, then decode)."""
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama"][:2]))
    graphs, backend = _graph_counter()
    torch._dynamo.reset()
    ours.forward = torch.compile(ours.forward, backend=backend, fullgraph=True)
    prompt = torch.randint(1, 96, (9,), generator=torch.Generator().manual_seed(2))
    rt = AttngateRuntime(ours, page_size=4, num_slots=64)
    req = rt.add_request()
    with torch.no_grad():
        expected = ref(prompt[None]).logits[0]
        got = rt.extend({req: prompt[:8]})
        assert (expected[:8] - got).abs().max().item() < ATOL
        assert (expected[8] - rt.decode({req: prompt[8:]})[0]).abs().max().item() < ATOL
    assert graphs == []  # nothing was traced: the runtime's forwards ran eagerly


def test_torch_compile_keeps_the_fa_path_as_one_op_of_the_graph(monkeypatch):
    """On a GPU kernel (here FA's varlen call, the flash_attn.cute stand-in) each attention call is one opaque op
    (``attngate::fa_varlen``) of a single graph, ``fullgraph=True``, and the compiled model matches eager,
    prefill and static-cache decode."""
    ref, ours = model_pair(config_of(*MODELS_UNDER_TEST["llama"][:2]))
    calls = on_fa_standin(monkeypatch)
    configure(ours, ServerArgs(), FA_HOST)
    ids, mask = _batch()
    graphs, backend = _graph_counter()
    torch._dynamo.reset()
    ours.forward = torch.compile(ours.forward, backend=backend, fullgraph=True)
    with torch.no_grad():
        assert (ref(ids, attention_mask=mask).logits - ours(ids, attention_mask=mask).logits)[
            mask.bool()
        ].abs().max().item() < ATOL
        assert len(graphs) == 1 and len(calls) == ours.config.num_hidden_layers
        ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
        assert ops.count("attngate.fa_varlen.default") == ours.config.num_hidden_layers
        greedy = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, cache_implementation="static")
        assert torch.equal(ours.generate(ids, **greedy), ref.generate(ids, **greedy))
