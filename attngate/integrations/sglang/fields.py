"""attngate's ServerArgs <-> SGLang 0.5.23's ServerArgs, field by field.

Every attngate field is read from SGLang under its own name, except the few SGLang renamed or folded
into another field (:data:`RENAMED`, each with its source). A field that SGLang does not have and
that no entry here maps is an error naming it: a silent default would hide exactly the drift this
module exists to catch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attngate.errors import Problem, ServerArgsError
from attngate.facts.server_args import ServerArgs
from attngate.facts.sglang_names import RENAMED, Renamed

__all__ = [
    "RENAMED",
    "Renamed",
    "attngate_values",
    "check_mapping",
    "from_sglang",
    "sglang_field_names",
    "to_sglang_kwargs",
]


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
                    f"SGLang's ServerArgs has no {', '.join(missing)}; it was renamed or dropped",
                    code="server-args.not-in-sglang",
                    help="map it in attngate/integrations/sglang/fields.py:RENAMED",
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
            problems.append(Problem(name, "not an attngate server argument", code="server-args.unknown-field"))
        elif name in RENAMED:
            try:
                out.update(RENAMED[name].write(value, data))
            except ValueError as err:
                problems.append(Problem(name, str(err), code="server-args.not-expressible-in-sglang"))
        else:
            out[name] = value
    if problems:
        raise ServerArgsError(problems)
    return out
