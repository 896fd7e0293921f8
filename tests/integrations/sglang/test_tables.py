"""attngate's tables of SGLang's front door against the installed SGLang 0.5.23 (attngate.integrations.sglang.tables):
the flag table with its choices and --config handling, the environment variables SGLang reads, and the choice lists of
attngate/facts/choices.py. Fails when they drift: python -m attngate.integrations.sglang.tables --write."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

pytest.importorskip("sglang.srt.server_args", reason="needs the sglang extra (SGLang 0.5.23)")

from attngate.errors import ServerArgsError  # noqa: E402
from attngate.facts import choices  # noqa: E402
from attngate.facts.server_args import ServerArgs  # noqa: E402
from attngate.integrations.sglang import tables  # noqa: E402


@pytest.fixture(scope="module")
def snapshot():
    return tables.snapshot()


def test_every_table_is_the_installed_sglangs(snapshot):
    assert tables.check(snapshot) == []


def _sglang_accepts(argv: list[str]) -> bool:
    from sglang.srt.server_args import ServerArgs as SglangServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    SglangServerArgs.add_cli_args(parser)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parser.parse_args(["--model-path", "m", *argv])
    except (argparse.ArgumentError, SystemExit):
        return False
    return True


def _attngate_accepts(argv: list[str]) -> bool:
    try:
        ServerArgs.from_flags(argv)
    except ServerArgsError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(tables.SOURCES))
def test_each_choice_is_accepted_as_sglang_accepts_it(name, snapshot):
    """Every value of SGLang's list and of attngate's Literal, on the flag of each field it types: attngate accepts it
    exactly when SGLang's parser does, except the values attngate declares it does not model."""
    fields, _ = tables.SOURCES[name]
    lists = snapshot["lists"]
    values = set(lists[name]) | set(getattr(choices, name).__args__) | {"not-a-choice"}
    for field in fields:
        unmodelled = choices.NOT_MODELLED.get(field, ())
        for value in sorted(values):
            argv = ["--" + field.replace("_", "-"), value]
            ours = _attngate_accepts(argv)
            if value in unmodelled:
                assert not ours and _sglang_accepts(argv), argv
            elif tables.SOURCES[name][1].startswith("--"):  # the parser itself decides: the same answer
                assert ours == _sglang_accepts(argv), argv
            else:  # SGLang checks it after parsing: attngate accepts exactly its list
                assert ours == (value in lists[name]), argv
