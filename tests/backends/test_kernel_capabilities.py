"""The plan promises only what the kernels run: over every model config x candidate backend x GPU x
installed kernels, a plan that resolves names backends whose own ``refusals()`` accept every layer.

The rules (rules.yaml, "What the installed kernels run") and the backends' refusal functions are
written independently; this test is where they must agree.
"""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from attngate import ModelFacts, PlanError, Platform, ServerArgs, resolve  # noqa: E402
from attngate.backends.capabilities import REFUSALS, fa_refusals, flashinfer_refusals  # noqa: E402
from attngate.backends.capabilities import refusals as backend_refusals  # noqa: E402
from attngate.backends.runtime.layer import layers_from_model  # noqa: E402
from attngate.errors import ServerArgsError  # noqa: E402
from attngate.plan.backends import CANDIDATE_BACKENDS  # noqa: E402
from tests.support.helpers import MODELS, embedding_gemma, field_values  # noqa: E402

KERNELS = {
    "gpu-extra": ["flashinfer", "flash_attn.cute"],
    "with-fa3": ["flashinfer", "flash_attn.cute", "flash_attn_interface"],
}
# those the configs below can trip
CAPABILITY_RULES = {
    "fa.mla-needs-absorbed-kernel",
    "flashinfer.no-chunked-local",
    "flashinfer.no-bidirectional-window",
    "fa.cute-pages-on-sm90-and-sm100-only",
    "flashinfer.head-dims",
}
# every config of examples/models, and EmbeddingGemma's (bidirectional sliding-window layers)
CONFIGS = [(path.stem, lambda path=path: ModelFacts.from_hf_config(path)) for path in sorted(MODELS.glob("*.json"))] + [
    ("embeddinggemma", embedding_gemma)
]


def refusals(backend: str, plan, layers, sm_major: int):
    if backend not in REFUSALS:
        return []  # triton, torch_native: SGLang's, not attngate's
    return backend_refusals(backend, plan, layers, sm_major)


def test_every_resolved_plan_names_backends_that_accept_every_layer():
    fired: set[str] = set()
    accepted = 0
    for (name, read), backend, gpu, kernels in itertools.product(
        CONFIGS, CANDIDATE_BACKENDS, ("sm80", "sm90", "sm100", "sm120"), KERNELS
    ):
        facts = read()
        platform = Platform.from_name(gpu, kernels=KERNELS[kernels], runs_sglang=False)  # attngate's backends run it
        try:
            plan = resolve(ServerArgs(attention_backend=backend), facts, platform).plan
        except PlanError as err:
            fired |= {v.rule for v in err.violations} & CAPABILITY_RULES
            continue
        layers = layers_from_model(facts)
        for side in {plan.prefill_backend, plan.decode_backend}:
            problems = refusals(side, plan, layers, platform.sm_major)
            assert not problems, (
                f"{name} --attention-backend {backend} on {gpu} ({kernels}): plan names {side}, which refuses: {problems}"
            )
            accepted += side in REFUSALS
    assert fired == CAPABILITY_RULES  # each capability rule keeps some configuration off a backend that would refuse it
    assert accepted > 100


@pytest.mark.parametrize(
    "model, gpu, kernels, backend",
    [
        ("DeepSeek-V3", "sm90", "with-fa3", "fa3"),  # FA3 runs absorbed MLA on Hopper
        ("DeepSeek-V2-Lite", "sm100", "gpu-extra", "fa4"),  # FA4 on Blackwell
        ("DeepSeek-V2-Lite", "sm90", "gpu-extra", "flashinfer"),  # FlashInfer MLA
        ("Llama-4-Scout-17B-16E-Instruct", "sm90", "gpu-extra", "fa3"),  # local virtual batches through flash_attn.cute
    ],
)
def test_mla_and_chunked_local_models_resolve_where_a_kernel_runs_them(model, gpu, kernels, backend):
    facts = ModelFacts.from_hf_config(MODELS / f"{model}.json")
    plan = resolve(ServerArgs(attention_backend=backend), facts, Platform.from_name(gpu, kernels=KERNELS[kernels])).plan
    assert plan.prefill_backend == plan.decode_backend == backend
    assert not refusals(backend, plan, layers_from_model(facts), int(gpu[2:-1]))


