"""attngate's launch-line parser against SGLang 0.5.23's own: the shipped argument table is the one SGLang's parser
builds, and every launch line of docs/cli.md reads to the same value of every field the rules read."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest

pytest.importorskip("sglang.srt.server_args", reason="needs the sglang extra (SGLang 0.5.23)")

from attngate.facts.launch import strip_command  # noqa: E402
from attngate.facts.server_args import ServerArgs  # noqa: E402
from attngate.facts.sglang_names import RENAMED  # noqa: E402
from attngate.integrations.sglang.flag_table import dumps, sglang_flag_table  # noqa: E402
from tests.support.readme import ROOT, launch_lines  # noqa: E402

MODELS = ROOT / "examples" / "models"


def test_the_shipped_table_is_sglangs_parser():
    shipped = (ROOT / "attngate" / "facts" / "sglang_flags.json").read_text()
    assert shipped == dumps(sglang_flag_table()), (
        "SGLang's parser changed: python -m attngate.integrations.sglang.flag_table > attngate/facts/sglang_flags.json"
    )


def _sglang_reads(argv: list[str]) -> dict:
    """attngate's fields from SGLang's own parse (its parser, its --config merge), before SGLang resolves them."""
    from sglang.srt.server_args import ServerArgs as SglangServerArgs
    from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

    parser = argparse.ArgumentParser()
    SglangServerArgs.add_cli_args(parser)
    if "--config" in argv:
        argv = ConfigArgumentMerger(parser).merge_config_with_args(argv)
    ns = vars(parser.parse_args(argv))
    ns["cuda_graph_config"] = getattr(ns.get("cuda_graph_config"), "to_dict", lambda: ns.get("cuda_graph_config"))()
    return {
        n: RENAMED[n].read(ns) if n in RENAMED else ns[n] for n in ServerArgs.model_fields if n in ns or n in RENAMED
    }


@pytest.mark.parametrize("line", launch_lines())
def test_every_launch_line_reads_as_sglang_reads_it(line, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = strip_command(shlex.split(line.replace("MODEL", str(MODELS / "Llama-3.1-8B.json"))))
    ours = ServerArgs.from_flags(argv).model_dump()
    theirs = ServerArgs.from_mapping(_sglang_reads(argv)).model_dump()
    differ = {n: (ours[n], theirs[n]) for n in ServerArgs.model_fields if ours[n] != theirs[n]}
    assert not differ, json.dumps(differ, default=str)  # SGLang's parser defaults agree with attngate's as well
