"""The README and the docs: the support matrices of docs/matrix.md equal what `attngate matrix --format markdown`
prints now; the start-up snippet runs as written and the docs hold the same one; the README stays short."""

from __future__ import annotations

import re
import shlex

from typer.testing import CliRunner

from attngate.cli import app
from tests.support.helpers import ROOT

BLOCK = re.compile(r"<!-- matrix: attngate (?P<cmd>[^>]*) -->\n(?P<body>.*?)\n<!-- /matrix -->", re.S)


def test_docs_support_matrices_are_generated_and_current(monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name paths relative to the repository root
    readme = (ROOT / "docs" / "matrix.md").read_text()
    blocks = list(BLOCK.finditer(readme))
    assert len(blocks) >= 2
    for block in blocks:
        res = CliRunner().invoke(app, shlex.split(block["cmd"]))
        assert res.exit_code == 0, res.output
        assert res.stdout.rstrip("\n") == block["body"], (
            f"docs/matrix.md is stale; regenerate it with: attngate {block['cmd']}"
        )


def test_readme_library_snippet_runs_as_written(monkeypatch):
    """The start-up snippet, with its free names bound the way a server would bind them."""
    import logging
    import types

    text = (ROOT / "README.md").read_text()
    code = re.search(r"## The library call at server start-up\n\n```python\n(.*?)```", text, re.S).group(1)
    import attngate.integrations.distributed as distributed

    monkeypatch.setattr(
        distributed, "check_plan_consistency", lambda resolution, group=None: None
    )  # one process, no group
    from attngate import Platform

    monkeypatch.setattr(Platform, "detect", classmethod(lambda cls: Platform.from_name("sm90")))
    server_args = types.SimpleNamespace(attention_backend="fa3", page_size=16, unrelated_flag=True)
    exec(
        compile(code, "README.md", "exec"),
        {
            "server_args": server_args,
            "model_path": str(ROOT / "examples/models/Llama-3.1-8B.json"),
            "log": logging.getLogger("readme"),
        },
    )


def test_the_readme_is_short_and_the_docs_hold_its_start_up_snippet():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    snippet = re.compile(r"## The library call at server start-up\n\n```python\n(.*?)```", re.S)
    assert snippet.search(readme).group(1) == snippet.search((ROOT / "docs" / "integrations.md").read_text()).group(1)
