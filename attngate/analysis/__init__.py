"""z3 over a rule set: one encoding (encoding.py), lint, the invariant proofs (prove), diff. Needs the ``analysis``
extra (z3-solver); resolve(), explain and a server's start-up never import this package."""

from __future__ import annotations

import importlib.util

from attngate.errors import Problem, UsageError

INSTALL = "pip install 'attngate[analysis]'"


def require_z3() -> None:
    """UsageError naming the extra to install where z3-solver is missing (lint, diff and prove need it)."""
    if importlib.util.find_spec("z3") is None:
        raise UsageError(
            Problem(
                "z3",
                "rule analysis (attngate lint, diff, prove) needs z3-solver, which is not installed",
                help=INSTALL,
                code="usage.z3-missing",
            )
        )
