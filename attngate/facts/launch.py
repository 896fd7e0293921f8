"""An SGLang launch line read as SGLang 0.5.23 reads it: its argument table (``sglang_flags.json``, taken from SGLang's
own parser by ``attngate.integrations.sglang.tables``), aliases and unambiguous prefixes of long options, ``--no-X``
spellings, argparse's choices, ``--config server.yaml`` merged as SGLang's ConfigArgumentMerger merges it, and a pasted
command head with its environment variables (``attngate.facts.launch_head``). Flags the rules read become attngate
ServerArgs values; every other SGLang flag, and every environment variable, is accepted and listed as not read by any
rule.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, Literal, Optional, get_args, get_origin

from pydantic.fields import FieldInfo

from attngate.errors import MAX_PROBLEMS, Problem, listed
from attngate.facts.choices import NOT_MODELLED, SGLANG_REFUSES, SGLANG_VERSION
from attngate.facts.launch_config import merge_config
from attngate.facts.launch_head import env_notes, split_command, strip_command
from attngate.facts.sglang_names import READ_BY_RENAMED, RENAMED
from attngate.util.suggest import suggestion

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
__all__ = ["LaunchLine", "flag_catalogue", "parse_launch_line", "split_command", "strip_command", "table_source"]


@dataclass(frozen=True)
class Action:
    """One long option of SGLang's parser (a row of sglang_flags.json)."""

    dest: str
    options: tuple[str, ...]
    nargs: int | str  # 0, 1, "?", "*" or "+", as argparse counts them
    kind: str  # store, store_true, store_false, store_const or boolean_optional
    choices: tuple[Any, ...] | None = None  # argparse's choices: any other value is SGLang's "invalid choice"
    config: str = "value"  # how SGLang's --config takes it: store_true, value or unsupported


@dataclass
class LaunchLine:
    """What a launch line asks for: ``values`` holds attngate ServerArgs fields (strings as given, for pydantic to
    validate), ``model_path`` SGLang's --model-path, ``not_read`` the other SGLang flags and the environment variables
    given (in order, once), ``program`` the pasted launcher (None: flags alone), ``env`` its environment variables."""

    values: dict[str, Any] = field(default_factory=dict)
    model_path: str | None = None
    program: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    not_read: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)


@cache
def _sglang_table() -> tuple[tuple[Action, ...], str]:
    raw = json.loads(resources.files("attngate.facts").joinpath("sglang_flags.json").read_text())
    actions = tuple(
        Action(a["dest"], tuple(a["options"]), a["nargs"], a["kind"], _tuple(a.get("choices")), a["config"])
        for a in raw["actions"]
    )
    return actions, raw["source"]


def _tuple(choices: list[Any] | None) -> tuple[Any, ...] | None:
    return None if choices is None else tuple(choices)


def _table(fields: Mapping[str, FieldInfo]) -> dict[str, Action]:
    """Every option: SGLang's, and attngate's own spelling of a field SGLang no longer has as a flag."""
    actions = list(_sglang_table()[0])
    known = {a.dest for a in actions}
    for name, info in fields.items():
        if name not in known:
            actions.append(Action(name, ("--" + name.replace("_", "-"),), 0 if info.annotation is bool else 1, ""))
    return {option: a for a in actions for option in a.options}


def _lookup(
    flag: str, where: str, by_option: dict[str, Action], ordered: list[str], suggest: bool
) -> tuple[Action | None, Problem | None]:
    """The action an option names: exactly, else by unambiguous prefix (argparse's allow_abbrev); else None and
    the problem, at ``where``. ``ordered``: the options sorted (those a prefix names are one run of it, found by
    bisection); ``suggest``: search a did-you-mean (a pass over every option: a line's first MAX_PROBLEMS problems
    get one)."""
    if flag in by_option:
        return by_option[flag], None
    after = itertools.islice(ordered, bisect.bisect_left(ordered, flag), None)
    matches = {by_option[o].dest: o for o in itertools.takewhile(lambda o: o.startswith(flag), after)}
    if len(matches) == 1:
        return by_option[next(iter(matches.values()))], None
    if matches:
        why = f"ambiguous abbreviation: could be {', '.join(sorted(matches.values()))}"
        return None, Problem(where, why, code="server-args.ambiguous-flag")
    hint = suggestion(flag, ordered) if suggest else None
    return None, Problem(where, "unknown SGLang server argument", code="server-args.unknown-flag", help=hint)


