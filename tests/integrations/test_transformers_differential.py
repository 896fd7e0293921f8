"""Differential tests against transformers' own eager attention, on models built from the real configs.

Each model is a real config of ``examples/models/`` truncated to 2-4 layers and a small width
(random weights, fixed seed, float32 on the CPU). Two prompts of different lengths go through
attngate together: chunked prefill (EXTEND without, then with, a cached prefix), then token-by-token
DECODE through the paged cache. Every position's logits must equal those of one full forward of
transformers' eager attention within 2e-4 (float32 accumulation on both sides; the observed
differences are about 1e-6).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


from attngate import Platform, ServerArgs  # noqa: E402
from attngate.backends.flashattention import FlashAttentionBackend  # noqa: E402
from attngate.backends.flashinfer import FlashInferBackend  # noqa: E402
from attngate.backends.flashinfer_mla import FlashInferMLABackend  # noqa: E402
from attngate.backends.plan_backend import PlanBackend  # noqa: E402
from attngate.backends.reference import ReferenceBackend  # noqa: E402
from attngate.backends.runtime.kv_cache import MLATokenToKVPool  # noqa: E402
from attngate.facts.modes import ForwardMode, LayerKind  # noqa: E402
from attngate.integrations.transformers import AttngateRuntime  # noqa: E402
from tests.support.transformers_models import MLA, MODELS_UNDER_TEST, config_of, model_pair  # noqa: E402

ATOL = 2e-4
PROMPTS = (23, 17)  # tokens of the two requests
CHUNKS = (9, 6)  # first EXTEND, second EXTEND (over the cached prefix); the rest is decoded


def _run_and_compare(
    name: str,
    page_size: int,
    flags: tuple[str, ...] = (),
    backend_cls=ReferenceBackend,
    after_build=lambda: None,
    head_dim: int | None = None,
) -> AttngateRuntime:
    """``after_build``: runs once the models are built (installs the kernel stand-ins, which transformers' import
    probes at model build must not see). ``head_dim``: instead of the shrunk model's (FlashInfer runs 64, 128, 256)."""
    file, overrides, kinds = MODELS_UNDER_TEST[name]
    ref, ours = model_pair(config_of(file, {**overrides, **({"head_dim": head_dim} if head_dim else {})}))
    after_build()
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 96, (n,), generator=gen) for n in PROMPTS]
    with torch.no_grad():
        full = [ref(p[None]).logits[0] for p in prompts]

    args = ServerArgs.from_flags([*flags, "--page-size", str(page_size)])
    rt = AttngateRuntime(ours, server_args=args, page_size=page_size, num_slots=256, backend_cls=backend_cls)
    assert kinds == set(rt.facts.layer_kinds)
    reqs = [rt.add_request() for _ in prompts]
    got: list[list[torch.Tensor]] = [[], []]
    start = 0
    for n in CHUNKS:  # EXTEND: both requests in one forward, the second chunk over the cached prefix
        out = rt.extend({r: p[start : start + n] for r, p in zip(reqs, prompts)})
        got[0].append(out[:n])
        got[1].append(out[n:])
        start += n
    for i in range(start, max(PROMPTS)):  # DECODE, batch shrinking as the shorter prompt ends
        live = [(k, r) for k, (r, p) in enumerate(zip(reqs, prompts)) if i < len(p)]
        out = rt.decode({r: prompts[k][i] for k, r in live})
        for row, (k, _) in enumerate(live):
            got[k].append(out[row : row + 1])
    for k in range(2):
        diff = (torch.cat(got[k]) - full[k]).abs().max().item()
        assert diff < ATOL, f"{name}, page_size {page_size}, request {k}: max |diff| {diff:.2e}"
    return rt


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("name", sorted(n for n in MODELS_UNDER_TEST if "mla" not in n))
def test_chunked_prefill_and_decode_match_transformers(name, page_size):
    _run_and_compare(name, page_size)


# (model, flags, page_size, the backend class of each side): the runtime on the plan's own backends; FlashInfer's cases
# at head dim 64, the smallest its kernels run (flashinfer.head-dims)
ON_KERNELS = [
    ("llama", "--attention-backend flashinfer", 16, (FlashInferBackend, FlashInferBackend)),
    ("llama", "--attention-backend fa3", 1, (FlashAttentionBackend, FlashAttentionBackend)),
    (
        "llama",
        "--prefill-attention-backend fa3 --decode-attention-backend flashinfer",
        16,
        (FlashAttentionBackend, FlashInferBackend),
    ),
    ("mistral-swa", "--attention-backend flashinfer", 1, (FlashInferBackend, FlashInferBackend)),
    ("gemma2-softcap-swa", "--attention-backend flashinfer", 16, (FlashInferBackend, FlashInferBackend)),
    ("gemma2-softcap-swa", "--attention-backend fa3", 16, (FlashAttentionBackend, FlashAttentionBackend)),
    ("gpt-oss-sinks", "", 16, (FlashAttentionBackend, FlashAttentionBackend)),
    ("llama4-chunked", "", 4, (FlashAttentionBackend, FlashAttentionBackend)),
    ("deepseek-v2-mla", "", 64, (FlashInferMLABackend, FlashInferMLABackend)),
]


