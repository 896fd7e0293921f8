"""The checks of :class:`attngate.integrations.transformers.AttngateRuntime`'s arguments (UsageError, before
anything is allocated) and of each call's new tokens (BatchMetadataError), each listing every problem, and the model
facts of a transformers config and the plan layer of each attention module (both the runtime and the plain path read
them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attngate.backends.runtime.layer import AttentionLayer
from attngate.errors import BatchMetadataError, ModelConfigError, Problem, UsageError
from attngate.facts.model import ModelFacts
from attngate.facts.modes import ForwardMode, LayerKind
from attngate.facts.server_args import ServerArgs
from attngate.plan.schema import Plan

#: the attn_implementation name attngate registers with transformers
ATTN_IMPLEMENTATION = "attngate"


def check_runtime_arguments(
    model: torch.nn.Module,
    server_args: ServerArgs | None,
    page_size: int | None,
    num_slots: int,
    max_requests: int,
    max_context_len: int,
) -> int:
    """The page_size asked for (the argument, else server_args'; None for the plan's); UsageError naming every
    argument of AttngateRuntime that cannot work."""
    problems = []
    built_with = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if built_with != ATTN_IMPLEMENTATION:
        problems.append(
            Problem(
                "model",
                f"{type(model).__name__} was built with attn_implementation={built_with!r}: its attention would "
                "bypass attngate's cache",
                code="usage.attn-implementation",
                help=f"build the model with attn_implementation={ATTN_IMPLEMENTATION!r}, as AttngateRuntime needs",
            )
        )
    if server_args is not None and not isinstance(server_args, ServerArgs):
        problems.append(
            Problem("server_args", f"takes ServerArgs, not {type(server_args).__name__}", code="usage.argument-type")
        )
        server_args = None
    planned = server_args.page_size if server_args is not None else None
    if page_size is not None and planned is not None and page_size != planned:
        problems.append(
            Problem(
                "page_size",
                f"{page_size} differs from server_args.page_size {planned}; the pool must page as the plan does",
                code="usage.pool-page-size",
            )
        )
    for name, value in (
        ("page_size", page_size),
        ("num_slots", num_slots),
        ("max_requests", max_requests),
        ("max_context_len", max_context_len),
    ):
        if (name != "page_size" or value is not None) and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            problems.append(Problem(name, f"must be a positive integer, not {value!r}", code="usage.count"))
    if problems:
        raise UsageError(problems)
    return page_size if page_size is not None else planned


def check_pool_fits_plan(plan: Plan, asked: int | None, num_slots: int) -> int:
    """The plan's page_size (rules may move it, as SGLang's FA4 on SM100 pages by 128); UsageError when the
    caller asked for another or num_slots is not a whole number of pages."""
    page_size = plan.common.page_size
    problems = []
    if asked is not None and asked != page_size:
        problems.append(
            Problem(
                "page_size",
                f"{asked} asked, but the plan pages by {page_size}; the pool must page as the plan does",
                code="usage.pool-page-size",
                help="the resolution's adjustments name the rule that sets the plan's page_size",
            )
        )
    if num_slots % page_size:
        problems.append(
            Problem(
                "num_slots",
                f"{num_slots} is not a multiple of the plan's page_size {page_size}",
                code="usage.num-slots-not-page-multiple",
            )
        )
    if problems:
        raise UsageError(problems)
    return page_size


def check_new_tokens(
    new_tokens: dict[int, torch.Tensor], mode: ForwardMode, seq_lens: dict[int, int], vocab: int | None, width: int
) -> None:
    """BatchMetadataError naming every unknown request, empty input, token id outside the vocabulary and request
    that would outgrow its row of req_to_token (max_context_len, ``width``). ``seq_lens``: the cached tokens of every
    known request; ``vocab``: the model's vocab_size, None not to check."""
    problems = []
    for req, ids in new_tokens.items():
        where = f"request {req}"
        if req not in seq_lens:
            problems.append(
                Problem(where, "unknown request", code="batch-metadata.unknown-request", help="add_request first")
            )
        elif ids.numel() == 0:
            problems.append(Problem(where, "no new tokens", code="batch-metadata.no-new-tokens"))
        elif mode == ForwardMode.DECODE and ids.numel() != 1:
            problems.append(
                Problem(
                    where, f"decode takes one token per request, not {ids.numel()}", code="batch-metadata.decode-tokens"
                )
            )
        elif vocab and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            problems.append(
                Problem(where, f"token ids must be integers in [0, {vocab})", code="batch-metadata.token-ids")
            )
        elif seq_lens[req] + ids.numel() > width:
            problems.append(
                Problem(
                    where,
                    f"{seq_lens[req]} cached + {ids.numel()} new tokens exceed max_context_len {width}",
                    code="batch-metadata.context-too-long",
                )
            )
    if problems:
        raise BatchMetadataError(problems)


