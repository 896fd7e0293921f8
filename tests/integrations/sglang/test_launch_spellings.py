"""Generated launch lines read by attngate and by SGLang 0.5.23's own entry points (issue 53 item 10): a line of
attention flags (values SGLang takes, refuses or spells its own way: ``+16``, `` 16``, ``1_6``), switches and flags no
rule reads with values that look like launchers, written as tests/support/spellings.py writes it (a program, its
environment, flags permuted under their names or prefixes, ``--flag=value``), reads in attngate to the server arguments
SGLang's parser gives after its entry point (``python -m sglang.launch_server`` hands it the words after the module,
``sglang serve`` takes ``--model-type`` out and makes a first positional word ``--model-path``), or both refuse."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import time
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

pytest.importorskip("sglang.srt.server_args", reason="needs the sglang extra (SGLang 0.5.23)")

from attngate.errors import AttngateError  # noqa: E402
from attngate.facts.server_args import ServerArgs  # noqa: E402
from attngate.facts.sglang_names import RENAMED  # noqa: E402
from tests.support.spellings import ITEMS, MODELS, Spelled, spelled  # noqa: E402

BUDGET_S = 5.0


@cache
def _parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    SglangServerArgs.add_cli_args(parser)
    return parser


def sglang_argv(line: Spelled) -> list[str]:
    """The words SGLang's entry point hands its parser: those after the program, through sglang/cli/serve.py's own
    head handling for ``serve``."""
    from sglang.cli.serve import _extract_model_type_override, _normalize_positional_model_path

    args = list(line.args)
    if line.kind == "serve":
        return _normalize_positional_model_path(_extract_model_type_override(args)[1])[0]
    return args


def sglang_reads(argv: list[str]) -> Any:
    """attngate's ServerArgs from SGLang's parse of ``argv`` (before SGLang resolves it), or why SGLang refused."""
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            ns = vars(_parser().parse_args(argv))
    except (SystemExit, argparse.ArgumentError) as err:
        return f"refused: {err} {messages.getvalue()[-300:]}"
    ns["cuda_graph_config"] = getattr(ns.get("cuda_graph_config"), "to_dict", lambda: ns.get("cuda_graph_config"))()
    values = {
        n: RENAMED[n].read(ns) if n in RENAMED else ns[n] for n in ServerArgs.model_fields if n in ns or n in RENAMED
    }
    try:
        return ServerArgs.from_mapping(values).model_dump()
    except AttngateError as err:
        return f"refused: {err}"


def attngate_reads(words: list[str]) -> Any:
    try:
        return ServerArgs.from_flags(words).model_dump()
    except AttngateError as err:
        return f"refused: {err}"


LINES = st.tuples(ITEMS, st.sampled_from(MODELS)).flatmap(lambda line: spelled(*line))  # SGLang needs --model-path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LINES)
@example(  # found by this property: attngate refused the int() spellings argparse's type=int takes
    Spelled(
        (),
        (),
        "none",
        ("--chunked-prefill-size", "4_096", "--model-path", "org/model"),
        "--chunked-prefill-size 4_096 --model-path org/model",
    )
)
def test_generated_launch_lines_read_as_sglangs_entry_points_read_them(line):
    words = shlex.split(line.line)
    start = time.monotonic()
    ours = attngate_reads(words)
    assert time.monotonic() - start < BUDGET_S
    theirs = sglang_reads(sglang_argv(line))
    event(f"{line.kind}: {'refused' if isinstance(theirs, str) else 'read'}")
    if isinstance(ours, str) or isinstance(theirs, str):
        assert isinstance(ours, str) and isinstance(theirs, str), (line.line, ours, theirs)
    else:
        differ = {n: (ours[n], theirs[n]) for n in ours if ours[n] != theirs[n]}
        assert not differ, (line.line, differ)