def _is_value(token: str) -> bool:
    """Whether a word after a flag is its value, as argparse reads it: one not starting with "-", a negative number
    (-1, -.5), or one holding a space before any "=" (``--served-model-name "--tp 4"``; ``--name=a b`` is a flag with
    its value)."""
    if not token.startswith("-") or token[1:2].isdigit() or token[1:2] == ".":
        return True
    return " " in token.partition("=")[0]


def parse_launch_line(argv: list[str], fields: Mapping[str, FieldInfo]) -> LaunchLine:
    """Read ``argv`` (a launch line split into words) against SGLang's table; ``fields``: attngate's ServerArgs
    fields (``ServerArgs.model_fields``). Every problem is collected (unknown or ambiguous flags with a suggestion, missing values, a bad
    --config file); a flag given twice with different values warns once and the last wins, as in argparse."""
    line = LaunchLine()
    head = split_command(list(argv))
    line.program, line.env, line.problems = head.program, dict(head.env), head.problems
    line.not_read, line.warnings = env_notes(head.env)
    if not head.args:  # no flag to look up: SGLang's table (a few ms of a cold explain to build) is left unread
        argv, origins, by_option, ordered = [], {}, {}, []
    else:
        by_option = _table(fields)
        ordered = sorted(by_option)
        argv, origins = merge_config(head.args, _sglang_table()[0], by_option, line.problems)
    given: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        where, token, i = origins.get(i), argv[i], i + 1
        if token == "--":  # argparse ends the options here; SGLang refuses what follows (unrecognized arguments)
            rest = argv[i:]
            line.problems.append(
                Problem(
                    "--",
                    "SGLang's parser reads no flag after '--'"
                    + (f" and refuses the {len(rest)} word(s) after it as unrecognized arguments" if rest else ""),
                    code="server-args.positional",
                )
            )
            break
        if not token.startswith("--"):
            line.problems.append(
                Problem(
                    token, "unexpected argument: server arguments are --flag [value]", code="server-args.positional"
                )
            )
            continue
        flag, eq, inline = token.partition("=")
        where = where or flag
        action, unknown = _lookup(flag, where, by_option, ordered, len(line.problems) < MAX_PROBLEMS)
        if action is None:
            line.problems.append(unknown)
            i += 0 if eq or i >= len(argv) or not _is_value(argv[i]) else 1  # its value: no second report
            continue
        values: list[str] = [inline] if eq else []
        if not eq and action.nargs not in (0,):
            while i < len(argv) and _is_value(argv[i]) and (action.nargs in ("*", "+") or not values):
                values.append(argv[i])
                i += 1
        value = _value(action, flag, values, bool(eq), line.problems, where)
        if value is _BAD or not _chosen(action, where, values, line.problems):
            continue
        if action.dest == "config":  # the merged file's words are gone: this one SGLang parses and never opens
            line.warnings.append(
                Problem(
                    where,
                    f"SGLang {SGLANG_VERSION} reads a config file only from the two words --config FILE; this one is "
                    "parsed and never read, and neither is it here",
                    code="server-args.config-not-read",
                )
            )
        if action.dest in given and given[action.dest] != value:
            line.warnings.append(
                Problem(
                    where,
                    f"given twice, {given[action.dest]!r} then {value!r}; the last wins",
                    code="server-args.given-twice",
                )
            )
        given[action.dest] = value
        read = action.dest in fields or action.dest in READ_BY_RENAMED or action.dest == "model_path"
        if not read and action.options[0] not in line.not_read:
            line.not_read.append(action.options[0])
    line.model_path = given.pop("model_path", None)
    shown, more = listed(line.warnings)  # one per word at most (a line of thousands of variables): bounded
    line.warnings = shown + ([Problem(None, f"and {more} more warnings", code="usage.more")] if more else [])
    _to_fields(given, fields, line)
    for name, values in NOT_MODELLED.items():
        if line.values.get(name) in values:
            flag = "--" + name.replace("_", "-")
            line.problems.append(
                Problem(
                    flag,
                    f"SGLang {SGLANG_VERSION} accepts {line.values.pop(name)}, which attngate's rules do not model",
                    code="server-args.not-modelled",
                )
            )
    return line


def _chosen(action: Action, where: str, values: list[str], problems: list[Problem]) -> bool:
    """argparse's choices check, on each value as given (its type applied: ``1`` is the int choice 1)."""
    if action.choices is None:
        return True
    for value in values:
        if not any(value == str(c) or _same_number(value, c) for c in action.choices):
            refused = value in {n for names in SGLANG_REFUSES.values() for n in names}
            problems.append(
                Problem(
                    where,
                    f"invalid choice: {value[:200]!r} (choose from {', '.join(map(str, action.choices))})"
                    + (
                        f"; SGLang {SGLANG_VERSION} no longer offers it, though some rules still name it"
                        if refused
                        else ""
                    ),
                    code="server-args.invalid-choice",
                )
            )
            return False
    return True


