"""A solver's answer is three-valued: sat, unsat or unknown. Every solver check of the analysis goes through
:func:`check`, so that an unknown (a timeout, an incomplete theory) is never read as unsat, and an interrupted
check stops the analysis (:class:`Interrupted`) instead of passing for an answer.

z3 would catch SIGINT itself during a check and answer unknown (its reason "canceled" under a push, as a resource
limit's): :func:`check` turns that off, so a SIGINT is never swallowed. Under :func:`interruptible` (lint, diff
and the invariant proofs run in it) a handler notes the SIGINT and a watcher thread, woken through
``signal.set_wakeup_fd`` even while z3 holds the main thread, interrupts the running check; the check then raises
:class:`Interrupted`. Outside it (another thread, say) Python's KeyboardInterrupt comes once the check returns.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import z3

_ANSWERS = ("sat", "unsat", "unknown")


@dataclass(frozen=True, slots=True)
class Verdict:
    """One query's answer: ``answer`` "sat", "unsat" or "unknown", ``reason`` z3's reason for an unknown (timeout,
    canceled, incomplete ...). It has no truth value (``bool()`` raises TypeError): ask :attr:`sat`, :attr:`unsat`
    or :attr:`unknown`, so that no caller reads unknown as either."""

    answer: str
    reason: str = ""

    def __post_init__(self) -> None:
        if self.answer not in _ANSWERS:
            raise ValueError(f"a verdict is one of {', '.join(_ANSWERS)}, not {self.answer!r}")

    @property
    def sat(self) -> bool:
        return self.answer == "sat"

    @property
    def unsat(self) -> bool:
        return self.answer == "unsat"

    @property
    def unknown(self) -> bool:
        return self.answer == "unknown"

    def __bool__(self) -> bool:
        raise TypeError("a verdict is sat, unsat or unknown: ask .sat, .unsat or .unknown")


SAT = Verdict("sat")
UNSAT = Verdict("unsat")


@dataclass(frozen=True, slots=True)
class Unknown:
    """A query of the analysis that the solver answered unknown: ``where`` (the rule file location of what it
    checked), ``query`` (what it asked, naming the rules, predicate, gate or invariant) and z3's ``reason``.
    Neither proved nor refuted; lint lists it beside its findings (``where`` and ``message`` as a Finding has)."""

    where: str
    query: str
    reason: str
    #: the kind of every Unknown, as a Finding's ``code`` names its kind
    code = "lint.unknown"
    help = None

    @property
    def message(self) -> str:
        return f"unknown: {self.query}? z3 could not decide it ({self.reason}); not proved either way"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class Interrupted(KeyboardInterrupt):
    """The analysis was stopped by SIGINT (Ctrl-C, or a CI job's timeout): a KeyboardInterrupt, so that whoever
    handles Ctrl-C handles it (``attngate lint`` and ``diff`` exit 130)."""

    def __init__(self) -> None:
        super().__init__("interrupted")


_sigint = threading.Event()  # a SIGINT came while interruptible() was active
_lock = threading.Lock()  # orders _checking against _sigint: a check starts only where no SIGINT came
#: the context of the z3 check that runs, None between checks (z3 may be interrupted only then: interrupted idle, its
#: next push fails)
_checking: z3.Context | None = None
_guarded = False  # interruptible() is active


def check(solver: z3.Solver | z3.Optimize, *terms: Any, assume: tuple[Any, ...] = ()) -> Verdict:
    """The verdict of the solver's assertions (with ``terms``, added in a scope of their own and taken back, and under
    the literals ``assume``, z3's assumptions: no scope at all). Raises :class:`Interrupted` where a SIGINT came before
    or during the check."""
    global _checking
    solver.set("ctrl_c", False)  # z3's own SIGINT handler would answer unknown for it
    if terms:
        solver.push()
        solver.add(*terms)
    try:
        with _lock:
            if _sigint.is_set():
                raise Interrupted()
            _checking = solver.ctx
        try:
            answer = solver.check(*assume)
        finally:
            with _lock:
                _checking = None
        reason = solver.reason_unknown() if answer == z3.unknown else ""
    finally:
        if terms:
            solver.pop()
    if _sigint.is_set():
        raise Interrupted()
    if answer == z3.sat:
        return SAT
    return UNSAT if answer == z3.unsat else Verdict("unknown", reason or "unknown")


@contextmanager
def interruptible() -> Iterator[None]:
    """For its duration a SIGINT interrupts the running z3 check and the next :func:`check` (or the end of the
    block) raises :class:`Interrupted`. Nested, outside the main thread (where no signal handler can be installed)
    or where SIGINT is ignored (a background job's), it leaves the handling as it is. Raises :class:`Interrupted`
    at its end where a SIGINT came, and in place of the z3 error an interrupted z3 may raise (a push cancelled)."""
    global _guarded
    previous = signal.getsignal(signal.SIGINT)
    if _guarded or previous in (None, signal.SIG_IGN) or threading.current_thread() is not threading.main_thread():
        yield
        return
    _sigint.clear()
    read, write = os.pipe()
    os.set_blocking(write, False)
    watcher = threading.Thread(target=_watch, args=(read,), name="attngate-sigint", daemon=True)
    watcher.start()
    signal.signal(signal.SIGINT, _on_sigint)
    previous_fd = signal.set_wakeup_fd(write)
    _guarded = True
    try:
        yield
    except z3.Z3Exception:
        if _sigint.is_set():
            raise Interrupted() from None
        raise
    finally:
        _guarded = False
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous)
        os.close(write)  # the watcher reads the end of the pipe and returns
        watcher.join()
        os.close(read)
        interrupted = _sigint.is_set()
        _sigint.clear()  # a check after this block is not interrupted by what stopped it
        if interrupted:
            z3.Solver().check()  # a check clears what an interrupt left in z3's context (its next push would fail)
    if interrupted:
        raise Interrupted()


def _on_sigint(signum: int, frame: Any) -> None:
    """In place of Python's KeyboardInterrupt, raised anywhere: the next check raises Interrupted."""
    _sigint.set()


def _watch(read: int) -> None:
    """At a SIGINT, interrupt z3 for as long as a check runs: the main thread may be inside one, where Python runs
    no signal handler (it runs them between the main thread's bytecodes), and an interrupt that comes just before
    z3 starts is lost."""
    while data := os.read(read, 64):
        if signal.SIGINT in data:
            with _lock:
                _sigint.set()
            while True:
                with _lock:
                    if _checking is None:
                        break
                    _checking.interrupt()
                time.sleep(0.05)
