"""What attngate's kernel backends can serve: every refusal, one signature, no kernel or torch import.

``refusals(backend, plan, layers, sm_major)`` -> every :class:`Problem` that stops ``backend`` serving ``layers``
under ``plan`` on a GPU of compute-capability major ``sm_major`` (the platform's ``Platform.sm_major``; None skips
the architecture checks, as on CPU stand-ins); empty: it can. The backends raise these at construction
(:class:`attngate.errors.BackendRefusal`), the plan dispatcher asks before it builds one, and the tests ask the
same questions of every plan the rules resolve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from attngate.errors import Problem
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.plan.backends import KERNEL_BACKEND_NAMES, backend_entry
from attngate.plan.schema import Plan

if TYPE_CHECKING:
    from attngate.backends.runtime.layer import AttentionLayer

#: KV cache dtypes stored in 16 bits ("auto": the model's, bf16 or fp16)
SIXTEEN_BIT_KV = ("auto", "bf16", "bfloat16")


def chain_verify_only(plan: Plan, backend: str) -> list[Problem]:
    """A backend that verifies chains only refuses a plan whose TARGET_VERIFY is a speculative tree (empty: it may)."""
    if not plan.mode(ForwardMode.TARGET_VERIFY).common.tree_mask:
        return []
    return [
        Problem(
            "common.tree_mask",
            f"attngate's {backend} verifies speculative chains only, and the plan verifies a tree "
            "(speculative_eagle_topk > 1); the flashinfer backend (MHA) verifies trees",
            code="backend-refusal.tree-verify",
        )
    ]


def sixteen_bit_kv_only(plan: Plan, backend: str) -> list[Problem]:
    """A backend that reads 16-bit KV caches only refuses a plan for an FP8 one (empty: it may)."""
    name = plan.common.kv_cache_dtype
    if name in SIXTEEN_BIT_KV:
        return []
    return [
        Problem(
            "common.kv_cache_dtype",
            f"{name!r}: attngate's {backend} reads 16-bit KV caches only (no descale "
            "tensors); the flashinfer backend (MHA) reads FP8 ones",
            code="backend-refusal.kv-cache-dtype",
        )
    ]


def mla_reads_what_it_writes(plan: Plan, layers: list[AttentionLayer]) -> list[Problem]:
    """MLA reads the latent cache in every form but the no-prefix one, so a layer kind whose plan writes
    no cache (``common.write_kv_cache``) cannot be an MLA layer: the write and the read side must agree."""
    return [
        Problem(
            f"layer {layer.layer_id}",
            f"an MLA layer reads the latent cache, but the plan writes none for "
            f"{layer.kind.value} layers (common.write_kv_cache)",
            code="backend-refusal.mla-without-cache",
        )
        for layer in layers
        if layer.is_mla and not plan.layer(layer.kind).common.write_kv_cache
    ]


def fa_refusals(plan: Plan, layers: list[AttentionLayer], sm_major: int | None = None) -> list[Problem]:
    """Why the FA backend cannot serve these layers under this plan (empty: it can). ``sm_major`` None skips
    the architecture checks (CPU stand-ins). Needs no kernel import."""
    provider, page_size = plan.fa.provider, plan.common.page_size
    problems = (
        mla_reads_what_it_writes(plan, layers)
        + chain_verify_only(plan, "FA backend")
        + sixteen_bit_kv_only(plan, "FA backend")
    )
    if provider == "flash_attn.cute" and sm_major is not None and sm_major not in (9, 10):
        problems.append(
            Problem(
                "fa.provider",
                f"flash_attn.cute reads no paged KV cache on SM{sm_major}x "
                "(SM90 and SM100 only), and every FA path but the embedding fast path reads one",
                code="backend-refusal.fa-cute-arch",
            )
        )
    for layer in layers:
        where = f"layer {layer.layer_id}"
        if provider == "flash_attn.cute" and sm_major in (9, 10) and not _cute_runs_head_dims(layer, sm_major):
            problems.append(
                Problem(
                    where,
                    f"flash_attn.cute runs no head dims {layer.head_dim}/{layer.v_head_dim} (q·k / v) on SM{sm_major}x",
                    code="backend-refusal.head-dims",
                )
            )
        if (layer.has_sinks or layer.sinks is not None) and provider == "flash_attn_interface":
            problems.append(
                Problem(
                    where,
                    "flash_attn_interface (FA3) has no learned attention sinks; the plan must pick flash_attn.cute",
                    code="backend-refusal.sinks",
                )
            )
        if layer.kind == LayerKind.CHUNKED_LOCAL and (layer.attention_chunk_size or 0) % page_size:
            problems.append(
                Problem(
                    where,
                    f"attention_chunk_size {layer.attention_chunk_size} is not a multiple of page_size {page_size}",
                    code="backend-refusal.chunk-not-page-multiple",
                )
            )
        if layer.is_mla and sm_major is not None:
            runs = (provider == "flash_attn_interface" and sm_major == 9) or (
                provider == "flash_attn.cute" and sm_major == 10
            )
            if not runs:
                problems.append(
                    Problem(
                        where,
                        f"{provider} runs no absorbed MLA on SM{sm_major}x (FA3 on SM90, FA4 on SM100)",
                        code="backend-refusal.absorbed-mla-arch",
                    )
                )
    return problems


def _cute_runs_head_dims(layer: AttentionLayer, sm_major: int) -> bool:
    """flash_attn.cute's head-dim bounds (its _validate_head_dims, flash-attn-4 4.0.0b36): from 8 and a multiple of 8 (the
    16-bit alignment); up to 256 on SM90; on SM100 up to 128, or 192 with 128 (MLA's non-absorbed form), or 256 with 256."""
    d, dv = layer.head_dim, layer.v_head_dim
    if d < 8 or dv < 8 or d % 8 or dv % 8:
        return False
    if sm_major == 9:
        return d <= 256 and dv <= 256
    return (d <= 128 and dv <= 128) or (d, dv) in ((192, 128), (256, 256))


def flashinfer_refusals(plan: Plan, layers: list[AttentionLayer], sm_major: int | None = None) -> list[Problem]:
    """Why the FlashInfer backend cannot serve these layers under this plan (empty: it can). Needs no kernel import."""
    problems = []
    if plan.flashinfer.multi_item_scoring:
        problems.append(
            Problem(
                "flashinfer.multi_item_scoring",
                "attngate's FlashInfer backend does not implement multi-item "
                "scoring (SGLang's MultiItemScoringParams); this plan is for SGLang's flashinfer backend",
                code="backend-refusal.multi-item-scoring",
            )
        )
    if any(layer.is_mla for layer in layers):
        return problems + flashinfer_mla_refusals(plan, layers, sm_major)
    for layer in layers:
        if layer.head_dim != layer.v_head_dim or layer.head_dim not in (64, 128, 256):
            problems.append(
                Problem(
                    f"layer {layer.layer_id}",
                    f"FlashInfer runs head dims 64, 128 and 256 (q·k = v), not {layer.head_dim}/{layer.v_head_dim}",
                    code="backend-refusal.head-dims",
                )
            )
        if layer.has_sinks or layer.sinks is not None:
            problems.append(
                Problem(
                    f"layer {layer.layer_id}",
                    "FlashInfer runs no learned attention sinks",
                    code="backend-refusal.sinks",
                )
            )
        if layer.kind == LayerKind.CHUNKED_LOCAL:
            problems.append(
                Problem(
                    f"layer {layer.layer_id}",
                    "FlashInfer runs no chunked local attention (a window would let a query see the previous chunk)",
                    code="backend-refusal.chunked-local",
                )
            )
        gates = plan.layer(layer.kind).common
        if gates.use_window and not gates.causal and layer.sliding_window_size >= 0:
            problems.append(
                Problem(
                    f"layer {layer.layer_id}",
                    "FlashInfer's window_left bounds a window before the query only; "
                    "this bidirectional layer's window also bounds it after the query",
                    code="backend-refusal.bidirectional-window",
                )
            )
    return problems


def flashinfer_mla_refusals(plan: Plan, layers: list[AttentionLayer], sm_major: int | None = None) -> list[Problem]:
    """Why FlashInfer MLA cannot serve these layers under this plan (empty: it can). Needs no kernel import."""
    problems = (
        mla_reads_what_it_writes(plan, layers)
        + chain_verify_only(plan, "FlashInfer MLA backend")
        + sixteen_bit_kv_only(plan, "FlashInfer MLA backend")
    )
    for layer in layers:
        where = f"layer {layer.layer_id}"
        if not layer.is_mla:
            problems.append(
                Problem(
                    where, "FlashInfer MLA serves MLA layers only; a model mixes none", code="backend-refusal.mla-only"
                )
            )
        elif (layer.kv_lora_rank, layer.qk_rope_head_dim) != (512, 64):
            problems.append(
                Problem(
                    where,
                    f"FlashInfer MLA runs kv_lora_rank 512 / qk_rope_head_dim 64, not "
                    f"{layer.kv_lora_rank} / {layer.qk_rope_head_dim}",
                    code="backend-refusal.mla-geometry",
                )
            )
        if layer.kind != LayerKind.FULL or layer.logit_cap or layer.has_sinks or layer.sinks is not None:
            problems.append(
                Problem(
                    where,
                    "FlashInfer MLA runs full causal attention only (no window, chunk, soft-cap or sinks)",
                    code="backend-refusal.mla-full-causal-only",
                )
            )
    shapes = {(lay.num_q_heads, lay.head_dim, lay.v_head_dim, lay.scaling) for lay in layers}
    if len(shapes) > 1:  # one plan per batch serves every layer
        problems.append(
            Problem(
                "layers",
                f"FlashInfer MLA plans once per batch for all layers; these differ in heads, dims or scaling: {sorted(shapes)}",
                code="backend-refusal.mla-mixed-layers",
            )
        )
    return problems


Refusals = Callable[[Plan, "list[AttentionLayer]", "int | None"], "list[Problem]"]

#: The backend names attngate runs on GPU kernels, and what each refuses (the registry names the function).
REFUSALS: dict[str, Refusals] = {name: globals()[backend_entry(name).refusals] for name in KERNEL_BACKEND_NAMES}


def no_kernel_backend(backend: str, where: str = "backend", *, hint: bool = False) -> Problem:
    """The problem of a backend name attngate has no kernel backend for, naming the ones it has; ``hint`` adds the
    reference backend and what to resolve with instead."""
    message = f"{backend!r}: attngate runs {', '.join(sorted(REFUSALS))} on GPU kernels"
    if hint:
        message += " (and the reference backend on any device); resolve with --attention-backend set to one of them"
    return Problem(where, message, code="backend-refusal.no-kernel-backend")


def kernel_backend_refusals(
    plan: Plan, layers: list[AttentionLayer] | None = None, sm_major: int | None = None
) -> list[Problem]:
    """The plan's backends that attngate has no kernel backend for (empty: it runs both). Needs no kernel import."""
    return [
        no_kernel_backend(name, side, hint=True)
        for side, name in (("prefill_backend", plan.prefill_backend), ("decode_backend", plan.decode_backend))
        if name not in REFUSALS
    ]


def refusals(backend: str, plan: Plan, layers: list[AttentionLayer], sm_major: int | None = None) -> list[Problem]:
    """Why ``backend`` cannot serve ``layers`` under ``plan`` (see the module docstring); a name attngate has no
    kernel backend for is one problem naming the ones it has."""
    if backend not in REFUSALS:
        return [no_kernel_backend(backend)]
    return REFUSALS[backend](plan, layers, sm_major)
