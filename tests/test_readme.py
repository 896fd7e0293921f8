"""The README's generated support matrices equal what `attngate matrix --format markdown` prints now."""

from __future__ import annotations

import re
import shlex

from typer.testing import CliRunner

from attngate.cli import app
from helpers import ROOT

BLOCK = re.compile(r"<!-- matrix: attngate (?P<cmd>[^>]*) -->\n(?P<body>.*?)\n<!-- /matrix -->", re.S)


def test_readme_support_matrices_are_generated_and_current(monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name paths relative to the repository root
    readme = (ROOT / "README.md").read_text()
    blocks = list(BLOCK.finditer(readme))
    assert len(blocks) >= 2
    for block in blocks:
        res = CliRunner().invoke(app, shlex.split(block["cmd"]))
        assert res.exit_code == 0, res.output
        assert res.stdout.rstrip("\n") == block["body"], f"README matrix is stale; regenerate it with: attngate {block['cmd']}"
