"""The ``attngate`` command line: explain, lint, matrix, schema, conform.

Exit codes: 0 resolved (warnings allowed); 1 the configuration is invalid (or lint found a
problem in rules that load); 2 bad usage, a bad rules file, bad server arguments or a bad model config; 3 lint or diff
could not decide a query (z3 answered unknown: not proved either way); 130 interrupted (SIGINT).
"""

from __future__ import annotations

import json
import os
import sys

import typer

from attngate.cli import commands, conform  # noqa: F401  (each registers its commands on the app)
from attngate.cli.app import JSON_ERRORS, ClickException, app, error_document, interrupted, usage_problem

__all__ = ["app", "main"]


def _wants_json(argv: list[str]) -> bool:
    own = argv[: argv.index("--")] if "--" in argv else argv  # a pasted launch line's own flags do not count
    return "--format=json" in own or any(a == "--format" and b == "json" for a, b in zip(own, own[1:]))


def main(argv: list[str] | None = None) -> None:
    """The ``attngate`` program: under ``--format json`` usage errors and bad input are JSON on stdout too (same exit
    codes); a closed pipe (``attngate flags | head``) ends it quietly."""
    argv = sys.argv[1:] if argv is None else argv
    token = JSON_ERRORS.set(_wants_json(argv))
    try:
        code = app(args=argv, prog_name="attngate", standalone_mode=False)
    except ClickException as err:
        if _wants_json(argv) and not type(err).__name__ == "NoArgsIsHelpError":
            typer.echo(json.dumps(error_document([usage_problem(err)], err.exit_code), indent=2, default=str))
        else:
            err.show()
        code = err.exit_code
    except typer.Abort:
        code = 1
    except KeyboardInterrupt:  # Ctrl-C before a command runs (lint and diff turn their own into the same)
        code = interrupted().exit_code
    except BrokenPipeError:
        # the reader went away: send what is left in the buffers nowhere, so that the flush at exit cannot fail
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 1
    finally:
        JSON_ERRORS.reset(token)  # main() called in-process (tests) must leave the next call's errors as text
    sys.exit(code or 0)
