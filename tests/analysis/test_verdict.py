"""Three-valued analysis (attngate.analysis.verdict, issue 53): a query z3 cannot decide is reported as unknown,
naming what it asked, and never read as unsat (no dead rule, no "0 finding(s)"); lint and diff exit 3 on it. A
SIGINT or a KeyboardInterrupt stops them with exit 130, one line on stderr and no traceback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

import pytest
import z3

from attngate.analysis.diff import diff_rules
from attngate.analysis.encoding import Finding
from attngate.analysis.lint import lint_rules
from attngate.analysis.verdict import SAT, UNSAT, Interrupted, Unknown, Verdict, check, interruptible
from attngate.cli import main
from attngate.rules.load import parse_rules
from tests.support.helpers import ROOT

RULES = """version: 1
rules:
  - {id: a, summary: s, why: w, source: s, when: use_mla, set: {fa.num_splits: 1}}
  - {id: b, summary: s, why: w, source: s, when: is_embedding, set: {fa.num_splits: 2}}
  - {id: dead, summary: s, why: w, source: s, when: use_mla and not use_mla, set: {fa.num_splits: 1}}
invariants:
  - id: inv
    summary: s
    assert: not (use_mla and fa.skip_kv_cache)
    source: s
"""


def _fermat(timeout_ms: int) -> z3.Solver:
    """A query z3 does not decide in seconds (cubes: Fermat's last theorem for n = 3)."""
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    x, y, z = z3.Ints("x y z")
    solver.add(x > 2, y > 2, z > 2, x * x * x + y * y * y == z * z * z)
    return solver


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out = capsys.readouterr()
    return exit_.value.code, out.out, out.err


@pytest.fixture
def rules_file(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(RULES)
    return path


@pytest.fixture
def undecided(monkeypatch):
    """Every check z3 makes answers unknown (as a timeout or an incomplete theory would)."""
    for cls in (z3.Solver, z3.Optimize):
        monkeypatch.setattr(cls, "check", lambda self, *assumptions: z3.unknown)
        monkeypatch.setattr(cls, "reason_unknown", lambda self: "timeout")


def test_a_verdict_is_three_valued_and_has_no_truth_value():
    x = z3.Int("x")
    assert check(z3.Solver(), x > 1) == SAT and check(z3.Solver(), x > 1, x < 0) == UNSAT
    verdict = check(_fermat(50))
    assert verdict.unknown and verdict.reason == "timeout"
    with pytest.raises(TypeError):
        bool(verdict)
    with pytest.raises(ValueError):
        Verdict("maybe")


def test_lint_reports_what_z3_cannot_decide_never_a_dead_rule_or_no_finding(undecided, rules_file, capsys):
    results = lint_rules(parse_rules(RULES, "r.yaml"))
    assert results and all(isinstance(r, Unknown) and r.reason == "timeout" for r in results), results
    assert not [r for r in results if isinstance(r, Finding)]
    asked = " | ".join(r.query for r in results)
    for query in ("can rule 'dead' match", "disagree on gate fa.num_splits", "does invariant 'inv' hold"):
        assert query in asked, asked

    code, out, err = run(["lint", str(rules_file)], capsys)
    assert code == 3, (out, err)
    assert "can never" not in out and "0 finding(s)" not in out
    assert f"{rules_file}:5:5: unknown: can rule 'dead' match? z3 could not decide it (timeout)" in out
    assert out.splitlines()[-1].endswith(f"1 invariants, {len(results)} unknown (not proved either way)")

    code, out, _ = run(["lint", str(rules_file), "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 3 and report["findings"] == [] and len(report["unknown"]) == len(results)
    assert {tuple(u) for u in report["unknown"]} == {("where", "code", "message", "help")}
    assert {u["code"] for u in report["unknown"]} == {"lint.unknown"}


def test_without_a_timeout_the_same_file_has_its_findings(rules_file, capsys):
    code, out, _ = run(["lint", str(rules_file)], capsys)
    assert code == 1 and "rule 'dead' can never match" in out and "unknown" not in out
    code, out, _ = run(["lint", str(rules_file), "--format", "json"], capsys)
    findings = json.loads(out)["findings"]  # each a structured object, its kind in its code
    assert code == 1 and {tuple(f) for f in findings} == {("where", "code", "message", "help")}
    dead = [f for f in findings if f["code"] == "lint.dead-rule"]
    assert [f["message"] for f in dead] == ["rule 'dead' can never match"] and dead[0]["where"].startswith(
        str(rules_file)
    )


def test_diff_reports_what_z3_cannot_decide_never_no_difference(undecided, rules_file, capsys):
    rules = parse_rules(RULES, "r.yaml")
    differences = diff_rules(rules, rules)
    assert differences and {d.kind for d in differences} == {"unknown"}
    assert {"acceptance", "gate fa.num_splits"} <= {d.name for d in differences}

    code, out, _ = run(["diff", str(rules_file), str(rules_file)], capsys)
    assert code == 3 and "0 difference(s)" not in out
    assert "unknown: do OLD and NEW differ on gate fa.num_splits? z3 could not decide it (timeout)" in out


@pytest.mark.parametrize("command", ["lint", "diff"])
def test_a_keyboard_interrupt_between_checks_exits_130_without_a_traceback(command, rules_file, monkeypatch, capsys):
    calls = []
    real = z3.Solver.check

    def interrupted_at_the_fifth(self, *assumptions):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real(self, *assumptions)

    monkeypatch.setattr(z3.Solver, "check", interrupted_at_the_fifth)
    argv = [command, str(rules_file)] + ([str(rules_file)] if command == "diff" else [])
    code, out, err = run(argv, capsys)
    assert code == 130 and err == "interrupted\n" and "finding" not in out and "difference" not in out


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals go to the main thread")
@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
    reason="SIGINT is ignored in this process (a background job's), which interruptible() leaves as it is",
)
def test_a_sigint_between_checks_stops_the_next_check():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted):
        with interruptible():
            signal.raise_signal(signal.SIGINT)  # handled here: the flag is set, nothing raised yet
            check(z3.Solver(), z3.Int("x") > 1)
    with pytest.raises(Interrupted):  # one after the last check still ends the analysis as interrupted
        with interruptible():
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before
    solver = z3.Solver()  # and z3 answers again after it: nothing of the interrupt is left behind
    solver.push()
    assert check(solver, z3.Int("x") > 1) == SAT


SIGINT_DURING_A_CHECK = """
import os, signal, threading, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as an interactive shell leaves it
from attngate.analysis.verdict import Interrupted, check, interruptible
from tests.analysis.test_verdict import _fermat

def stopped(guarded, timeout_ms):
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    start = time.monotonic()
    try:
        if guarded:
            with interruptible():
                check(_fermat(timeout_ms))
        else:
            check(_fermat(timeout_ms))
    except Interrupted:
        return "Interrupted", time.monotonic() - start
    except KeyboardInterrupt:
        return "KeyboardInterrupt", time.monotonic() - start
    return "answered", time.monotonic() - start

(guarded, t1), (unguarded, t2) = stopped(True, 20_000), stopped(False, 1_000)
print(guarded, t1 < 5, unguarded, t2 < 5)
"""


def test_a_sigint_during_a_check_is_never_an_answer():
    """z3 would swallow SIGINT in a check and answer unknown: under interruptible() the watcher interrupts the check
    at once and it raises Interrupted; outside it Python's KeyboardInterrupt comes once the check returns (in a
    subprocess: the signal is real)."""
    done = subprocess.run(
        [sys.executable, "-c", SIGINT_DURING_A_CHECK], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["Interrupted", "True", "KeyboardInterrupt", "True"], (done.stdout, done.stderr)
