"""SGLang 0.5.23's ``--config FILE`` as prepare_server_args and its ConfigArgumentMerger
(sglang/srt/utils/server_args_config_parser.py) merge it into a launch line: one file, given as the two words
``--config FILE``; each key becomes the flag ``--KEY`` spelled as written; the file's flags go before the command
line's own, so that the command line wins. ``actions`` are the rows of SGLang's flag table (sglang_flags.json, each
with the ``config`` handling its merger gives it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from attngate.errors import Problem, ServerArgsError
from attngate.util.inputs import read_text


def merge_config(
    argv: list[str], actions: Sequence[Any], by_option: Mapping[str, Any], problems: list[Problem]
) -> tuple[list[str], dict[int, str]]:
    """prepare_server_args' ``--config FILE``: taken only as the word ``--config`` followed by the file (not
    ``--config=FILE`` nor a prefix), once; the file's flags come before the command line's own (the command line
    wins). Returns the merged words and, for the file's flags, where in the file each comes from."""
    at = [i for i, word in enumerate(argv) if word == "--config"]
    if len(at) > 1:
        problems.append(
            Problem(
                "--config",
                "given twice: SGLang takes one config file ('Multiple config files specified! Only one allowed.')",
                code="server-args.config-twice",
            )
        )
        return [w for i, w in enumerate(argv) if i not in at and i - 1 not in at], {}
    if not at:
        return argv, {}
    if at[0] == len(argv) - 1:
        problems.append(
            Problem(
                "--config",
                "expects a YAML file ('No config file specified after --config flag!')",
                code="server-args.config-missing",
            )
        )
        return argv[:-1], {}
    flags, origins = _config_args(argv[at[0] + 1], actions, by_option, problems)
    return flags + argv[: at[0]] + argv[at[0] + 2 :], origins


def _config_keys(action: Any) -> set[str]:
    return {action.dest} | {o[2:].replace("-", "_") for o in action.options}


def _config_args(
    path: str, actions: Sequence[Any], by_option: Mapping[str, Any], problems: list[Problem]
) -> tuple[list[str], dict[int, str]]:
    """ConfigArgumentMerger._convert_config_to_args: each key of the YAML mapping becomes ``--KEY`` as it is spelled
    (so ``tp-size`` and ``tp`` work, ``tp_size`` does not: SGLang's parser does not know ``--tp_size``), a True switch
    the bare flag, a False one nothing, another boolean ``true``/``false``, a list its items, a mapping its JSON."""
    from attngate.util.yaml_source import load_yaml

    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        problems.append(
            Problem(f"--config {path}", "SGLang reads only .yaml/.yml config files", code="server-args.config-suffix")
        )
        return [], {}
    try:
        text = read_text(Path(path), ServerArgsError, "--config file")
    except ServerArgsError as err:
        problems.extend(err.problems)
        return [], {}
    doc, yaml_problems = load_yaml(text, path)
    if yaml_problems or not isinstance(doc.data, (dict, type(None))):
        problems.extend(
            yaml_problems
            or [
                Problem(
                    path, "a config file holds a mapping of flag names to values", code="server-args.config-not-mapping"
                )
            ]
        )
        return [], {}
    supported = {k for a in actions if a.config != "unsupported" for k in _config_keys(a)}
    store_true = {k for a in actions if a.config == "store_true" for k in _config_keys(a)}
    unsupported = {
        k: a for a in actions if a.config == "unsupported" and a.dest != "config" for k in _config_keys(a) - supported
    }
    out: list[str] = []
    origins: dict[int, str] = {}
    for key, value in (doc.data or {}).items():
        where = f"{doc.where((key,))}: {key}"
        if not isinstance(key, str):
            problems.append(Problem(where, "a config key is a flag name", code="server-args.config-key"))
            continue
        norm, flag = key.replace("-", "_"), f"--{key}"
        if norm in unsupported:  # refused before anything is parsed, as SGLang refuses it
            action = unsupported[norm]
            takes = f"a {action.options[0]}/--no-... switch" if action.kind == "boolean_optional" else "not one value"
            problems.append(
                Problem(
                    where,
                    f"SGLang's --config does not take {action.options[0]} ({takes})",
                    code="server-args.config-unsupported",
                )
            )
            continue
        if "_" in key and flag not in by_option and "--" + key.replace("_", "-") in by_option:
            problems.append(
                Problem(
                    where,
                    f"SGLang's --config passes this key as {flag}, which its parser does not know: write "
                    f"{key.replace('_', '-')}",
                    code="server-args.config-underscore",
                )
            )
            continue
        origins[len(out)] = where
        if isinstance(value, bool):
            out += ([flag] if value else []) if norm in store_true else [flag, str(value).lower()]
        elif isinstance(value, list):
            out += [flag, *map(str, value)] if value else []
        else:
            out += [flag, json.dumps(value) if isinstance(value, dict) else str(value)]
    return out, {i: w for i, w in origins.items() if i < len(out)}
