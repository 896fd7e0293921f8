"""attngate's ServerArgs <-> SGLang 0.5.23's ServerArgs, field by field.

Every attngate field is read from SGLang under its own name, except the few SGLang renamed or folded
into another field (:data:`RENAMED`, each with its source). A field that SGLang does not have and
that no entry here maps is an error naming it: a silent default would hide exactly the drift this
module exists to catch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from attngate.errors import Problem, ServerArgsError
from attngate.facts.server_args import ServerArgs


def _graph_backend(values: Mapping[str, Any], phase: str) -> str | None:
    config = values.get("cuda_graph_config")
    if isinstance(config, Mapping):
        return (config.get(phase) or {}).get("backend")
    backend = getattr(getattr(config, phase, None), "backend", None)
    return backend if backend is not None else values.get(f"cuda_graph_backend_{phase}")


@dataclass(frozen=True)
class Renamed:
    """One attngate field that SGLang 0.5.23 spells differently.

    ``read(values)`` gives attngate's value from SGLang's field values (resolved or as given);
    ``write(value, args)`` gives the SGLang keyword arguments that ask for it, or raises ValueError
    where SGLang cannot express it.
    """

    sglang_fields: tuple[str, ...]
    read: Callable[[Mapping[str, Any]], Any]
    write: Callable[[Any, Mapping[str, Any]], dict[str, Any]]
    source: str


def _attention_dp(values: Mapping[str, Any]) -> bool:
    return bool(values.get("enable_dp_attention")) or int(values.get("attn_dp_size") or 1) > 1


def _write_piecewise(value: Any, args: Mapping[str, Any]) -> dict[str, Any]:
    if value:
        raise ValueError(
            "SGLang 0.5.23 has no user-selectable torch.compile piecewise prefill graph (its "
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
    ),
    "enable_piecewise_cuda_graph": Renamed(
        ("cuda_graph_config",),
        lambda v: _graph_backend(v, "prefill") == "tc_piecewise",
        _write_piecewise,
        "sglang 0.5.23 model_executor/cuda_graph_config.py:Backend.TC_PIECEWISE",
    ),
}


def sglang_field_names() -> frozenset[str]:
    """The fields of SGLang's installed ``ServerArgs`` (needs the sglang extra)."""
    from sglang.srt.arg_groups.arg_utils import record_fields
    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    return frozenset(f.name for f in record_fields(SglangServerArgs))


def check_mapping(sglang_fields: frozenset[str]) -> None:
    """Raise ServerArgsError naming every attngate field that SGLang neither has nor is mapped from."""
    problems = []
    for name in ServerArgs.model_fields:
        needed = RENAMED[name].sglang_fields if name in RENAMED else (name,)
        missing = [f for f in needed if f not in sglang_fields]
        if missing:
            problems.append(
                Problem(
                    name,
                    f"SGLang's ServerArgs has no {', '.join(missing)}; it was renamed or dropped: "
                    "map it in attngate/integrations/sglang/fields.py:RENAMED",
                )
            )
    if problems:
        raise ServerArgsError(problems)


def attngate_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """attngate's value of every ServerArgs field, from SGLang's field values (a resolved_dict(), the
    arguments as given, or any mapping with SGLang's field names). Raises ServerArgsError naming each
    attngate field the mapping lacks."""
    check_mapping(frozenset(values))
    return {name: RENAMED[name].read(values) if name in RENAMED else values[name] for name in ServerArgs.model_fields}


def from_sglang(values: Mapping[str, Any]) -> ServerArgs:
    """attngate's ServerArgs from SGLang's field values. Raises ServerArgsError (every bad field)."""
    data = attngate_values(values)
    return ServerArgs.from_mapping(data, source="sglang")


def to_sglang_kwargs(args: ServerArgs | Mapping[str, Any]) -> dict[str, Any]:
    """SGLang ServerArgs keyword arguments that ask for what ``args`` (attngate's names) asks for; only the
    fields that differ from attngate's defaults. Raises ServerArgsError naming every field SGLang cannot express."""
    data = args.non_defaults() if isinstance(args, ServerArgs) else dict(args)
    out: dict[str, Any] = {}
    problems = []
    for name, value in data.items():
        if name not in ServerArgs.model_fields:
            problems.append(Problem(name, "not an attngate server argument"))
        elif name in RENAMED:
            try:
                out.update(RENAMED[name].write(value, data))
            except ValueError as err:
                problems.append(Problem(name, str(err)))
        else:
            out[name] = value
    if problems:
        raise ServerArgsError(problems)
    return out
