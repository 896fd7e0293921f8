"""SGLang 0.5.23's launch-line argument table, read off its own argparse parser: the data behind
``attngate/facts/sglang_flags.json``, which attngate parses launch lines with (no sglang needed there). Each row holds
an option's dest, spellings, how many values it takes, what it stores, its choices (argparse's ``invalid choice``
where a value is not one of them) and how SGLang's ``--config`` file takes it (ConfigArgumentMerger: ``store_true``,
``value`` or ``unsupported``).

Regenerate after an SGLang upgrade (needs the sglang extra), with the other tables derived from SGLang::

    python -m attngate.integrations.sglang.tables --write

``tests/integrations/sglang/test_tables.py`` fails when the shipped table and the installed parser differ.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from attngate.facts.choices import SGLANG_VERSION

SOURCE = f"sglang {SGLANG_VERSION} sglang.srt.server_args:ServerArgs.add_cli_args (argparse, allow_abbrev)"


def _kind(action: argparse.Action) -> str:
    if isinstance(action, argparse.BooleanOptionalAction):
        return "boolean_optional"
    if isinstance(action, argparse._StoreFalseAction):
        return "store_false"
    if isinstance(action, argparse._StoreTrueAction) or (action.nargs == 0 and action.const in (None, True)):
        return "store_true"  # SGLang's DeprecatedStoreTrueAction takes no value and stores True
    if action.nargs == 0:
        return "store_const"
    return "store"


def _nargs(action: argparse.Action) -> int | str:
    if action.nargs is None:
        return 1
    return action.nargs


def _choices(action: argparse.Action) -> list[Any] | None:
    """argparse's choices in SGLang's order (a set, e.g. the sampling backends, sorted: the file stays stable)."""
    if action.choices is None:
        return None
    if isinstance(action.choices, (set, frozenset)):
        return sorted(action.choices, key=str)
    return list(action.choices)


def _config(action: argparse.Action) -> str:
    """How ConfigArgumentMerger (sglang/srt/utils/server_args_config_parser.py) takes a key naming this action."""
    from sglang.srt.utils.server_args_config_parser import _takes_one_value

    if isinstance(action, argparse._StoreTrueAction):
        return "store_true"
    return "value" if _takes_one_value(action) else "unsupported"


def sglang_flag_table() -> dict[str, Any]:
    """Every long option of SGLang's server parser: its dest, spellings, how many values it takes, what it stores,
    its choices and its --config handling; plus the parser's allow_abbrev (unambiguous prefixes are accepted)."""
    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    parser = argparse.ArgumentParser()
    SglangServerArgs.add_cli_args(parser)
    actions = []
    for action in parser._actions:
        options = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        if not options:
            continue
        row = {"dest": action.dest, "options": options, "nargs": _nargs(action), "kind": _kind(action)}
        choices = _choices(action)
        if choices is not None:
            row["choices"] = choices
        actions.append(row | {"config": _config(action)})
    return {"source": SOURCE, "allow_abbrev": parser.allow_abbrev, "actions": actions}


def dumps(table: dict[str, Any]) -> str:
    """The table as the shipped file spells it: one action per line, so that a diff shows one flag per line."""
    rows = ",\n".join("    " + json.dumps(a) for a in table["actions"])
    head = {k: v for k, v in table.items() if k != "actions"}
    return (
        "{\n"
        + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
        + (f'  "actions": [\n{rows}\n  ]\n}}\n')
    )


if __name__ == "__main__":
    print(dumps(sglang_flag_table()), end="")
