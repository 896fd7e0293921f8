"""The typer app the commands register on, the exit codes and the options they share."""

from __future__ import annotations

import json
from contextvars import ContextVar
from enum import Enum
from typing import Any

import typer

from attngate.errors import Problem, bounded, listed, visible

#: click's base of usage errors, as the installed typer raises them (typer >= 0.20 vendors click as typer._click)
ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # docstrings are reflowed to the terminal's width (rich mode keeps their source line breaks, and reads
    # "attngate[gpu]" as markup)
    rich_markup_mode="markdown",
    help="Resolve, explain and lint attention-backend gates (SGLang-style servers).",
)

EXIT_INVALID_CONFIG = 1
EXIT_BAD_INPUT = 2
#: lint or diff: the solver could not decide some query (a timeout, an incomplete theory): not proved either way
EXIT_UNKNOWN = 3
#: stopped by SIGINT (Ctrl-C, a CI job's timeout): 128 + SIGINT, as a shell reports it
EXIT_INTERRUPTED = 130


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


class MatrixFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


#: set by attngate.cli.main when the command line asks for ``--format json``: errors go to stdout as JSON
JSON_ERRORS: ContextVar[bool] = ContextVar("attngate_json_errors", default=False)
#: whether this run printed ``interrupted`` already (a command's own handler, or main for typer's Exit(130))
INTERRUPTED: ContextVar[bool] = ContextVar("attngate_interrupted", default=False)


def fail(err: Exception, code: int = EXIT_BAD_INPUT) -> "typer.Exit":
    """Report a command's bad input (an AttngateError, every problem in it): on stderr as is, or as JSON on stdout
    under ``--format json``; returns the Exit to raise."""
    if JSON_ERRORS.get():
        problems = getattr(err, "problems", None) or [Problem(None, str(err), code="attngate.error")]
        typer.echo(json.dumps(error_document(problems, code), indent=2, default=str))
    else:
        typer.echo(visible(str(err)), err=True)  # an AttngateError's str is visible already; any other's may not be
    return typer.Exit(code)


def interrupted() -> "typer.Exit":
    """A command stopped by SIGINT (a KeyboardInterrupt, attngate.analysis.verdict.Interrupted among them): one
    line on stderr (once a run), no traceback; returns the Exit (130) to raise."""
    if not INTERRUPTED.get():
        INTERRUPTED.set(True)
        try:
            typer.echo("interrupted", err=True)
        except OSError:  # stderr gone too: the status says it
            pass
    return typer.Exit(EXIT_INTERRUPTED)


def error_document(problems: list[Problem], code: int) -> dict[str, Any]:
    """Bad input or a usage error as the JSON commands print under ``--format json``: ``plan`` null, ``errors`` (the
    first MAX_PROBLEMS, then one entry ``and N more problems``)."""
    from attngate.cli.report import VERSION

    shown, more = listed(problems)
    shown += [Problem(None, f"and {more} more problems", "more")] if more else []
    errors = [{"where": p.where, "message": p.message, "code": p.code, "help": p.help} for p in shown]
    return {"version": VERSION, "plan": None, "exit_code": code, "errors": errors}


def usage_problem(err: Any) -> Problem:
    """A click usage error (a bad option value, an unknown option) as a Problem naming the option."""
    hint = err.param_hint if isinstance(err, typer.BadParameter) else None
    where = hint if isinstance(hint, str) or hint is None else " / ".join(hint)
    return bounded(Problem(where, err.format_message(), "usage"))


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"attngate {version('attngate')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("attngate (not installed)")
        raise typer.Exit()


@app.callback()
def main_options(
    show_version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print attngate's version and exit"
    ),
) -> None:
    """Resolve, explain and lint attention-backend gates (SGLang-style servers)."""
