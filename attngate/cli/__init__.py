"""The ``attngate`` command line: explain, lint, matrix, schema, conform.

Exit codes: 0 resolved (warnings allowed); 1 the configuration is invalid (or lint found a
problem in rules that load); 2 bad usage, a bad rules file, bad server arguments or a bad model config.
"""

from __future__ import annotations

from attngate.cli import commands, conform  # noqa: F401  (each registers its commands on the app)
from attngate.cli.app import app

__all__ = ["app", "main"]


def main() -> None:
    app(prog_name="attngate")
