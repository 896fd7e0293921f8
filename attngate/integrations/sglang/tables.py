"""attngate's tables of SGLang's front door, derived from the installed SGLang 0.5.23 and checked against it: the
launch-line flag table (``attngate/facts/sglang_flags.json``: every option, its spellings, arity, choices and --config
handling), the environment variables SGLang reads (``attngate/facts/sglang_env.json``) and the choice lists of
``attngate/facts/choices.py`` (each ``Literal`` rewritten from SGLang's list, the declared exceptions kept).

Run where sglang is installed (the sglang extra)::

    python -m attngate.integrations.sglang.tables --check   # exit 1 and a line per table that drifted
    python -m attngate.integrations.sglang.tables --write   # rewrite the tables from the installed SGLang

``tests/integrations/sglang/test_tables.py`` runs the check in CI (.ci/run, the sglang venv).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from attngate.facts.choices import SGLANG_VERSION
from attngate.integrations.sglang import env_table, flag_table

FACTS = Path(__file__).resolve().parents[2] / "facts"
CHOICES = FACTS / "choices.py"

#: Each Literal of choices.py: the attngate ServerArgs fields it types and where SGLang 0.5.23 lists its values (a
#: parser option's choices, or ``module:NAME`` where the parser takes any string and SGLang checks it later).
SOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "AttentionBackendName": (
        ("attention_backend", "prefill_attention_backend", "decode_attention_backend"),
        "--attention-backend",
    ),
    "DraftAttentionBackendName": (
        ("speculative_draft_attention_backend",),
        "sglang.srt.arg_groups.choices:DRAFT_ATTENTION_BACKEND_CHOICES",
    ),
    "KvCacheDtype": (("kv_cache_dtype",), "--kv-cache-dtype"),
    "ModelDtype": (("dtype",), "--dtype"),
    "SpeculativeAlgorithm": (("speculative_algorithm",), "sglang.srt.speculative.spec_info:SpeculativeAlgorithm"),
    "SamplingBackend": (("sampling_backend",), "--sampling-backend"),
    "HicacheIoBackend": (("hicache_io_backend",), "--hicache-io-backend"),
    "DisaggregationMode": (("disaggregation_mode",), "--disaggregation-mode"),
    "SpeculativeAttentionMode": (("speculative_attention_mode",), "--speculative-attention-mode"),
}
_BLOCK = re.compile(r"^(?P<name>\w+) = Literal\[(?P<body>[^\]]*)\]\n", re.M)


def sglang_lists(flags: dict[str, Any]) -> dict[str, list[str]]:
    """SGLang 0.5.23's list for each Literal of SOURCES, in SGLang's order."""
    choices = {o: a.get("choices") for a in flags["actions"] for o in a["options"]}
    out = {}
    for name, (_, source) in SOURCES.items():
        if source.startswith("--"):
            out[name] = [str(c) for c in choices[source]]
            continue
        module, attr = source.split(":")
        value = getattr(importlib.import_module(module), attr)
        if attr == "SpeculativeAlgorithm":  # the enum's members but NONE, then the names it reads as aliases
            from sglang.srt.speculative.spec_registry import _RESERVED_ALIASES

            out[name] = [m.name for m in value if m.name != "NONE"] + sorted(_RESERVED_ALIASES)
        else:
            out[name] = list(value)
    return out


def _merged(current: list[str], sglang: list[str], keep: tuple[str, ...], skip: tuple[str, ...]) -> list[str]:
    """attngate's order kept for the names SGLang still lists (and ``keep``); a new name after its predecessor in
    SGLang's list; ``skip`` left out."""
    out = [n for n in current if n in sglang and n not in skip or n in keep]
    for i, n in enumerate(sglang):
        if n in out or n in skip:
            continue
        before = next((p for p in reversed(sglang[:i]) if p in out), None)
        out.insert(out.index(before) + 1 if before else 0, n)
    return out