@pytest.mark.parametrize(
    "name, flags, page_size, classes", ON_KERNELS, ids=[f"{n}-{f or 'default'}-{p}" for n, f, p, _ in ON_KERNELS]
)
def test_the_runtime_on_the_plans_kernel_backends_matches_transformers(name, flags, page_size, classes, monkeypatch):
    """AttngateRuntime's default on CUDA, PlanBackend, run on the CPU through the kernel stand-ins: chunked prefill and
    decode on the backends the plan names (prefill and decode apart where it splits them) match eager attention."""
    import sys

    from tests.support.standins import flash_attn_cute, flashinfer

    def kernels():
        monkeypatch.setitem(sys.modules, "flashinfer", flashinfer.module())
        for module_name, module in flash_attn_cute.modules().items():
            monkeypatch.setitem(sys.modules, module_name, module)

    rt = _run_and_compare(
        name,
        page_size,
        tuple(flags.split()),
        backend_cls=PlanBackend,
        after_build=kernels,
        head_dim=64 if "flashinfer" in flags else None,
    )
    ran = tuple(type(rt.backend.backend_of(mode)) for mode in (ForwardMode.EXTEND, ForwardMode.DECODE))
    assert ran == classes


@pytest.mark.parametrize(
    "flags, extend_form", [((), "non_absorbed"), (("--disable-chunked-prefix-cache",), "non_absorbed_without_prefix")]
)
@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("name", ["deepseek-v2-mla", "deepseek-v3-mla"])
def test_mla_latent_cache_matches_transformers(name, page_size, flags, extend_form):
    """Chunked prefill and decode of DeepSeek-V2/V3 through the latent cache: 576 values per token, absorbed decode."""
    rt = _run_and_compare(name, page_size, flags)
    assert isinstance(rt.pool, MLATokenToKVPool) and rt.pool.kv_buffer[0].shape[1:] == (1, 576)
    assert (
        rt.plan.mode("extend").common.mla_form == extend_form and rt.plan.mode("decode").common.mla_form == "absorbed"
    )
    assert (
        rt.plan.decode_backend == "flashinfer"
    )  # SM90 without FA3: FlashInfer MLA (the plan names a backend that runs)


def test_a_small_mla_model_runs_on_the_cpu_where_the_default_backend_cannot():
    """kv_lora_rank 48 / qk_rope_head_dim 16: the default (FlashInfer MLA on SM90 without FA3) is refused by its
    kernels' limits, the plan falls back to triton and says why, and the reference backend matches transformers."""
    rt = _run_and_compare("deepseek-v2-small-mla", 16)
    assert rt.plan.prefill_backend == rt.plan.decode_backend == "triton"
    fallback = rt.resolution.adjustments[0]
    assert fallback.rule == "default-backend.fallback" and "flashinfer.mla-head-dims" in fallback.message
    assert rt.resolution.default_refusal[0] == "flashinfer"


