"""The environment variables SGLang 0.5.23 reads, found in its own sources: the data behind
``attngate/facts/sglang_env.json``, with which a pasted launch line's ``NAME=value`` words are read (no sglang needed
there). A variable is *read* when ``sglang.srt.environ.Envs`` declares it (or names it as a deprecated spelling), or a
source file reads it by name (``os.environ``, ``os.getenv``, ``get_bool_env_var`` ...); it is *attention* when a file
of SGLang's attention layer or its attention-backend resolution names it: there it changes what the attention
backends do, which no attngate rule reads (attngate models no environment variable).

Regenerate with ``python -m attngate.integrations.sglang.tables --write``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from attngate.facts.choices import SGLANG_VERSION

SOURCE = f"sglang {SGLANG_VERSION} sglang/srt/environ.py:Envs and every read of an environment variable by name in its sources"
#: SGLang's files (relative to the sglang package) whose variables change attention decisions
ATTENTION_SOURCES = ("srt/layers/attention/", "srt/layers/radix_attention.py", "srt/arg_groups/attention_hook.py")
_READ = re.compile(
    r"""(?:environ\.get|getenv|environ\.setdefault|get_(?:bool|int|float|str)_env_var)\(\s*["']([A-Z][A-Z0-9_]+)["']"""
    r"""|environ\[\s*["']([A-Z][A-Z0-9_]+)["']\s*\](?!\s*=[^=])"""
    r"""|["']([A-Z][A-Z0-9_]+)["']\s+(?:not\s+)?in\s+os\.environ"""
)


def _declared() -> set[str]:
    from sglang.srt import environ

    names = set()
    for name, value in vars(environ.Envs).items():
        if isinstance(value, environ.EnvField):
            names.add(name)
            names.update(n for n in [getattr(value, "deprecated_name", None)] if n)
    return names | set(getattr(environ, "_DEPRECATED_ENVS", {}))


def sglang_env_table() -> dict[str, Any]:
    """``attention``: the variables SGLang's attention code names, each with the files that name it; ``read``: every
    ``SGLANG_`` variable SGLang reads (a pasted one that is not among them is one SGLang 0.5.23 never reads)."""
    import sglang

    root = Path(sglang.__file__).parent
    files = {
        str(p.relative_to(root)): p.read_text(errors="replace")
        for p in sorted(root.rglob("*.py"))
        if p.relative_to(root).parts[0] != "test"
    }
    read = _declared()
    for text in files.values():
        read.update(next(n for n in names if n) for names in _READ.findall(text))
    attention: dict[str, list[str]] = {}
    for path, text in files.items():
        if path.startswith(ATTENTION_SOURCES):
            for name in sorted(read):
                if name in text and re.search(rf"\b{name}\b", text):
                    attention.setdefault(name, []).append(path)
    return {
        "source": SOURCE,
        "attention_sources": list(ATTENTION_SOURCES),
        "attention": dict(sorted(attention.items())),
        "read": sorted(n for n in read if n.startswith("SGLANG_")),
    }


def dumps(table: dict[str, Any]) -> str:
    """One variable per line, so that a diff shows one variable per line."""
    head = "".join(f"  {json.dumps(k)}: {json.dumps(table[k])},\n" for k in ("source", "attention_sources"))
    attention = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in table["attention"].items())
    read = ",\n".join(f"    {json.dumps(n)}" for n in table["read"])
    return "{\n" + head + f'  "attention": {{\n{attention}\n  }},\n  "read": [\n{read}\n  ]\n}}\n'