def test_default_backend_for_mla_on_hopper_follows_the_installed_kernels():
    facts = ModelFacts.from_hf_config(MODELS / "DeepSeek-V2-Lite.json")
    without = resolve(ServerArgs(), facts, Platform.from_name("sm90", kernels=KERNELS["gpu-extra"]))
    with_fa3 = resolve(ServerArgs(), facts, Platform.from_name("sm90", kernels=KERNELS["with-fa3"]))
    assert (
        without.plan.decode_backend == "flashinfer"
        and any("flash_attn_interface" in w for w in without.warnings) is False
    )
    assert any(a.rule == "default-backend.mla-hopper-without-fa3" for a in without.adjustments)
    assert with_fa3.plan.decode_backend == "fa3" and with_fa3.plan.fa.provider == "flash_attn_interface"


def test_flashinfer_mla_refuses_another_latent_geometry_in_the_plan_and_in_the_backend():
    raw = json.loads((MODELS / "DeepSeek-V2-Lite.json").read_text())
    facts = ModelFacts.from_hf_dict({**raw, "kv_lora_rank": 256}, source="DeepSeek-V2-Lite, kv_lora_rank 256")
    with pytest.raises(PlanError) as err:
        resolve(
            ServerArgs(attention_backend="flashinfer"), facts, Platform.from_name("sm90", kernels=KERNELS["gpu-extra"])
        )
    assert [v.rule for v in err.value.violations] == ["flashinfer.mla-head-dims"]
    deepseek = resolve(
        ServerArgs(attention_backend="flashinfer"),
        ModelFacts.from_hf_dict(raw, source="DeepSeek-V2-Lite"),
        Platform.from_name("sm90", kernels=KERNELS["gpu-extra"]),
    ).plan
    assert flashinfer_refusals(deepseek, layers_from_model(facts))


@pytest.mark.parametrize("edit", [{"attn_logit_softcapping": 1.0}, {"sliding_window": 64}])
def test_flashinfer_mla_refuses_a_cap_or_window_and_the_default_moves_on(edit):
    """An MLA config that sets a soft-cap or a window: FlashInfer MLA is refused (it takes neither), in the plan and in
    the backend; the default backend on SM90 falls back to one that runs it or refuses with every candidate named."""
    raw = {**json.loads((MODELS / "DeepSeek-V2-Lite.json").read_text()), **edit}
    facts = ModelFacts.from_hf_dict(raw, source=f"DeepSeek-V2-Lite, {edit}")
    with pytest.raises(PlanError) as err:
        resolve(
            ServerArgs(attention_backend="flashinfer"), facts, Platform.from_name("sm90", kernels=KERNELS["gpu-extra"])
        )
    assert "flashinfer.mla-full-attention-only" in {v.rule for v in err.value.violations}
    try:
        plan = resolve(ServerArgs(), facts, Platform.from_name("sm90", kernels=KERNELS["with-fa3"])).plan
    except PlanError as refused:
        assert refused.candidates
    else:
        assert plan.decode_backend != "flashinfer"


def test_a_missing_kernel_package_refuses_its_backend():
    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    with pytest.raises(PlanError) as err:
        resolve(
            ServerArgs(attention_backend="flashinfer"), facts, Platform.from_name("sm90", kernels=["flash_attn.cute"])
        )
    assert [v.rule for v in err.value.violations] == ["kernels.flashinfer-installed"]
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(attention_backend="fa4"), facts, Platform.from_name("sm100", kernels=["flashinfer"]))
    assert "kernels.flash-attn-installed" in [v.rule for v in err.value.violations]
    plan = resolve(
        ServerArgs(attention_backend="fa3"), facts, Platform.from_name("sm90", kernels=["flash_attn_interface"])
    ).plan
    assert plan.fa.provider == "flash_attn_interface"  # FA3 alone serves fa3


