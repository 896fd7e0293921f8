"""The SGLang launch lines of docs/cli.md, each on every example model named by a hub id (served from a test hub cache):
exit 0 or a refusal (1), never a usage error for a flag SGLang accepts, and one screen of at most 60 lines."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from attngate.cli import app
from tests.support.helpers import MODELS, ROOT, cache_hub_config
from tests.support.readme import launch_lines

LINES = launch_lines()


def test_the_docs_give_at_least_ten_launch_lines():
    assert len(LINES) >= 10 and all(line.split()[0] in ("python", "sglang") for line in LINES)


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """Every example config as the hub id ``examples/<stem>`` in a hub cache (huggingface_hub's layout), offline."""
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("hub")
    for config in MODELS.glob("*.json"):
        cache_hub_config(root, f"examples/{config.stem}", config.read_text())
    saved = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = str(root), True
    yield root
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = saved


@pytest.mark.parametrize("config", sorted(MODELS.glob("*.json")), ids=lambda p: p.stem)
def test_every_launch_line_explains_on_every_example_model(config, hub_cache, monkeypatch):
    monkeypatch.chdir(ROOT)  # --config examples/server.yaml is relative to the repository, as in docs/cli.md
    runner = CliRunner(env={"COLUMNS": "80"})
    for line in LINES:
        argv = shlex.split(line.replace("MODEL", f"examples/{config.stem}"))
        res = runner.invoke(app, ["explain", "--gpu", "H100", "--format", "json", "--", *argv])
        assert res.exit_code in (0, 1), f"{line}: {res.output}"
        report = json.loads(res.stdout)
        assert report["model_summary"] is None or report["model_summary"].split(";")[0] in config.read_text()
        screen = runner.invoke(app, ["explain", "--gpu", "H100", "--", *argv])
        assert screen.exit_code == res.exit_code and len(screen.output.splitlines()) <= 60, f"{line}\n{screen.output}"
