"""attngate.cli.plain prints explain's default screen without rich where rich would print the same bytes: the width it
reads is rich's, and its lines are rich's, under every COLUMNS / LINES / TERM and terminal size; explain's default
screen imports neither rich's console nor the rules' parser (a cold start pays for neither, issue 53 item 9)."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from attngate.cli import plain, render
from tests.support.helpers import ROOT

LINES = [
    "attention plan: fa3 (prefill) / fa3 (decode)  model=examples/models/Llama-3.1-8B.json  gpu=sm90",
    "  flashinfer.use_ragged_prefill = False <- flashinfer.deterministic-no-ragged + flashinfer.no-ragged-multimodal",
    "",
    "    indented " + "word " * 60,
    "a-very-long-rule-id-" * 12,
    "controls \x1b[31m and a tab\tmade visible",
]
NON_ASCII = ["model=Llamä-3 \u202e reversed", "日本語のモデル名 " * 10]


def _size(columns: int | None):
    def get_terminal_size(fd: int = 1) -> os.terminal_size:
        if columns is None:
            raise OSError("not a terminal")
        return os.terminal_size((columns, 24))

    return get_terminal_size


ENVIRONMENTS = [
    {},
    {"COLUMNS": "80"},
    {"COLUMNS": "120", "LINES": "30"},
    {"COLUMNS": "0"},
    {"COLUMNS": "100000"},
    {"COLUMNS": "abc"},
    {"COLUMNS": "-5"},
    {"COLUMNS": "\uff11\uff12\uff10"},  # full-width digits: str.isdigit, and int() reads them
    {"LINES": "40"},
    {"TERM": "xterm-256color"},
]


@pytest.mark.parametrize("terminal", [None, 0, 64, 150, 500])
@pytest.mark.parametrize("env", ENVIRONMENTS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "unset")
@pytest.mark.parametrize("lines", [LINES, NON_ASCII, LINES + NON_ASCII], ids=["ascii", "non-ascii", "mixed"])
def test_plain_lines_are_the_bytes_rich_prints(monkeypatch, env, terminal, lines):
    for name in ("COLUMNS", "LINES", "TERM"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "get_terminal_size", _size(terminal))
    outputs = []
    for printer in (plain.print_lines, lambda ls: plain.print_rich_lines([plain.visible(x) for x in ls])):
        out = io.StringIO()
        monkeypatch.setattr(sys, "stdout", out)
        printer(lines)
        outputs.append(out.getvalue())
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    assert outputs[0] == outputs[1]
    if plain.console_width() is not None:
        assert plain.console_width() == render._console().width


@pytest.mark.parametrize("term", ["dumb", "unknown", "DUMB"])
def test_a_dumb_terminal_is_left_to_rich(monkeypatch, term):
    monkeypatch.setenv("TERM", term)
    assert plain.console_width() is None


def test_jupyter_is_left_to_rich(monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "get_ipython", lambda: None, raising=False)
    assert plain.console_width() is None


def test_explains_default_screen_imports_neither_rich_console_nor_the_rules_parser(tmp_path):
    script = (
        "import sys\n"
        "from attngate.cli import main\n"
        "try:\n"
        "    main(['explain', '--gpu', 'sm90', '--model', 'examples/models/Llama-3.1-8B.json'])\n"
        "except SystemExit as done:\n"
        "    assert done.code == 0, done.code\n"
        "unused = ['rich.console', 'rich.table', 'attngate.rules.check', 'attngate.rules.spec', 'attngate.util.yaml_source']\n"
        "print(' '.join(m for m in unused if m in sys.modules), file=sys.stderr)\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    env.pop("ATTNGATE_NO_CACHE", None)
    runs = [
        subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True)
        for _ in range(2)
    ]
    assert [r.returncode for r in runs] == [0, 0], runs
    assert runs[0].stdout == runs[1].stdout and "Llama-3.1-8B.json on sm90: backend" in runs[0].stdout
    assert runs[0].stderr.split() == ["attngate.rules.check", "attngate.rules.spec", "attngate.util.yaml_source"]
    assert runs[1].stderr.split() == []  # the rules came from the disk cache (attngate.rules.cache)
