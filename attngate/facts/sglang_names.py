"""The attngate server arguments that SGLang 0.5.23 spells differently, and how to read each from SGLang's field
values (a resolved ServerArgs, or a launch line's flags as given). Plain data and functions, no sglang import: the
launch-line parser (attngate.facts.launch) and the SGLang integration (attngate.integrations.sglang.fields) both
read them from here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from attngate.facts.choices import SGLANG_VERSION


def _graph_backend(values: Mapping[str, Any], phase: str) -> str | None:
    """The phase's CUDA-graph backend: --cuda-graph-config (resolved object or JSON mapping) over
    --cuda-graph-backend-<phase> over the legacy off-switches (SGLang's precedence, cuda_graph_hook.py:
    handle_cuda_graph_config), None where nothing names one."""
    config = values.get("cuda_graph_config")
    if isinstance(config, Mapping):
        backend = (config.get(phase) or {}).get("backend")
    else:
        backend = getattr(getattr(config, phase, None), "backend", None)
    if backend is None:
        backend = values.get(f"cuda_graph_backend_{phase}")
    if backend is None and (values.get("disable_cuda_graph") or values.get(f"disable_{phase}_cuda_graph")):
        backend = "disabled"
    return getattr(backend, "value", backend)


@dataclass(frozen=True)
class Renamed:
    """One attngate field that SGLang 0.5.23 spells differently.

    ``sglang_fields``: the SGLang fields ``read`` needs (a resolved ServerArgs has each); ``launch_fields``: flags
    that SGLang's hooks fold into them, which ``read`` also looks at in a launch line. ``read(values)`` gives
    attngate's value from SGLang's field values (resolved, or a launch line's as given: strings, a bool for a
    switch);
    ``write(value, args)`` gives the SGLang keyword arguments that ask for it, or raises ValueError
    where SGLang cannot express it.
    """

    sglang_fields: tuple[str, ...]
    read: Callable[[Mapping[str, Any]], Any]
    write: Callable[[Any, Mapping[str, Any]], dict[str, Any]]
    source: str
    launch_fields: tuple[str, ...] = ()


def _attention_dp(values: Mapping[str, Any]) -> bool:
    return bool(values.get("enable_dp_attention")) or int(values.get("attn_dp_size") or 1) > 1


def _write_piecewise(value: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    if value:
        raise ValueError(
            f"SGLang {SGLANG_VERSION} has no user-selectable torch.compile piecewise prefill graph (its "
            "cuda_graph backends are full, breakable and disabled)"
        )
    return {}


RENAMED: dict[str, Renamed] = {
    # --enable-dp-attention --dp-size N became --attn-dp-size N: dp_size counts replicas again (SGLang still
    # takes the old spelling and converts it, so it is what attngate writes)
    "enable_dp_attention": Renamed(
        ("attn_dp_size", "enable_dp_attention"),
        _attention_dp,
        lambda value, args: {"enable_dp_attention": value},
        "sglang 0.5.23 arg_groups/parallel_hook.py:handle_deprecated_dp_attention",
    ),
    "dp_size": Renamed(
        ("attn_dp_size", "dp_size"),
        lambda v: (
            int(v.get("attn_dp_size") or 1) if int(v.get("attn_dp_size") or 1) > 1 else int(v.get("dp_size") or 1)
        ),
        lambda value, args: {"dp_size": value},
        "sglang 0.5.23 arg_groups/parallel_hook.py:handle_deprecated_dp_attention",
    ),
    # --enable-piecewise-cuda-graph became the prefill phase's cuda_graph backend; the torch.compile
    # piecewise backend that turns FlashInfer's ragged prefill off is internal-only ("tc_piecewise")
    # --disable-cuda-graph folds into the decode phase's cuda_graph backend, which other hooks also turn off
    "disable_cuda_graph": Renamed(
        ("cuda_graph_config", "disable_cuda_graph"),
        lambda v: bool(v.get("disable_cuda_graph")) or _graph_backend(v, "decode") == "disabled",
        lambda value, args: {"disable_cuda_graph": value},
        "sglang 0.5.23 arg_groups/cuda_graph_hook.py:handle_cuda_graph_config",
        ("cuda_graph_backend_decode", "disable_decode_cuda_graph"),
    ),
    "enable_piecewise_cuda_graph": Renamed(
        ("cuda_graph_config",),
        lambda v: _graph_backend(v, "prefill") == "tc_piecewise",
        _write_piecewise,
        "sglang 0.5.23 model_executor/cuda_graph_config.py:Backend.TC_PIECEWISE",
        ("cuda_graph_backend_prefill",),
    ),
}


#: every SGLang field that a renamed attngate field is read from
READ_BY_RENAMED: frozenset[str] = frozenset(f for r in RENAMED.values() for f in r.sglang_fields + r.launch_fields)
