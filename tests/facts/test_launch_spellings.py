"""Launch-line spellings as a hypothesis suite (issue 53 item 10): one line written every way a user writes it (the
program as ``python -m sglang.launch_server``, ``python3 -m``, ``sglang serve MODEL``, a path to ``launch_server.py``,
none; environment assignments and wrappers before it; flags in any order, under any of their names or an
unambiguous prefix, ``--flag value`` or ``--flag=value``; values that look like launchers; quoted words) reads to the
same server arguments as the line of SGLang's arguments alone (a metamorphic property), or to the same refusal, with
the project's own error and within a time bound. tests/integrations/sglang/test_launch_spellings.py holds the
generated lines against SGLang 0.5.23's own parser."""

from __future__ import annotations

import shlex
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from attngate.errors import AttngateError
from attngate.facts.launch import parse_launch_line
from attngate.facts.server_args import ServerArgs
from attngate.facts.sglang_names import RENAMED
from tests.support.spellings import ITEMS, MODELS, ODD, READ, SWITCHES, Item, Spelled, canonical, spelled

BUDGET_S = 5.0  # one example: every spelling read twice (the line, and ServerArgs)
FIELDS = ServerArgs.model_fields
ENV_NAMES = {"A", "SGLANG_FLASHINFER_USE_PAGED", "CUDA_VISIBLE_DEVICES", "X", "Y"}


def outcome(words: list[str]) -> tuple[Any, ...]:
    """What a line reads to: its values, model path and the flags no rule reads (the environment's names left out:
    they are written only in some spellings), and ServerArgs or the messages of its refusal."""
    line = parse_launch_line(words, FIELDS)
    try:
        args: Any = ServerArgs.from_flags(words).model_dump()
    except AttngateError as err:
        args = sorted(p.message for p in err.problems)
    not_read = set(line.not_read) - ENV_NAMES
    return line.values, line.model_path, not_read, sorted(p.message for p in line.problems), args


LINES = st.tuples(ITEMS, st.one_of(st.none(), st.sampled_from(MODELS))).flatmap(
    lambda line: st.tuples(st.just(line), st.lists(spelled(*line), min_size=1, max_size=3))
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(LINES)
@example(  # found by this property: a first word --flag=.../launch_server.py was taken for the program, the flag lost
    (
        ([Item("attention_backend", ("triton",))], "/models/sglang/launch_server.py"),
        [
            Spelled(
                (),
                (),
                "none",
                ("--model-path=/models/sglang/launch_server.py", "--attention-backend", "triton"),
                "--model-path=/models/sglang/launch_server.py --attention-backend triton",
            )
        ],
    )
)
def test_every_spelling_of_a_launch_line_reads_as_its_arguments_alone(case):
    (items, model), spellings = case
    start = time.monotonic()
    expected = outcome(canonical(items, model))
    values, model_path, _, problems, _ = expected
    odd = [item for item in items if item.dest in ODD and item.values[0] in ODD[item.dest]]
    assert odd or not problems, problems  # every other item is a value SGLang takes
    assert model_path == model
    for item in items:  # the flags the rules read under their own names hold the values given
        if item in odd:
            continue
        if item.dest in READ and item.dest in FIELDS and item.dest not in RENAMED:
            assert values[item.dest] == item.values[0], (item, values)
        elif item.dest in SWITCHES and item.dest in FIELDS and item.dest not in RENAMED:
            assert values[item.dest] is True, (item, values)
    for one in spellings:
        words = shlex.split(one.line)
        assert words == one.words  # the quoting is the shell's: the words come back
        got = outcome(words)
        event(f"{one.kind} program")
        assert got == expected, (one.line, got, expected)
        program = parse_launch_line(words, FIELDS).program
        assert (program is None) == (one.kind == "none") and (program or "").endswith(
            "serve" if one.kind == "serve" else ""
        ), (one.line, program)
    event("refused" if isinstance(expected[-1], list) else "read")
    assert time.monotonic() - start < BUDGET_S


@pytest.mark.parametrize(
    ("flag", "word", "value"),
    [
        ("--page-size", "1_6", 16),
        ("--page-size", "\uff11\uff16", 16),  # fullwidth digits
        ("--page-size", " +16", 16),
        ("--chunked-prefill-size", "4_096", 4096),
        ("--speculative-accept-threshold-single", ".5", 0.5),
        ("--page-size", "16.0", None),
        ("--page-size", "0x10", None),
    ],
)
def test_a_number_reads_as_sglangs_argparse_type_reads_it(flag, word, value):
    """Found by tests/integrations/sglang/test_launch_spellings.py: int() and float() take underscores, signs, spaces
    and any script's digits, so SGLang serves ``--page-size 1_6`` with 16 pages, where attngate refused it."""
    if value is None:
        with pytest.raises(AttngateError, match="takes an integer"):
            ServerArgs.from_flags([flag, word])
    else:
        field = flag[2:].replace("-", "_")
        assert getattr(ServerArgs.from_flags([flag, word]), field) == value