def _same_number(value: str, choice: Any) -> bool:
    try:
        return not isinstance(choice, (str, bool)) and type(choice)(value) == choice
    except ValueError:
        return False


_BAD = object()


def _value(action: Action, flag: str, values: list[str], inline: bool, problems: list[Problem], where: str) -> Any:
    if action.nargs == 0 and action.kind == "boolean_optional" and not inline:
        return not flag.startswith("--no-")
    if action.nargs == 0:
        if not inline:
            return action.kind != "store_false"
        if values[0].lower() in _TRUE | _FALSE and not action.kind:  # attngate's own switches take =true/false
            return values[0].lower() in _TRUE
        problems.append(Problem(where, f"a switch takes no value, got {values[0]!r}", code="server-args.switch-value"))
        return _BAD
    if not values and action.nargs in (1, "+"):
        problems.append(Problem(where, "expects a value", code="server-args.missing-value"))
        return _BAD
    if action.nargs in ("*", "+"):
        return values
    value = values[0] if values else None
    return None if value == "None" else value


def _to_fields(given: dict[str, Any], fields: Mapping[str, FieldInfo], line: LaunchLine) -> None:
    """SGLang's values as given -> attngate's fields: same-named ones directly, renamed ones through RENAMED."""
    if isinstance(given.get("cuda_graph_config"), str):  # its argparse type parses JSON
        try:
            given["cuda_graph_config"] = json.loads(given["cuda_graph_config"])
        except json.JSONDecodeError as err:
            line.problems.append(
                Problem("--cuda-graph-config", f"not JSON: {err}", code="server-args.cuda-graph-config")
            )
            given.pop("cuda_graph_config")
    for name in fields:
        renamed = RENAMED.get(name)
        if renamed is None or name in given and name not in renamed.sglang_fields:  # attngate's own spelling
            if name in given:
                line.values[name] = _typed(given[name], fields[name])
        elif set(renamed.sglang_fields + renamed.launch_fields) & set(given):
            try:
                line.values[name] = renamed.read(given)
            except (TypeError, ValueError) as err:
                flags = ", ".join("--" + f.replace("_", "-") for f in renamed.sglang_fields if f in given)
                problem = Problem(flags, f"bad value: {err}", code="server-args.invalid-value")
                if problem not in line.problems:  # two fields read from one flag: one report
                    line.problems.append(problem)


def _typed(value: Any, info: FieldInfo) -> Any:
    """A number field's word read as SGLang's argparse ``type`` reads it, ``int()`` or ``float()``, and written back
    in decimal (``1_6``, `` +16`` and fullwidth digits are ``16`` to SGLang); the word as given where that fails
    (validation names it) and for every other field."""
    for number in (int, float):
        if isinstance(value, str) and info.annotation in (number, Optional[number]):
            try:
                return str(number(value))
            except ValueError:
                return value
    return value


def table_source() -> str:
    """Where sglang_flags.json comes from (SGLang's version and parser)."""
    return _sglang_table()[1]


def _takes(annotation: Any) -> str:
    """What a field's flag takes, in words: ``one of fa3, fa4, ...``, ``int``, ``switch``; None allowed: ``or None``."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    optional = len(args) < len(get_args(annotation))
    if annotation is bool:
        return "switch"
    inner = args[0] if optional and len(args) == 1 else annotation
    if get_origin(inner) is Literal:
        text = "one of " + ", ".join(map(str, get_args(inner)))
    else:
        text = getattr(inner, "__name__", str(inner).replace("typing.", ""))
    return text + (" or None" if optional else "")


def flag_catalogue(fields: Mapping[str, FieldInfo]) -> list[dict[str, Any]]:
    """One row per attngate ServerArgs field: the SGLang flags that set it (aliases, and the SGLang flags a renamed
    field is read from), what it takes, its default and description."""
    by_option = _table(fields)
    spellings: dict[str, list[str]] = {}
    for option, action in by_option.items():
        spellings.setdefault(action.dest, []).append(option)
    rows = []
    for name, info in fields.items():
        sources = RENAMED[name].sglang_fields + RENAMED[name].launch_fields if name in RENAMED else ()
        flags = spellings.get(name, []) + [o for f in sources if f != name for o in spellings.get(f, [])]
        rows.append(
            {
                "field": name,
                "flags": flags,
                "takes": _takes(info.annotation),
                "default": info.default,
                "description": info.description or (f"also read from: {RENAMED[name].source}" if sources else ""),
            }
        )
    return rows
