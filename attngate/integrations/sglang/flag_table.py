"""SGLang 0.5.23's launch-line argument table, read off its own argparse parser: the data behind
``attngate/facts/sglang_flags.json``, which attngate parses launch lines with (no sglang needed there).

Regenerate after an SGLang upgrade (needs the sglang extra)::

    python -m attngate.integrations.sglang.flag_table > attngate/facts/sglang_flags.json

``tests/integrations/sglang/test_launch_line.py`` fails when the shipped table and the installed parser differ.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

SOURCE = "sglang 0.5.23 sglang.srt.server_args:ServerArgs.add_cli_args (argparse, allow_abbrev)"


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


def sglang_flag_table() -> dict[str, Any]:
    """Every long option of SGLang's server parser: its dest, spellings, how many values it takes and what it
    stores; plus the parser's allow_abbrev (unambiguous prefixes of long options are accepted)."""
    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    parser = argparse.ArgumentParser()
    SglangServerArgs.add_cli_args(parser)
    actions = []
    for action in parser._actions:
        options = [o for o in action.option_strings if o.startswith("--") and o != "--help"]
        if not options:
            continue
        actions.append({"dest": action.dest, "options": options, "nargs": _nargs(action), "kind": _kind(action)})
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