def bind_layers(model: torch.nn.Module, layers: list[AttentionLayer], ckv_hook: Callable[[int], Callable]) -> None:
    """Copy each attention module's scaling, learned sinks and (MLA) kv_b_proj halves into its layer spec,
    and hook kv_a_layernorm (``ckv_hook(layer index)``) so the attention call can take the latent ckv. UsageError
    naming the layers no module binds."""
    bound = set()
    for module in model.modules():
        idx = getattr(module, "layer_idx", None)
        if idx is None or not hasattr(module, "scaling") or not 0 <= idx < len(layers):
            continue
        layer = layers[idx]
        layer.scaling = float(module.scaling)
        if getattr(module, "sinks", None) is not None:
            layer.sinks = module.sinks.detach()
        if layer.is_mla:
            w = module.kv_b_proj.weight.detach().view(layer.num_q_heads, -1, layer.kv_lora_rank)
            layer.w_kc = w[:, : layer.qk_nope_head_dim]  # [H, qk_nope, kv_lora_rank]
            layer.w_vc = w[:, layer.qk_nope_head_dim :].transpose(1, 2)  # [H, kv_lora_rank, v_head_dim]
            module.kv_a_layernorm.register_forward_hook(ckv_hook(idx))
        bound.add(idx)
    missing = [i for i in range(len(layers)) if i not in bound]
    if missing:
        raise UsageError(
            Problem(
                "model",
                f"no attention module found for layers {missing} of {type(model).__name__}; "
                f"AttngateRuntime cannot bind it",
                code="usage.unbound-layers",
            )
        )


def check_softmax_attention_only(model: torch.nn.Module, facts: ModelFacts) -> None:
    """UsageError for a model with layers whose recurrent state AttngateRuntime does not keep."""
    if facts.has_recurrent_layers:
        raise UsageError(
            Problem(
                "model",
                f"{type(model).__name__} has layers without softmax attention (linear attention, "
                f"Mamba, convolution) whose recurrent state AttngateRuntime does not keep between "
                f"extend and decode",
                code="usage.recurrent-layers",
                help=f"run it with attn_implementation={ATTN_IMPLEMENTATION!r} and transformers' own cache instead",
            )
        )


def model_facts(config: Any, source: str) -> ModelFacts:
    """The model facts of a transformers ``config`` (``PretrainedConfig``), as SGLang reads its config.json.

    Parameters
    ----------
    config : transformers.PretrainedConfig
        The config (its ``to_dict()``); a sub-config (``base_config_key``) of a multimodal model too.
    source : str
        What problems name it by (its architecture, or the model's class name).

    Returns
    -------
    ModelFacts

    Raises
    ------
    ModelConfigError
        Where the config is no language model's; for a vision or audio tower's sub-config the problems end with how
        to give that tower another implementation.
    """
    try:
        return ModelFacts.from_hf_dict(config.to_dict(), source=source)
    except ModelConfigError as err:
        key = getattr(config, "base_config_key", "")
        if key and key != "text_config":  # a vision or audio tower's attention, under one attn_implementation for all
            tower = Problem(
                source,
                f"the {key} tower's attention: attngate resolves plans for language models",
                code="model-config.not-a-language-model",
                help=f"give the tower its own implementation: attn_implementation={{'text_config': 'attngate', "
                f"'{key}': 'sdpa'}}",
            )
            raise ModelConfigError([*err.problems, tower]) from None
        raise


def plan_layer_of(model: ModelFacts, module: torch.nn.Module) -> int:
    """The plan's layer of an attention module: by its model ``layer_idx`` (a hybrid's attention layers only); in an
    encoder-decoder (Whisper: the encoder's layers, then each decoder layer's self and cross attention) the encoder's
    modules, which carry no index, by their kind, and a decoder's by index and causality. Raises BatchMetadataError
    where the module cannot be placed."""
    idx = getattr(module, "layer_idx", None)
    if model.is_encoder_decoder:
        encoder = model.layer_kinds.count(LayerKind.ENCODER_ONLY)
        if not getattr(module, "is_decoder", True):
            return 0  # every encoder layer is one spec: non-causal, no window
        if isinstance(idx, int):
            idx = encoder + 2 * idx + (0 if getattr(module, "is_causal", True) else 1)
    why = "an attention module without a layer_idx: attngate cannot tell which of the plan's layers it is"
    if isinstance(idx, int):
        try:
            return model.attention_position(idx)
        except ValueError as err:
            why = str(err)
    raise BatchMetadataError(Problem(type(module).__name__, why, code="batch-metadata.layer-unplaced")) from None