def test_the_platform_never_probes_behind_an_explicit_gpu():
    """A named GPU without its kernels is a stock SGLang install there (sgl_kernel's FA3 on SM80-SM90 only), whatever
    this host has installed."""
    assert Platform.from_name("sm90").kernel_providers == tuple(KERNELS["with-fa3"])
    assert Platform.from_name("sm90") == Platform.from_name("sm90", kernels=["sglang"])
    assert Platform.from_name("sm100").kernel_providers == tuple(KERNELS["gpu-extra"])
    assert Platform.from_name("sm90").kernel_source == "sglang"
    assert Platform.from_name("sm90", kernels=["attngate"]).kernel_providers == tuple(KERNELS["gpu-extra"])


def test_the_flashinfer_backend_refuses_a_window_after_the_query():
    """window_left bounds a window before the query only: a bidirectional sliding-window layer is refused by the
    backend too, whatever plan it is handed."""
    facts = embedding_gemma()
    plan = resolve(
        ServerArgs(attention_backend="fa3"), facts, Platform.from_name("sm90", kernels=KERNELS["gpu-extra"])
    ).plan
    layers = layers_from_model(facts)
    problems = flashinfer_refusals(plan, layers)
    assert problems and {p.where for p in problems} == {
        f"layer {layer.layer_id}" for layer in layers if layer.kind == "sliding_window"
    }
    assert not fa_refusals(plan, layers, 9)


@pytest.mark.parametrize("name", ["Qwen3-8B", "DeepSeek-V2-Lite"])
def test_a_multi_item_scoring_plan_is_refused_by_the_flashinfer_backend_it_names(name):
    """SGLang's FlashInfer backend scores items with MultiItemScoringParams; attngate's does not, and says so at
    construction (MHA and, through flashinfer_mla, MLA) rather than run plain causal attention over the items."""
    facts = ModelFacts.from_hf_config(MODELS / f"{name}.json")
    plan = resolve(
        ServerArgs(attention_backend="flashinfer", enable_mis=True),
        facts,
        Platform.from_name("sm90", kernels=KERNELS["gpu-extra"]),
    ).plan
    assert plan.flashinfer.multi_item_scoring
    assert [p.where for p in flashinfer_refusals(plan, layers_from_model(facts))][:1] == [
        "flashinfer.multi_item_scoring"
    ]


def test_every_attngate_backend_refuses_a_plan_over_the_unified_memory_pool():
    """Under --enable-unified-memory SGLang reads page ids through its index translator; attngate's backends read
    their own pool's ids, so they refuse such a plan at construction (reference backend included)."""
    from attngate.backends.reference import ReferenceBackend
    from attngate.backends.runtime.kv_cache import MHATokenToKVPool
    from attngate.errors import BackendRefusal

    facts = ModelFacts.from_hf_config(MODELS / "Llama-3.1-8B.json")
    plan = resolve(
        ServerArgs(enable_unified_memory=True), facts, Platform.from_name("sm90", kernels=KERNELS["gpu-extra"])
    ).plan
    assert plan.common.unified_kv_pool
    pool = MHATokenToKVPool(64, 1, 1, 8, 128)
    with pytest.raises(BackendRefusal, match="common.unified_kv_pool"):
        ReferenceBackend(plan, pool, torch.zeros(2, 64, dtype=torch.int32), layers_from_model(facts, plan)[:1])


def _llama(**overrides):
    raw = json.loads((MODELS / "Llama-3.1-8B.json").read_text())
    return ModelFacts.from_hf_dict({**raw, **overrides}, source=f"Llama-3.1-8B {overrides}")


