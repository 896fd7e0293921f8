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
