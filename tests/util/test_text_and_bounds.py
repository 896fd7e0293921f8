"""What attngate shows of its inputs (issue 53, items 6 and 8): controls and bidi characters made visible, every
message bounded (100 problems, 200 characters of the input each); files read without following a swapped-in FIFO;
the rules cache keyed on the file's content."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from attngate.errors import (
    MAX_PROBLEMS,
    AttngateError,
    Problem,
    RulesError,
    ServerArgsError,
    clip,
    listed,
    visible,
)
from attngate.rules import load
from attngate.util.inputs import read_text
from attngate.util.text import MAX_COLUMNS, MIN_COLUMNS, bounded_width

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "text, shown",
    [
        ("\x1b]0;pwned\x07title", "\\x1b]0;pwned\\x07title"),
        ("right\u202eleft", "right\\u202eleft"),
        ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
        ("csi\x9b2J del\x7f nul\x00 cr\r tab\t", "csi\\x9b2J del\\x7f nul\\x00 cr\\x0d tab\\x09"),
        ("lone \ud800 \udcff", "lone \\ud800 \\udcff"),
        ("tag \U000e0041 line\u2028sep", "tag \\U000e0041 line\\u2028sep"),
        ("two\nlines", "two\nlines"),
        ("é 名 \U0001f600 [red]x[/red] \\x1b", "é 名 \U0001f600 [red]x[/red] \\x1b"),
    ],
)
def test_visible_escapes_what_a_terminal_would_act_on_and_keeps_the_rest(text, shown):
    assert visible(text) == shown


@given(st.text())
def test_visible_leaves_nothing_a_terminal_acts_on_and_is_idempotent(text):
    import unicodedata

    shown = visible(text)
    assert all(c == "\n" or unicodedata.category(c) not in {"Cc", "Cf", "Cs", "Zl", "Zp"} for c in shown)
    assert visible(shown) == shown
    shown.encode("utf-8")  # no lone surrogate is left to fail an encoder


def test_clip_keeps_both_ends_and_counts_the_middle():
    assert clip("short") == "short"
    path = "/" + "d" * 500 + "/config.json:3:7"
    shown = clip(path)
    assert shown.startswith("/ddd") and shown.endswith("config.json:3:7") and "(317 characters)" in shown
    assert len(shown) < 230


def test_an_error_lists_100_problems_then_counts_the_rest():
    err = ServerArgsError([Problem(f"--flag-{i}", "unknown") for i in range(250)])
    text = str(err)
    assert text.startswith("invalid server arguments (250 problems):")
    assert text.count("\n  - --flag-") == MAX_PROBLEMS and text.endswith("\n  - and 150 more problems")
    assert len(err.problems) == 250  # the error still holds every one


def test_a_loaders_own_count_of_the_rest_is_added_not_listed():
    problems = [Problem("$", f"p{i}") for i in range(100)] + [Problem("$", "and 99900 more problems")]
    assert listed(problems) == (problems[:100], 99900)
    assert str(AttngateError(problems)).endswith("  - and 99900 more problems")


def test_each_problem_quotes_at_most_200_characters_of_the_input():
    flag = "--" + "x" * 100_000
    value = "y" * 1_000_000
    err = ServerArgsError([Problem(flag, f"a switch takes no value, got {value!r}", help="h" * 5000)])
    (problem,) = err.problems
    assert len(problem.where) < 230 and "y" * 201 not in problem.message and len(problem.message) < 1100
    assert len(problem.help) < 1100 and len(str(err)) < 2500
    assert problem.message.startswith("a switch takes no value, got 'yyy")


def test_the_str_of_an_error_shows_the_inputs_controls_escaped_and_its_problems_keep_them():
    err = ServerArgsError(Problem("--\x1b]0;x\x07", "bad \u202e value"))
    assert "--\\x1b]0;x\\x07: bad \\u202e value" in str(err)
    assert err.problems[0].where == "--\x1b]0;x\x07"  # the data (JSON output) exact


def test_the_width_has_a_floor_and_a_ceiling():
    assert [bounded_width(w) for w in (0, 1, 80, 10**5)] == [MIN_COLUMNS, MIN_COLUMNS, 80, MAX_COLUMNS]


# --- files ----------------------------------------------------------------------------------------------------------


def _within(seconds: float, call):
    """``call()``'s outcome, failing if it takes longer than ``seconds`` (a blocked open)."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(_outcome(call)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert box, f"still blocked after {seconds} s"
    return box[0]


def _outcome(call):
    try:
        return call()
    except Exception as err:  # noqa: BLE001 - returned for the test to examine
        return err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    err = _within(5, lambda: read_text(fifo, ServerArgsError, "config.json"))
    assert isinstance(err, ServerArgsError) and "is not a regular file" in str(err)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_swapped_in_after_the_path_was_looked_at_is_refused_not_waited_on(tmp_path, monkeypatch):
    path = tmp_path / "rules.yaml"
    path.write_text("rules: []\n")
    real_stat = Path.stat
    swapped = []

    def stat(self: Path, **kwargs):  # the race: the path looked at, then replaced by a FIFO before it is opened
        found = real_stat(self, **kwargs)
        if self == path and not swapped:
            swapped.append(os.unlink(path) or os.mkfifo(path))
        return found

    monkeypatch.setattr(Path, "stat", stat)
    err = _within(5, lambda: read_text(path, RulesError, "rules file"))
    assert isinstance(err, RulesError) and "is not a regular file (a FIFO" in str(err)


def test_a_directory_and_a_missing_file_are_named(tmp_path):
    with pytest.raises(RulesError, match="is a directory"):
        read_text(tmp_path, RulesError, "rules file")
    with pytest.raises(RulesError, match="cannot read the rules file: No such file"):
        read_text(tmp_path / "none.yaml", RulesError, "rules file")
    with pytest.raises(RulesError, match="cannot read the rules file"):
        read_text(tmp_path / "bad\ud800.yaml", RulesError, "rules file")  # no encoding takes the name


def test_the_rules_cache_is_keyed_on_the_content_not_the_mtime(tmp_path):
    shipped = (ROOT / "rules.yaml").read_text()
    path = tmp_path / "rules.yaml"
    path.write_text(shipped)
    before = path.stat()
    first = load.load_rules(path)
    changed = shipped.replace(
        "summary: Prefill and decode backends", "summary: Changed, prefill and decode backends", 1
    )
    assert changed != shipped
    path.write_text(changed)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # rewritten within the same mtime
    second = load.load_rules(path)
    assert second is not first and second.rules[0].summary.startswith("Changed,")
    assert load.load_rules(path) is second  # unchanged content: the cached rules


def test_loading_the_shipped_rules_again_is_cheap():
    load.load_rules()
    start = time.perf_counter()
    for _ in range(20):
        load.load_rules()
    assert (time.perf_counter() - start) / 20 < 0.05
