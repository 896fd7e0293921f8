"""Triton kernels as an optional speed-up: a launcher is imported on first use, and is None where Triton is not
installed (the CPU suite, a host without it), so its caller runs torch ops instead."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any


@functools.cache
def triton_launcher(module: str, name: str) -> Callable[..., Any] | None:
    """``module.name`` (a launcher in a module that imports Triton), or None where that import fails for want of
    Triton. Kept per process."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None