def test_mla_embedding_fast_path_flags_still_write_the_latent_cache():
    """Seed 000: an MLA embedding model with the fast-path flags keeps its cache, and reads back what it wrote."""
    ref, ours = model_pair(config_of("DeepSeek-V2-Lite", MLA))
    ids = torch.randint(1, 96, (21,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = ref(ids[None]).logits[0]
    fa3_host = Platform.from_name("sm90", kernels=["flashinfer", "flash_attn.cute", "flash_attn_interface"])
    args = ServerArgs.from_flags(
        "--attention-backend fa3 --is-embedding --chunked-prefill-size -1 --disable-radix-cache".split()
    )
    rt = AttngateRuntime(ours, server_args=args, platform=fa3_host, page_size=1, num_slots=64)
    assert rt.plan.fa.skip_kv_cache is False
    req = rt.add_request()
    got = torch.cat(
        [rt.extend({req: ids[:13]}), rt.extend({req: ids[13:]})]
    )  # the second chunk reads the first from the cache
    assert (got - expected).abs().max().item() < ATOL
    slots = rt.req_to_token_pool.req_to_token[req, :21].long()
    assert bool(rt.pool.kv_buffer[0][slots].abs().sum(-1).gt(0).all())  # every token's latent was written


def test_runtime_refuses_a_model_built_without_attngate_attention():
    ref, _ = model_pair(config_of("Llama-3.1-8B", {}))
    with pytest.raises(ValueError, match="attn_implementation"):
        AttngateRuntime(ref)


def test_runtime_arguments_are_checked_together_and_the_pool_pages_as_the_plan():
    from attngate.errors import BatchMetadataError, UsageError

    ref, ours = model_pair(config_of("Llama-3.1-8B", {}))
    with pytest.raises(UsageError) as bad:  # every problem at once, nothing allocated
        AttngateRuntime(
            ref, server_args={"page_size": 16}, page_size=0, num_slots=0, max_requests=-1, max_context_len=2.5
        )
    assert [p.where for p in bad.value.problems] == [
        "model",
        "server_args",
        "page_size",
        "num_slots",
        "max_requests",
        "max_context_len",
    ]
    assert [p.code for p in bad.value.problems] == [
        "usage.attn-implementation",
        "usage.argument-type",
        "usage.count",
        "usage.count",
        "usage.count",
        "usage.count",
    ]
    assert bad.value.problems[0].help == "build the model with attn_implementation='attngate', as AttngateRuntime needs"
    with pytest.raises(UsageError, match="model: .* was built with attn_implementation=None"):
        AttngateRuntime(torch.nn.Linear(2, 2))
    with pytest.raises(UsageError, match="page_size: 4 differs from server_args.page_size 16"):
        AttngateRuntime(ours, page_size=4, server_args=ServerArgs(page_size=16))
    with pytest.raises(UsageError, match="num_slots: 100 is not a multiple of the plan's page_size 16"):
        AttngateRuntime(ours, server_args=ServerArgs(page_size=16), num_slots=100)
    # SM100 FA4 pages by 128 (R18): without a page_size of its own the pool takes the plan's
    blackwell = Platform.from_name("sm100", kernels=["flashinfer", "flash_attn.cute"])
    rt = AttngateRuntime(ours, server_args=ServerArgs(attention_backend="fa4"), platform=blackwell, num_slots=512)
    assert rt.plan.common.page_size == rt.pool.page_size == rt.page_size == 128
    with pytest.raises(UsageError, match="page_size: 16 asked, but the plan pages by 128"):
        AttngateRuntime(ours, server_args=ServerArgs(attention_backend="fa4"), platform=blackwell, page_size=16)
    req = rt.add_request()
    with pytest.raises(UsageError, match="new_tokens: names no request"):
        rt.decode({})
    with pytest.raises(UsageError, match="new_tokens: takes a dict"):
        rt.extend([1, 2, 3])
    with pytest.raises(BatchMetadataError, match=f"request {req}: no new tokens"):
        rt.extend({req: []})
    ids = torch.tensor([5, 7, 9], dtype=torch.uint8)  # any integer dtype is a token id
    with torch.no_grad():
        expected = ref(ids.long()[None]).logits[0]
    assert (rt.extend({req: ids}) - expected).abs().max().item() < ATOL
    # a freed request gives back its row and pages; the next request reuses them and reads only its own tokens
    free_pages = rt.allocator.free_pages
    rt.free_request(req)
    assert rt.allocator.free_pages == free_pages + 1
    again = rt.add_request()
    assert again == req
    other = torch.tensor([11, 3, 8, 8])
    with torch.no_grad():
        expected = ref(other[None]).logits[0]
    assert (rt.extend({again: other}) - expected).abs().max().item() < ATOL


def test_encoder_only_embedding_model_matches_transformers():
    cfg = config_of("all-MiniLM-L6-v2", {"num_key_value_heads": None, "head_dim": None, "intermediate_size": 128})
    ref, ours = model_pair(cfg, transformers.AutoModel)
    ids = torch.randint(1, 96, (19,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = ref(ids[None]).last_hidden_state[0]
    rt = AttngateRuntime(ours, page_size=16, num_slots=64)
    assert set(rt.facts.layer_kinds) == {LayerKind.ENCODER_ONLY}
    assert rt.plan.layer("encoder_only").common.causal is False
    got = rt.extend({rt.add_request(): ids})
    assert (got - expected).abs().max().item() < ATOL
    assert rt.pool.k_buffer[0].abs().sum() == 0  # encoder-only layers write no KV cache


def test_a_failed_forward_leaves_every_request_as_it_was():
    """A token id past the vocabulary is refused before anything changes; a forward that fails inside the
    model rolls every request back, so the next decode still matches transformers."""
    from attngate.errors import BatchMetadataError, UsageError

    ref, ours = model_pair(config_of("Llama-3.1-8B", {}))
    rt = AttngateRuntime(ours, page_size=4, num_slots=256)
    req = rt.add_request()
    prompt = torch.arange(1, 8)
    rt.extend({req: prompt})
    state = (rt._requests[req].seq_len, list(rt._requests[req].pages))
    with pytest.raises(BatchMetadataError, match=f"request {req}.*token ids"):
        rt.extend({req: torch.tensor([5, ours.config.vocab_size + 3])})
    with pytest.raises(BatchMetadataError, match="request 99: unknown request") as unknown:
        rt.decode({99: 1})
    assert unknown.value.problems[0].code == "batch-metadata.unknown-request"
    assert unknown.value.problems[0].help == "add_request first"
    with pytest.raises(BatchMetadataError) as bad:  # every bad request of the batch, none applied
        rt.extend({req: torch.ones(2, 2, dtype=torch.long), 98: "abc"})
    assert [p.where for p in bad.value.problems] == [f"request {req}", "request 98"]
    with pytest.raises(
        BatchMetadataError, match=f"request {req}: 7 cached \\+ 2048 new tokens exceed max_context_len 2048"
    ):
        rt.extend({req: torch.ones(2048, dtype=torch.long)})
    with pytest.raises(BatchMetadataError, match="decode takes one token per request, not 2"):
        rt.decode({req: [1, 2]})
    with pytest.raises(UsageError, match="extend runs extend, target_verify, draft_extend_v2, not 'idle'"):
        rt.extend({req: [1]}, mode="idle")
    with pytest.raises(BatchMetadataError, match="request 97: unknown request"):
        rt.free_request(97)
    real_forward = rt.model.forward
    rt.model.forward = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("inside the model"))
    with pytest.raises(RuntimeError, match="inside the model"):
        rt.extend({req: torch.tensor([3, 4, 5, 6, 7])})  # grows by a page before failing
    rt.model.forward = real_forward
    assert (rt._requests[req].seq_len, rt._requests[req].pages) == state
    got = rt.decode({req: 9})[0]
    with torch.no_grad():
        expected = ref(torch.cat([prompt, torch.tensor([9])])[None]).logits[0, -1]
    assert (got - expected).abs().max().item() < ATOL


@pytest.mark.parametrize("page_size", [1, 16])
def test_embedding_gemma_runs_as_an_embedding_server_on_the_paged_path(page_size):
    """A Gemma3TextModel with use_bidirectional_attention through AttngateRuntime: R33 makes it an embedding server
    without a KV pool (the plan on sm90), its hidden states match eager for uneven requests in one batch, and a
    decode or an extend over a cached prefix (which would read K/V nothing wrote) is refused, naming the request."""
    from attngate.errors import BatchMetadataError

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
    rt = AttngateRuntime(ours, page_size=page_size, num_slots=256, platform=Platform.from_name("sm90"))
    args = rt.resolution.server_args
    assert (
        args.is_embedding
        and args.prefill_only_disable_kv_cache
        and not rt.plan.layer("sliding_window").common.write_kv_cache
    )
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 96, (n,), generator=gen) for n in (13, 5, 20)]
    reqs = [rt.add_request() for _ in prompts]
    got = rt.extend(dict(zip(reqs, prompts)))
    with torch.no_grad():
        expected = torch.cat([ref(p[None]).last_hidden_state[0] for p in prompts])
    assert (got - expected).abs().max().item() < 1e-4
    with pytest.raises(
        BatchMetadataError, match=f"request {reqs[0]}: a layer without KV cache cannot attend to a cached prefix"
    ):
        rt.decode({reqs[0]: 3})


def test_an_fp8_kv_cache_flag_builds_an_fp8_pool_and_stays_close_to_eager():
    """--kv-cache-dtype fp8_e4m3: the runtime's pool stores what the plan says (common.kv_cache_dtype), so every cached
    K/V is rounded to FP8, and the logits stay close to eager's (not to 1e-4: that is what FP8 costs)."""
    ref, ours = model_pair(
        config_of("Llama-3.1-8B", {"head_dim": 64})
    )  # the default for FP8 on Hopper: FlashInfer, which runs 64
    prompt = torch.randint(1, 96, (20,), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = ref(prompt[None]).logits[0]
    rt = AttngateRuntime(
        ours,
        server_args=ServerArgs.from_flags(["--kv-cache-dtype", "fp8_e4m3", "--page-size", "16"]),
        page_size=16,
        num_slots=256,
    )
    assert rt.plan.common.kv_cache_dtype == "fp8_e4m3" and rt.pool.k_buffer[0].dtype == torch.float8_e4m3fn
    req = rt.add_request()
    got = [rt.extend({req: prompt[:12]})] + [rt.decode({req: prompt[i]}) for i in range(12, 20)]
    diff = (torch.cat(got) - full).abs().max().item()
    assert 1e-4 < diff < 0.1 * full.abs().max().item(), diff