def _literal(name: str, values: list[str], multiline: bool) -> str:
    one = f"{name} = Literal[{', '.join(map(repr, values))}]\n".replace("'", '"')
    if len(one) <= 121 and not multiline:
        return one
    return f"{name} = Literal[\n" + "".join(f'    "{v}",\n' for v in values) + "]\n"


def choices_text(text: str, lists: dict[str, list[str]]) -> str:
    """choices.py with each Literal of SOURCES rewritten from SGLang's lists."""
    from attngate.facts import choices

    def block(m: re.Match) -> str:
        name = m["name"]
        if name not in SOURCES:
            return m[0]
        current = list(get_args(getattr(choices, name)))
        values = _merged(
            current,
            lists[name],
            choices.SGLANG_REFUSES.get(name, ()),
            tuple(n for f in SOURCES[name][0] for n in choices.NOT_MODELLED.get(f, ())),
        )
        return _literal(name, values, "\n" in m["body"])

    return _BLOCK.sub(block, text)


def problems(lists: dict[str, list[str]]) -> list[str]:
    """Declarations of choices.py that SGLang's lists contradict, and Literal fields that no source covers."""
    from attngate.facts import choices
    from attngate.facts.server_args import ServerArgs

    out = []
    for name, refused in choices.SGLANG_REFUSES.items():
        out += [
            f"choices.SGLANG_REFUSES: SGLang {SGLANG_VERSION} accepts {name} {n!r}" for n in refused if n in lists[name]
        ]
    typed = {f for fields, _ in SOURCES.values() for f in fields}
    for field, info in ServerArgs.model_fields.items():
        args = [a for a in get_args(info.annotation) if a is not type(None)] or [info.annotation]
        if get_origin(args[0]) is Literal and field not in typed:
            out.append(f"ServerArgs.{field} takes a Literal that no SGLang source in tables.SOURCES derives")
        modelled = set(get_args(args[0]))
        for value in choices.NOT_MODELLED.get(field, ()):
            name = next(n for n, (fields, _) in SOURCES.items() if field in fields)
            if value not in lists[name] or value in modelled:
                out.append(
                    f"choices.NOT_MODELLED[{field!r}]: {value!r} is not a value SGLang accepts and attngate lacks"
                )
    return out


def snapshot() -> dict[str, Any]:
    """SGLang's tables as a fresh interpreter sees them on importing its parser, as ``sglang serve`` does: a process
    that has imported more of SGLang (its model configs, its resolution) may have filled registries that reorder
    choices (--reasoning-parser) or extend them."""
    code = (
        "import json; from attngate.integrations.sglang import env_table, flag_table, tables; "
        "f = flag_table.sglang_flag_table(); "
        "print(json.dumps({'flags': f, 'env': env_table.sglang_env_table(), 'lists': tables.sglang_lists(f)}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"reading SGLang's tables failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def generated(tables: dict[str, Any] | None = None) -> dict[Path, str]:
    """Every table's text as the installed SGLang gives it."""
    tables = tables or snapshot()
    return {
        FACTS / "sglang_flags.json": flag_table.dumps(tables["flags"]),
        FACTS / "sglang_env.json": env_table.dumps(tables["env"]),
        CHOICES: choices_text(CHOICES.read_text(), tables["lists"]),
    }


def check(tables: dict[str, Any] | None = None) -> list[str]:
    """One line per table that differs from the installed SGLang's, and per declaration it contradicts."""
    tables = tables or snapshot()
    out = [
        f"{path.relative_to(FACTS.parents[1])} differs from the installed SGLang's: python -m {__spec__.name} --write"
        for path, text in generated(tables).items()
        if not path.exists() or path.read_text() != text
    ]
    return out + problems(tables["lists"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare the tables with the installed SGLang (default)")
    mode.add_argument("--write", action="store_true", help="rewrite the tables from the installed SGLang")
    tables = snapshot()
    if parser.parse_args(argv).write:
        for path, text in generated(tables).items():
            if not path.exists() or path.read_text() != text:
                path.write_text(text)
                print(f"wrote {path}")
    found = check(tables)
    print("\n".join(found) or f"every table is SGLang {SGLANG_VERSION}'s")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
