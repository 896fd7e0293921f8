"""attngate's launch-line parser against SGLang 0.5.23's own: the shipped argument table is the one SGLang's parser
builds, every launch line of docs/cli.md reads to the same value of every field the rules read, and lines that probe
the entry points (a value that looks like a launcher, --config spellings, choices, sglang serve's head) are accepted or
refused as SGLang accepts or refuses them, with the same values."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shlex

import pytest

pytest.importorskip("sglang.srt.server_args", reason="needs the sglang extra (SGLang 0.5.23)")

from attngate.errors import ServerArgsError  # noqa: E402
from attngate.facts.launch import strip_command  # noqa: E402
from attngate.facts.server_args import ServerArgs  # noqa: E402
from attngate.facts.sglang_names import RENAMED  # noqa: E402
from attngate.integrations.sglang.flag_table import dumps  # noqa: E402
from attngate.integrations.sglang.tables import snapshot  # noqa: E402
from tests.support.readme import ROOT, launch_lines  # noqa: E402

MODELS = ROOT / "examples" / "models"


def test_the_shipped_table_is_sglangs_parser():
    shipped = (ROOT / "attngate" / "facts" / "sglang_flags.json").read_text()
    assert shipped == dumps(snapshot()["flags"]), (  # a fresh interpreter's parser: see tables.snapshot
        "SGLang's parser changed: python -m attngate.integrations.sglang.tables --write"
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


def _sglang_entry(words: list[str]) -> list[str]:
    """SGLang's own entry points: sglang/cli/serve.py's head handling for ``sglang serve``, Python's for ``-m``."""
    from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path

    if words[:2] == ["sglang", "serve"]:
        return _normalize_positional_model_path(_extract_model_type_override(words[2:])[1])[0]
    return words[words.index("sglang.launch_server") + 1 :] if "sglang.launch_server" in words else words


CONFIG = "attention-backend: flashinfer\ntp: 2\nchunked-prefill-size: 4096\n"
PROBES = [
    "--model-path MODEL --tp 2 --tokenizer-path x/launch_server.py --attention-backend triton",
    "--model-path MODEL --attention-backend triton --tokenizer-path /a/launch_server.py --tp 2",
    "FOO=/x/launch_server.py python -m sglang.launch_server --model-path MODEL --attention-backend triton --tp 2",
    "SGLANG_FLASHINFER_USE_PAGED=1 python3 -m sglang.launch_server --model-path MODEL --tp 2",
    "sglang serve MODEL --served-model-name sglang --attention-backend triton",
    "sglang serve --model-type llm MODEL --tp 2",
    "python -m sglang.launch_server --model-path MODEL --config CONFIG --attention-backend triton",
    "python -m sglang.launch_server --attention-backend triton --config CONFIG --model-path MODEL",
    "python -m sglang.launch_server --model-path MODEL --config=CONFIG --tp 4",
    "python -m sglang.launch_server --model-path MODEL --conf CONFIG --tp 4",
    "python -m sglang.launch_server --model-path MODEL --config CONFIG --config CONFIG",
    "python -m sglang.launch_server --model-path MODEL --config UNDERSCORED",
    "python -m sglang.launch_server --model-path MODEL --attention-backend qsa --kv-cache-dtype mxfp8",
    "python -m sglang.launch_server --model-path MODEL --decode-attention-backend llada2_cfg_flashinfer",
    "python -m sglang.launch_server --model-path MODEL --attention-backend cutlass_mla",
    "python -m sglang.launch_server --model-path MODEL --kv-cache-dtype fp4_e2m1",
    "python -m sglang.launch_server --model-path MODEL --sampling-backend intel_xpu --log-requests-level 3",
    "python -m sglang.launch_server --model-path MODEL --log-requests-level 4",
]


@pytest.mark.parametrize("line", PROBES)
def test_entry_points_config_and_choices_read_as_sglang_reads_them(line, tmp_path):
    (tmp_path / "c.yaml").write_text(CONFIG)
    (tmp_path / "u.yaml").write_text("attention_backend: flashinfer\n")
    line = line.replace("UNDERSCORED", str(tmp_path / "u.yaml")).replace("CONFIG", str(tmp_path / "c.yaml"))
    words = shlex.split(line.replace("MODEL", str(MODELS / "Llama-3.1-8B.json")))
    try:
        ours = ServerArgs.from_flags(words).model_dump()
    except ServerArgsError as err:
        ours = f"refused: {err}"
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            theirs = ServerArgs.from_mapping(_sglang_reads(_sglang_entry(words))).model_dump()
    except (SystemExit, ValueError, argparse.ArgumentError) as err:
        theirs = f"refused: {err}"
    if isinstance(ours, str) or isinstance(theirs, str):
        assert isinstance(ours, str) and isinstance(theirs, str), (ours, theirs)
    else:
        assert ours == theirs
    assert strip_command(words) == _sglang_entry(words) or words[0] == "sglang"  # serve: compared through values
