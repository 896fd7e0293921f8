"""The typer app the commands register on, the exit codes and the options they share."""

from __future__ import annotations

from enum import Enum

import typer

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


def fail(err: Exception, code: int = EXIT_BAD_INPUT) -> "typer.Exit":
    typer.echo(str(err), err=True)
    return typer.Exit(code)
