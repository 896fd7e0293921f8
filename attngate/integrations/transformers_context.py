"""The plain transformers path's per-model state (:mod:`attngate.integrations.transformers_plain`): the plan a model
attends by, each layer's decisions by a stable layer name, and what is found from the masks of the steps in flight.

A :class:`PlainContext` is made by :func:`configure` (or by a model's first attention call, which configures it with
SGLang's default ServerArgs) and attached to every module of the model that holds its config (an attribute, kept off
the config, which transformers serializes, copies and compares); an attention call reads it from its module. Layer
names are stable strings, ``"<context>.layers.<i>"`` with ``i`` the plan's layer, as vLLM names its attention layers:
the kernel ops take one (a constant of a compiled graph) and find through :func:`named` the layer's decisions and the
context's :class:`~attngate.integrations.transformers_rows.MaskFindings` (what is found from its forwards' masks).
Live contexts are listed by name, weakly: a context lives while a module holds it.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from attngate.backends.runtime.layer import AttentionLayer, layers_from_model
from attngate.engine.resolve import resolve
from attngate.engine.result import Resolution
from attngate.errors import BatchMetadataError, Problem, UsageError
from attngate.facts.modes import LayerKind
from attngate.facts.platform import Platform
from attngate.facts.server_args import ServerArgs
from attngate.integrations.torch_platform import attngate_platform
from attngate.integrations.transformers_checks import model_facts, plan_layer_of
from attngate.integrations.transformers_rows import MaskFindings

# the module attributes (plain values in the module's __dict__, never parameters or buffers) an attention call reads
_CONTEXT = "_attngate_context"  # its model's PlainContext
_LAYER = "_attngate_layer"  # its stable layer name, once decided


@dataclass(frozen=True)
class LayerDecisions:
    """What the plan decides for one attention layer, as plain values (what a torch.compile graph reads and guards
    on).

    Attributes
    ----------
    name : str
        The stable layer name the kernel ops take: ``"<context>.layers.<i>"``, ``i`` the plan's layer.
    layer_id : int
        The plan's layer spec (:class:`~attngate.backends.runtime.layer.AttentionLayer`) index.
    kind : LayerKind
        The layer's kind (full, sliding window, chunked local, cross attention, encoder only).
    causal : bool
        ``plan.layer(kind).common.causal``.
    window : int or None
        Earlier keys a query sees (SGLang's ``sliding_window_size``); None: no window on this layer.
    scaling : float
        The softmax scale of the layer spec.
    logit_cap : float
        The soft-cap (0: none).
    attention_chunk_size : int
        The chunk of a chunked-local layer; 0: not chunked local.
    prefill_kernel, decode_kernel : str or None
        On a GPU, the kernel of each phase: ``"fa"``, ``"flashinfer"``, or None (float32 torch).
    prefill_kernel_family : str
        FlashInfer's ragged prefill wrapper's kernel family.
    workspace_size_mb : int
        FlashInfer's workspace.
    decode_split_keys : int or None
        ``plan.fa.decode_fixed_split_keys``: keys per piece of a split decode step, fixed; None: sized to the GPU.
    """

    name: str
    layer_id: int
    kind: LayerKind
    causal: bool
    window: int | None
    scaling: float
    logit_cap: float
    attention_chunk_size: int
    prefill_kernel: str | None
    decode_kernel: str | None
    prefill_kernel_family: str
    workspace_size_mb: int
    decode_split_keys: int | None


class PlainContext:
    """One model's state on the plain path: the configs it attends for (the model's and its text_config), its plan
    (``resolution``, ``layers``: the layer specs every eager call reads afresh, so an edit applies at once), each
    layer's latest decisions by stable layer name (read by compiled graphs and the kernel ops, which cannot run the
    plan's Python), and its :class:`MaskFindings`. Never copied or pickled with a model: a copy's modules hold none and
    resolve their own on first use, as a copied config is another object.

    Parameters
    ----------
    name : str
        The context's stable name, the prefix of its layer names (``"attngate<n>"``).

    Attributes
    ----------
    configs : tuple
        The transformers configs it attends for, compared by identity.
    resolution : Resolution
        The plan and how it was resolved.
    layers : list of AttentionLayer
        The plan's layer specs (``layers_from_model``), one per attention layer of the plan.
    layer_names : list of str
        ``layer_names[i]`` names ``layers[i]``.
    decisions : dict of str to LayerDecisions
        Each layer's latest decisions by layer name.
    masks : MaskFindings
        What is found from the masks of the model's forwards in flight.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.configs: tuple[Any, ...] = ()
        self.resolution: Resolution | None = None
        self.layers: list[AttentionLayer] = []
        self.layer_names: list[str] = []
        self.decisions: dict[str, LayerDecisions] = {}
        self.masks = MaskFindings()
        # by layer name: the spec (its position, the values read) each kept decision was made from
        self._made: dict[str, tuple[int, AttentionLayer, tuple[Any, ...], LayerDecisions]] = {}

    def holds(self, config: Any) -> bool:
        """Whether ``config`` (by identity: configs compare by value) is one this context attends for."""
        for held in self.configs:
            if held is config:
                return True
        return False

    def bind(self, configs: tuple[Any, ...], resolution: Resolution, layers: list[AttentionLayer]) -> None:
        """Attend for ``configs`` by this plan from now on; every decision is made again."""
        self.configs, self.resolution, self.layers = configs, resolution, layers
        self.layer_names = [f"{self.name}.layers.{i}" for i in range(len(layers))]
        self.decisions, self._made = {}, {}

    def decide(self, module: torch.nn.Module) -> LayerDecisions:
        """The module's decisions from the plan as it is now, kept by its layer name (and the name on the module):
        made again only where the layer's spec was edited (any value they read) or replaced, or the plan bound anew.

        Parameters
        ----------
        module : torch.nn.Module
            One of the model's attention modules.

        Returns
        -------
        LayerDecisions

        Raises
        ------
        BatchMetadataError
            Where the module has no place in the plan (see :func:`~attngate.integrations.transformers_checks.plan_layer_of`).
        """
        made = self._made.get(module.__dict__.get(_LAYER, ""))
        if made is not None:
            position, layer, values, decisions = made
            if self.layers[position] is layer and _values(layer) == values:  # the plan's spec as decided from
                return decisions
        resolution = self.resolution
        position = plan_layer_of(resolution.model, module)
        layer = self.layers[position]
        plan, gates = resolution.plan, resolution.plan.layer(layer.kind).common
        name = self.layer_names[position]
        decisions = self.decisions[name] = LayerDecisions(
            name=name,
            layer_id=layer.layer_id,
            kind=layer.kind,
            causal=gates.causal,
            window=layer.sliding_window_size if gates.use_window and layer.sliding_window_size >= 0 else None,
            scaling=layer.scaling,
            logit_cap=layer.logit_cap,
            attention_chunk_size=layer.attention_chunk_size or 0,
            prefill_kernel=_kernel_of(resolution, plan.prefill_backend),
            decode_kernel=_kernel_of(resolution, plan.decode_backend),
            prefill_kernel_family=plan.flashinfer.prefill_kernel_family,
            workspace_size_mb=plan.flashinfer.workspace_size_mb,
            decode_split_keys=plan.fa.decode_fixed_split_keys,
        )
        self._made[name] = (position, layer, _values(layer), decisions)
        module.__dict__[_LAYER] = name
        return decisions

    def __deepcopy__(self, memo: dict) -> None:
        return None

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _no_context, ()


