"""The typer app the commands register on, the exit codes and the options they share."""

from __future__ import annotations

import json
from contextvars import ContextVar
from enum import Enum
from typing import Any

import typer

from attngate.errors import Problem

#: click's base of usage errors, as the installed typer raises them (typer >= 0.20 vendors click as typer._click)
ClickException: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Resolve, explain and lint attention-backend gates (SGLang-style servers).",
)

EXIT_INVALID_CONFIG = 1
EXIT_BAD_INPUT = 2


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


class MatrixFormat(str, Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


#: set by attngate.cli.main when the command line asks for ``--format json``: errors go to stdout as JSON
JSON_ERRORS: ContextVar[bool] = ContextVar("attngate_json_errors", default=False)


def fail(err: Exception, code: int = EXIT_BAD_INPUT) -> "typer.Exit":
    """Report a command's bad input (an AttngateError, every problem in it): on stderr as is, or as JSON on stdout
    under ``--format json``; returns the Exit to raise."""
    if JSON_ERRORS.get():
        from attngate.cli.report import VERSION

        problems = getattr(err, "problems", None) or [Problem(None, str(err))]
        errors = [{"where": p.where, "message": p.message, "code": p.code, "help": p.help} for p in problems]
        typer.echo(json.dumps({"version": VERSION, "plan": None, "exit_code": code, "errors": errors}, indent=2))
    else:
        typer.echo(str(err), err=True)
    return typer.Exit(code)


def error_json(err: Any) -> dict[str, Any]:
    """A usage error (click's) as the JSON commands print under ``--format json`` (``plan`` null, ``errors``)."""
    hint = err.param_hint if isinstance(err, typer.BadParameter) else None
    where = hint if isinstance(hint, str) or hint is None else " / ".join(hint)
    errors = [{"where": where, "message": err.format_message(), "code": "usage", "help": None}]
    return {"plan": None, "exit_code": err.exit_code, "errors": errors}


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