@pytest.mark.parametrize(
    "facts, args, gpu, rule",
    [
        (_llama(), {"attention_backend": "fa4"}, "sm120", "fa.cute-pages-on-sm90-and-sm100-only"),
        (_llama(), {"attention_backend": "fa3"}, "sm86", "fa.cute-pages-on-sm90-and-sm100-only"),
        (_llama(), {"attention_backend": "fa3", "kv_cache_dtype": "fp8_e4m3"}, "sm90", "fa.cute-fp8-kv-on-sm100-only"),
        (_llama(head_dim=512), {"attention_backend": "fa3"}, "sm90", "fa.cute-head-dims"),
        (_llama(head_dim=256), {"attention_backend": "fa4"}, "sm90", None),
        (_llama(head_dim=192), {"attention_backend": "fa4"}, "sm100", "fa.cute-head-dims"),
        (_llama(head_dim=256), {"attention_backend": "fa4"}, "sm100", None),
        (_llama(head_dim=4), {"attention_backend": "fa3"}, "sm90", "fa.cute-head-dims"),  # below 8
        (_llama(head_dim=100), {"attention_backend": "fa3"}, "sm90", "fa.cute-head-dims"),  # not a multiple of 8
        (_llama(head_dim=100), {"attention_backend": "fa4"}, "sm100", "fa.cute-head-dims"),
        (_llama(head_dim=72), {"attention_backend": "fa3"}, "sm90", None),
    ],
)
def test_flash_attn_cute_limits_refuse_in_the_plan_and_in_the_backend(facts, args, gpu, rule):
    """flash_attn.cute's own limits (paged KV on SM90/SM100 only, FP8 on SM100 only, head dims): the plan refuses what
    the kernel would assert on at its first launch, and the backend's refusals say the same (FP8 aside: attngate's FA
    backend reads 16-bit caches only, on every GPU)."""
    platform = Platform.from_name(gpu, kernels=KERNELS["gpu-extra"], runs_sglang=False)
    layers = layers_from_model(facts)
    if rule is None:
        plan = resolve(ServerArgs(**args), facts, platform).plan
        assert plan.fa.provider == "flash_attn.cute" and not fa_refusals(plan, layers, platform.sm_major)
        return
    with pytest.raises(PlanError) as err:
        resolve(ServerArgs(**args), facts, platform)
    assert [v.rule for v in err.value.violations] == [rule]
    # the same configuration with the limit's check left out of the plan: the backend refuses it on its own
    plan = resolve(ServerArgs(**{**args, "attention_backend": "torch_native"}), facts, platform).plan
    fa_plan = plan.model_copy(
        update={"prefill_backend": args["attention_backend"], "decode_backend": args["attention_backend"]}
    )
    assert fa_refusals(fa_plan, layers, platform.sm_major)


@pytest.mark.parametrize(
    "args, gpu, rule",
    [
        ({"kv_cache_dtype": "fp8_e4m3"}, "sm90", "default-backend.mha-hopper-fp8-without-fa3"),
        ({"enable_deterministic_inference": True}, "sm80", "default-backend.deterministic-ampere-without-fa3"),
    ],
)
def test_a_default_of_fa3_that_flash_attn_cute_would_refuse_goes_to_flashinfer(args, gpu, rule):
    """SGLang's fa3 defaults assume sgl_kernel's FA3; without flash_attn_interface the default is FlashInfer (adjusted,
    with the reason), and with it the default stays fa3 on FA3's own kernels."""
    facts = _llama()
    without = resolve(ServerArgs(**args), facts, Platform.from_name(gpu, kernels=KERNELS["gpu-extra"]))
    assert without.plan.prefill_backend == without.plan.decode_backend == "flashinfer"
    assert [a.rule for a in without.adjustments if a.field == "attention_backend"] == [rule]
    with_fa3 = resolve(ServerArgs(**args), facts, Platform.from_name(gpu, kernels=KERNELS["with-fa3"])).plan
    assert with_fa3.prefill_backend == "fa3" and with_fa3.fa.provider == "flash_attn_interface"