def _no_context() -> None:
    return None


def _values(layer: AttentionLayer) -> tuple[Any, ...]:
    """What :meth:`PlainContext.decide` reads of a layer spec (a mutable dataclass: an edit applies at once)."""
    return (layer.layer_id, layer.kind, layer.sliding_window_size, layer.scaling, layer.logit_cap,
            layer.attention_chunk_size)  # fmt: skip


# live contexts by name (weakly: each lives while a module holds it), for the kernel ops, which take a layer name, and
# for a model's modules that have not met their context yet (found by their config)
_LIVE: weakref.WeakValueDictionary[str, PlainContext] = weakref.WeakValueDictionary()
_NAMES = itertools.count()


def configure(
    model: torch.nn.Module, server_args: ServerArgs | None = None, platform: Platform | None = None
) -> Resolution:
    """Resolve (again) the plan ``model`` attends by outside a runtime, into its context.

    Parameters
    ----------
    model : torch.nn.Module
        A transformers model, or any module holding its ``config``; a config with a ``text_config`` attends for both.
    server_args : ServerArgs, optional
        The plan's server arguments (default SGLang's).
    platform : Platform, optional
        The plan's GPU (default: detected, see :func:`attngate.integrations.torch_platform.attngate_platform`).

    Returns
    -------
    Resolution

    Raises
    ------
    PlanError
        Where the rules refuse the configuration.
    ModelConfigError
        Where the config is no language model's (a vision tower's, naming the sub-config to give another
        implementation).
    UsageError
        For a ``model`` without a transformers ``config``.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        raise UsageError(
            Problem(
                "model",
                f"takes a transformers model (or a module holding its config), not {type(model).__name__}",
                code="usage.argument-type",
            )
        )
    facts = model_facts(config, (getattr(config, "architectures", None) or [type(model).__name__])[0])
    if platform is None:
        platform = attngate_platform()
    resolution = resolve(server_args or ServerArgs(), facts, platform)
    text = getattr(config, "text_config", None)
    configs = (config, text) if text is not None else (config,)
    context = _context_for(config) or (_context_for(text) if text is not None else None)
    if context is None:
        context = PlainContext(f"attngate{next(_NAMES)}")
        _LIVE[context.name] = context
    for other in list(_LIVE.values()):  # a config attends by one context: the latest configured
        if other is not context:
            other.configs = tuple(held for held in other.configs if not any(held is c for c in configs))
    context.bind(configs, resolution, layers_from_model(facts))
    for module in model.modules():  # the decisions compiled graphs read, for every module the plan can place
        if context.holds(getattr(module, "config", None)):
            module.__dict__[_CONTEXT] = context
            try:
                context.decide(module)
            except BatchMetadataError:  # no attention module of the plan (an MLP, the model itself)
                module.__dict__.pop(_LAYER, None)
    return resolution


def plan_of(module: torch.nn.Module) -> tuple[Resolution, list[AttentionLayer]] | None:
    """The plan a model (or one of its attention modules) attends by.

    Returns
    -------
    tuple of (Resolution, list of AttentionLayer) or None
        The resolution and the layer specs every eager call reads (an edit applies at once); None before the model's
        first call or configure().
    """
    context = _context_for(module.config, module)
    return None if context is None else (context.resolution, context.layers)


def context_of(module: torch.nn.Module) -> PlainContext:
    """The context of the module's model (eager): the one the module holds, else the one for its config (held from
    now on), else one configured now with SGLang's default ServerArgs.

    Parameters
    ----------
    module : torch.nn.Module
        A module holding a transformers ``config``.

    Returns
    -------
    PlainContext

    Raises
    ------
    PlanError, ModelConfigError
        As :func:`configure` does.
    """
    config = module.config
    context = module.__dict__.get(_CONTEXT)
    if context is not None and context.holds(config):
        return context
    context = _context_for(config)
    if context is None:
        configure(module)
        return module.__dict__[_CONTEXT]
    module.__dict__[_CONTEXT] = context
    return context


def _context_for(config: Any, module: torch.nn.Module | None = None) -> PlainContext | None:
    held = None if module is None else module.__dict__.get(_CONTEXT)
    if held is not None and held.holds(config):
        return held
    for context in list(_LIVE.values()):
        if context.holds(config):
            return context
    return None


def decisions_of(module: torch.nn.Module) -> tuple[PlainContext, LayerDecisions]:
    """The module's context and decisions: eager, as the plan is now (:meth:`PlainContext.decide`); in a graph, as
    last kept (the graph guards on them, so a plan configured again retraces it), or for a module no eager call or
    configure() has seen, resolved outside the graph (a graph break, which fullgraph=True refuses).

    Returns
    -------
    tuple of (PlainContext, LayerDecisions)

    Raises
    ------
    BatchMetadataError
        Where the module has no place in the plan.
    ModelConfigError
        Where its config is no language model's.
    """
    if torch.compiler.is_compiling():
        context = getattr(module, _CONTEXT, None)
        decisions = None if context is None else context.decisions.get(getattr(module, _LAYER, None))
        return (context, decisions) if decisions is not None else _decide_outside_the_graph(module)
    return _decide(module)


def _decide(module: torch.nn.Module) -> tuple[PlainContext, LayerDecisions]:
    context = context_of(module)
    return context, context.decide(module)


# the first traced call of a module no eager call or configure() has seen: a graph break (fullgraph=True refuses it)
_decide_outside_the_graph = torch.compiler.disable(
    _decide,
    reason="attngate resolves a model's plan on its first attention call, in Python: call "
    "attngate.integrations.transformers.configure(model) before torch.compile(..., fullgraph=True)",
)


def named(layer_name: str) -> tuple[PlainContext, LayerDecisions]:
    """The context and the latest decisions of the layer a kernel op names.

    Parameters
    ----------
    layer_name : str
        ``"<context>.layers.<i>"`` (:attr:`LayerDecisions.name`).

    Returns
    -------
    tuple of (PlainContext, LayerDecisions)
    """
    context = _LIVE[layer_name.partition(".")[0]]
    return context, context.decisions[layer_name]


def _kernel_of(resolution: Resolution, backend: str) -> str | None:
    """Which kernel runs a phase on ``backend`` on a GPU: ``"fa"`` (FA4's varlen kernel, where the plan runs FA
    through flash_attn.cute), ``"flashinfer"`` (its ragged prefill wrapper), or None (float32 torch: a provider
    this path does not call)."""
    plan = resolution.plan
    if backend in ("fa3", "fa4") and plan.fa.provider == "flash_attn.cute":
        return "fa"
    return "flashinfer" if backend == "flashinfer" else None
