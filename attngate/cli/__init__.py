"""The ``attngate`` command line: explain, lint, matrix, schema, conform.

Exit codes: 0 resolved (warnings allowed); 1 the configuration is invalid (or lint found a
problem in rules that load); 2 bad usage, a bad rules file, bad server arguments or a bad model config; 3 lint or diff
could not decide a query (z3 answered unknown: not proved either way); 130 interrupted (SIGINT).

The shell's contract, for every command: a failed write (a full disk, a bad descriptor, a closed stdout) is one line on
stderr and exit 1, a closed pipe (``| head``) exit 1 quietly, as Python's BrokenPipeError recipe does; SIGINT is one line
``interrupted`` and 130; the width is COLUMNS or the terminal's held between 40 and 200 (attngate.util.text); text any
encoding cannot hold is written as backslash escapes, and an input's controls as escapes too (attngate.errors.visible).
"""

from __future__ import annotations

import copy
import errno
import io
import json
import os
import sys
from typing import Any

import typer

from attngate.cli import commands, conform  # noqa: F401  (each registers its commands on the app)
from attngate.cli.app import (
    EXIT_INTERRUPTED,
    INTERRUPTED,
    JSON_ERRORS,
    ClickException,
    app,
    error_document,
    fail,
    interrupted,
    usage_problem,
)
from attngate.errors import MAX_MESSAGE, Problem, ServerArgsError, clip, visible
from attngate.util.text import bound_columns, restore_columns

__all__ = ["app", "main"]

#: words a command line may have: an SGLang launch line has a few dozen; each word costs the parsers a look-up (click's
#: own did-you-mean among them), so 30,000 flags would take seconds where this refuses them at once
MAX_WORDS = 4096


def _wants_json(argv: list[str]) -> bool:
    own = argv[: argv.index("--")] if "--" in argv else argv  # a pasted launch line's own flags do not count
    return "--format=json" in own or any(a == "--format" and b == "json" for a, b in zip(own, own[1:]))


class _ClosedOutput(io.TextIOBase):
    """Standard output closed before the program started (``>&-``): every write fails as a bad descriptor, so that
    the command reports it instead of exiting 0 having written nothing."""

    encoding = "utf-8"

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "standard output is closed")


def _prepare_streams() -> list[tuple[Any, str | None]]:
    """Text no encoding of the streams can hold (a non-ASCII path under PYTHONIOENCODING=ascii, a lone surrogate)
    written as backslash escapes; a closed stdout replaced by one whose writes fail. Returns what to put back."""
    saved: list[tuple[Any, str | None]] = [(sys.stdout, None)]
    if sys.stdout is None:
        sys.stdout = _ClosedOutput()
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors != "backslashreplace":
            saved.append((stream, stream.errors))
            stream.reconfigure(errors="backslashreplace")
    return saved


def _restore_streams(saved: list[tuple[Any, str | None]]) -> None:
    sys.stdout = saved[0][0]
    for stream, errors in saved[1:]:
        try:
            stream.reconfigure(errors=errors)
        except (OSError, ValueError):  # closed meanwhile
            pass


def _settle(stream: Any) -> bool:
    """Flush ``stream``; where that fails, point its descriptor at /dev/null so that the interpreter's flush at exit
    cannot fail again (Python's recipe for BrokenPipeError). False when it failed."""
    try:
        if stream is not None:
            stream.flush()
        return True
    except (OSError, ValueError):
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # no descriptor of its own (a test's capture)
            pass
        return False


def _say(text: str) -> None:
    """One line on stderr, if stderr can still take it."""
    try:
        typer.echo(text, err=True)
    except (OSError, ValueError):
        _settle(sys.stderr)


def _write_failed(err: OSError) -> int:
    """A write to stdout or stderr failed (a full disk, a closed pipe, a bad descriptor): quiet for a closed pipe,
    else one line on stderr; exit status 1."""
    _settle(sys.stdout)
    _settle(sys.stderr)
    if not isinstance(err, BrokenPipeError):
        what = f"{err.filename}: " if err.filename else "cannot write the output: "
        _say(visible(clip(f"attngate: {what}{err.strerror or err}", MAX_MESSAGE)))
    return 1


def _named_command_only(argv: list[str]) -> Any:
    """``app`` holding only the command the line names first: typer builds every command it holds (parameters, type
    adapters) on each run, a few ms of a cold ``explain`` for the six it does not run. A line that names none exactly
    (options first, a typo, no words) gets the whole app: its help and did-you-mean are the whole app's."""
    named = [
        c
        for c in app.registered_commands
        if argv and c.callback is not None and (c.name or c.callback.__name__.lower().replace("_", "-")) == argv[0]
    ]
    if len(named) != 1 or app.registered_groups:
        return app
    only = copy.copy(app)  # the same callback (--version) and settings
    only.registered_commands = named
    return only


def _run(argv: list[str]) -> int:
    """Run the command; a usage error shown (as JSON under ``--format json``); its exit status."""
    if len(argv) > MAX_WORDS:
        where = Problem(
            "command line",
            f"{len(argv)} words; attngate reads at most {MAX_WORDS} (a launch line has dozens)",
            code="usage.too-many-words",
        )
        return fail(ServerArgsError(where)).exit_code
    try:
        return _named_command_only(argv)(args=argv, prog_name="attngate", standalone_mode=False) or 0
    except ClickException as err:
        if _wants_json(argv) and not type(err).__name__ == "NoArgsIsHelpError":
            typer.echo(json.dumps(error_document([usage_problem(err)], err.exit_code), indent=2, default=str))
        elif type(err).__name__ == "NoArgsIsHelpError":
            err.show()  # the help, attngate's own text
        else:  # the message quotes the command line: made visible, each line bounded
            shown = io.StringIO()
            err.show(file=shown)
            lines = shown.getvalue().splitlines()
            typer.echo("\n".join(visible(clip(line, MAX_MESSAGE)) for line in lines), err=True)
        return err.exit_code
    except typer.Abort:
        return 1


def main(argv: list[str] | None = None) -> None:
    """The ``attngate`` program: under ``--format json`` usage errors and bad input are JSON on stdout too (same exit
    codes); a write error, a closed pipe and SIGINT end any command as the module doc says."""
    argv = sys.argv[1:] if argv is None else argv
    tokens = (JSON_ERRORS.set(_wants_json(argv)), INTERRUPTED.set(False))
    columns, saved = os.environ.get("COLUMNS"), [(sys.stdout, None)]
    try:  # everything from here on, SIGINT included, ends as the module doc says
        columns = bound_columns()
        saved = _prepare_streams()
        code = _run(argv)
        if code == EXIT_INTERRUPTED:  # typer turns a KeyboardInterrupt in a command into Exit(130), silently
            interrupted()
        sys.stdout.flush()  # a write error shows here, not at the interpreter's exit
    except KeyboardInterrupt:  # Ctrl-C before a command runs (lint and diff turn their own into the same)
        code = interrupted().exit_code
    except OSError as err:  # BrokenPipeError among them
        code = _write_failed(err)
    finally:
        JSON_ERRORS.reset(tokens[0])  # main() called in-process (tests) must leave the next call's errors as text
        INTERRUPTED.reset(tokens[1])
        restore_columns(columns)
        _restore_streams(saved)
    sys.exit(code)
