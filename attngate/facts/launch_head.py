"""The head of a pasted SGLang launch line, split as SGLang 0.5.23's entry points split it, and the environment
variables it sets.

The program is the first word that is a launcher: ``python[3[.N]] [-u ...] -m sglang.launch_server``, ``python -m
sglang.cli.main serve``, ``sglang serve`` (whose ``--model-type X`` is taken out and whose positional model becomes
``--model-path``, as sglang/cli/serve.py does), ``python .../launch_server.py`` or a ``.../launch_server.py`` run as the
program. Only the words before the first ``-`` word are searched, so a value (which always follows a flag) is never
taken for the program. Before it: ``NAME=value`` assignments, ``env [-i] [-u NAME] NAME=value ...`` and wrapper words
(``nohup``, ``uv run``, ``time``). The assignments are read where SGLang reads them: ``sglang_env.json`` (derived from
SGLang's sources by ``attngate.integrations.sglang.tables``) says which ones SGLang's attention code reads; attngate
models none of them, so each is listed as not read by any rule, and one that changes SGLang's attention, or an
``SGLANG_`` name SGLang never reads, comes with a warning.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import PurePosixPath

from attngate.errors import Problem, clip
from attngate.facts.choices import SGLANG_VERSION

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
_PYTHON_TAKES_VALUE = ("-W", "-X", "--check-hash-based-pycs")
_ENV_TAKES_VALUE = ("-u", "--unset", "-C", "--chdir")
_QUOTE = 200  # at most this many characters of an input quoted in a message


@dataclass
class Head:
    """``program``: the launcher as written (None: the line is SGLang's arguments alone); ``env``: the assignments
    before it; ``args``: SGLang's own arguments, as its entry point hands them to prepare_server_args."""

    program: str | None = None
    env: list[tuple[str, str]] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def _name(word: str) -> str:
    return PurePosixPath(word).name


def _launcher(argv: list[str], i: int) -> tuple[int, str] | None:
    """Where SGLang's arguments start and the launcher's name, if one starts at ``argv[i]``."""
    word, name = argv[i], _name(argv[i])
    if name == "sglang" and argv[i + 1 : i + 2] == ["serve"]:
        return i + 2, "sglang serve"
    if name == "launch_server.py":
        return i + 1, word
    if not _PYTHON.match(name):
        return None
    j = i + 1
    while j < len(argv) and argv[j].startswith("-") and not argv[j].startswith(("-m", "-c")) and argv[j] != "-":
        j += 2 if argv[j] in _PYTHON_TAKES_VALUE else 1
    if j < len(argv) and argv[j].startswith("-m"):
        module, k = (argv[j][2:], j + 1) if argv[j] != "-m" else (argv[j + 1] if j + 1 < len(argv) else "", j + 2)
        if module == "sglang.launch_server":
            return k, f"{name} -m sglang.launch_server"
        if module == "sglang.cli.main" and argv[k : k + 1] == ["serve"]:
            return k + 1, f"{name} -m sglang.cli.main serve"
        return None
    if j < len(argv) and _name(argv[j]) == "launch_server.py":
        return j + 1, f"{name} {argv[j]}"
    return None


def _serve(args: list[str], head: Head) -> list[str]:
    """sglang/cli/serve.py: ``--model-type X`` taken out (the LLM server is the one attngate plans), then a first
    word that is not a flag becomes --model-path."""
    rest, i = [], 0
    while i < len(args):
        if args[i] == "--model-type" or args[i].startswith("--model-type="):
            backend = args[i].partition("=")[2] if "=" in args[i] else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in args[i] else 2
            if backend not in ("auto", "llm"):
                head.problems.append(
                    Problem(
                        "--model-type",
                        f"{backend[:_QUOTE]!r}: attngate plans SGLang's LLM server (--model-type llm or auto)"
                        if backend
                        else "requires a value (sglang serve: 'Error: --model-type requires a value.')",
                        code="server-args.model-type",
                    )
                )
            continue
        rest.append(args[i])
        i += 1
    return ["--model-path", *rest] if rest and not rest[0].startswith("-") else rest


def split_command(argv: list[str]) -> Head:
    """Split a pasted launch line into its environment, its launcher and SGLang's own arguments. Without a launcher
    before the first flag the line is SGLang's arguments as they stand (after any leading assignments)."""
    head, i, leading, leading_env = Head(), 0, None, 0
    while i < len(argv):
        word = argv[i]
        if assign := _ASSIGN.match(word):
            head.env.append((assign[1], assign[2]))
            i += 1
            continue
        if _name(word) == "env":
            i += 1
            while i < len(argv) and argv[i].startswith("-"):
                i += 2 if argv[i] in _ENV_TAKES_VALUE else 1
            continue
        if leading is None:
            leading, leading_env = i, len(head.env)
        if word.startswith("-"):  # a flag (``--model-path=/x/launch_server.py`` too): SGLang's arguments start here
            break
        found = _launcher(argv, i)
        if found is not None:
            end, head.program = found
            rest = argv[end:]
            head.args = _serve(rest, head) if head.program.endswith("serve") else rest
            return head
        i += 1  # a wrapper word: nohup, uv run, time ...
    if leading is not None:  # the words from the first one that is not an assignment are SGLang's arguments
        head.env, head.args = head.env[:leading_env], argv[leading:]
    return head


def strip_command(argv: list[str]) -> list[str]:
    """SGLang's own arguments of a pasted launch line (split_command's ``args``)."""
    return split_command(list(argv)).args


@cache
def _env_table() -> tuple[dict[str, list[str]], frozenset[str]]:
    raw = json.loads(resources.files("attngate.facts").joinpath("sglang_env.json").read_text())
    return raw["attention"], frozenset(raw["read"])


def env_notes(env: list[tuple[str, str]]) -> tuple[list[str], list[Problem]]:
    """The variables a launch line sets, each once (no rule reads any), and a warning for each that SGLang's attention
    code reads or that is an ``SGLANG_`` name SGLang 0.5.23 never reads."""
    names: list[str] = []
    warnings: list[Problem] = []
    if not env:
        return names, warnings
    attention, read = _env_table()
    seen: set[str] = set()
    for name, value in env:
        if name in seen:
            continue
        seen.add(name)
        names.append(clip(name))
        where = f"environment variable {clip(name, _QUOTE)}={value[:_QUOTE]}"
        if name in attention:
            files = ", ".join(attention[name][:3]) + (" ..." if len(attention[name]) > 3 else "")
            warnings.append(
                Problem(
                    where,
                    f"SGLang {SGLANG_VERSION}'s attention code reads it ({files}); no rule reads it, so the plan "
                    "does not account for it",
                    code="server-args.environment-unmodelled",
                )
            )
        elif name.startswith("SGLANG_") and name not in read:
            warnings.append(
                Problem(
                    where,
                    f"SGLang {SGLANG_VERSION} reads no such environment variable, and no rule reads it",
                    code="server-args.environment-unknown",
                )
            )
    return names, warnings