def test_a_model_whose_head_dims_flashinfer_does_not_run_defaults_to_triton_off_hopper():
    """all-MiniLM-L6-v2 (head dim 32): SGLang's generic default off Hopper is flashinfer, whose kernels fail on it."""
    facts = ModelFacts.from_hf_config(MODELS / "all-MiniLM-L6-v2.json")
    r = resolve(ServerArgs(), facts, Platform.from_name("sm80", kernels=KERNELS["gpu-extra"]))
    assert r.plan.prefill_backend == "triton"
    assert [a.rule for a in r.adjustments if a.field == "attention_backend"] == ["default-backend.mha-sinks-triton"]
    assert flashinfer_refusals(
        resolve(
            ServerArgs(attention_backend="triton"), facts, Platform.from_name("sm80", kernels=KERNELS["gpu-extra"])
        ).plan,
        layers_from_model(facts),
    )


# attngate's own implementation gaps, refused by its backends at construction and left to SGLang's by the plan: not
# kernel facts, so the property below does not hold the plan to them
IMPLEMENTATION_GAPS = {"common.kv_cache_dtype", "common.tree_mask", "flashinfer.multi_item_scoring"}
RAW_CONFIGS = {path.stem: json.loads(path.read_text()) for path in sorted(MODELS.glob("*.json"))}
# the server arguments that decide what a kernel is asked to run (the rest mostly trip unrelated forbid rules)
KERNEL_ARGS = st.fixed_dictionaries(
    {},
    optional={
        name: field_values(ServerArgs.model_fields[name])
        for name in (
            "kv_cache_dtype",
            "page_size",
            "enable_deterministic_inference",
            "is_embedding",
            "chunked_prefill_size",
            "disable_radix_cache",
            "speculative_algorithm",
            "speculative_eagle_topk",
            "speculative_num_steps",
            "speculative_num_draft_tokens",
            "enable_dp_attention",
            "dp_size",
            "tp_size",
            "enable_mis",
        )
    },
)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    args=KERNEL_ARGS,
    backends=st.tuples(*[st.sampled_from([None, "fa3", "fa4", "flashinfer"])] * 3),
    name=st.sampled_from(sorted(RAW_CONFIGS)),
    head_dim=st.sampled_from([None, 32, 64, 80, 96, 128, 160, 256, 512]),
    gpu=st.sampled_from(["sm80", "sm86", "sm90", "sm100", "sm120"]),
    kernels=st.lists(st.sampled_from(["flashinfer", "flash_attn.cute", "flash_attn_interface"]), unique=True),
)
def test_no_plan_over_any_arguments_names_a_backend_whose_kernels_refuse_the_model(
    args, backends, name, head_dim, gpu, kernels
):
    """The matrix above over mixes of the server arguments that shape kernel calls, head dims off the shipped configs,
    GPUs and installed kernels: a plan that resolves names no attngate backend that refuses one of its layers for a
    kernel's reason. The three backend flags are drawn from attngate's kernel backends, or left unset."""
    args = {
        **args,
        **dict(zip(("attention_backend", "prefill_attention_backend", "decode_attention_backend"), backends)),
    }
    raw = RAW_CONFIGS[name]
    overrides = {"head_dim": head_dim} if head_dim and "kv_lora_rank" not in raw else {}
    if overrides and "text_config" in raw:
        raw = {**raw, "text_config": {**raw["text_config"], **overrides}}
    else:
        raw = {**raw, **overrides}
    facts = ModelFacts.from_hf_dict(raw, source=f"{name} {overrides}")
    platform = Platform.from_name(gpu, kernels=kernels, runs_sglang=False)  # attngate's backends
    try:
        plan = resolve(ServerArgs(**args), facts, platform).plan
    except (PlanError, ServerArgsError):
        return
    layers = layers_from_model(facts, plan, include_encoder=False)
    for side in {plan.prefill_backend, plan.decode_backend}:
        problems = [p for p in refusals(side, plan, layers, platform.sm_major) if p.where not in IMPLEMENTATION_GAPS]
        assert not problems, (
            f"{name} {overrides} on {gpu} {kernels} {args}: the plan names {side}, which refuses: {problems}"
        )
