"""Parse SGLang-spelled command-line flags against the ServerArgs fields, collecting every problem."""

from __future__ import annotations

from typing import Any

from pydantic.fields import FieldInfo

from attngate.errors import Problem
from attngate.util.suggest import did_you_mean

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_flags(
    argv: list[str], fields: dict[str, FieldInfo], *, warnings: list[Problem] | None = None
) -> tuple[dict[str, Any], list[Problem]]:
    """Map ``--kebab-case`` flags to field values; values stay strings for pydantic to coerce.

    A flag given twice keeps its last value, as argparse does; with different values a warning naming
    both goes to ``warnings``."""
    given: dict[str, tuple[str, Any]] = {}
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    known_flags = ["--" + n.replace("_", "-") for n in fields]
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not token.startswith("--"):
            problems.append(Problem(token, "unexpected argument: server arguments are --flag [value]"))
            continue
        flag, eq, inline = token.partition("=")
        name = flag[2:].replace("-", "_")
        field = fields.get(name)
        if field is None:
            problems.append(Problem(flag, "unknown server argument" + did_you_mean(flag, known_flags)))
            if not eq and i < len(argv) and not argv[i].startswith("--"):
                i += 1  # its value: do not report it a second time as a stray argument
            continue
        if field.annotation is bool:
            if not eq:
                values[name] = True
            elif inline.lower() in _TRUE | _FALSE:
                values[name] = inline.lower() in _TRUE
            else:
                problems.append(Problem(flag, f"a switch takes no value or true/false, got {inline!r}"))
            continue
        if eq:
            values[name] = inline
        elif i < len(argv) and not argv[i].startswith("--"):
            values[name] = argv[i]
            i += 1
        else:
            problems.append(Problem(flag, "expects a value"))
            continue
        if values[name] == "None":
            values[name] = None
        _note_repeat(given, name, token, values[name], warnings)
    return values, problems


def _note_repeat(
    given: dict[str, tuple[str, Any]], name: str, token: str, value: Any, warnings: list[Problem] | None
) -> None:
    if name in given and given[name][1] != value and warnings is not None:
        warnings.append(
            Problem(token.partition("=")[0], f"given twice, {given[name][1]!r} then {value!r}; the last wins")
        )
    given[name] = (token, value)
