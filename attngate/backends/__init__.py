"""The attention backends and the runtime they run over; every backend is built from a Plan and reads no server
argument.

Public API (``from attngate.backends import ...``; each name is imported on first use, so that torch-free code
may import :mod:`attngate.backends.capabilities` without torch):

Building backends
    :class:`AttentionBackend` (the base every backend implements: its parameters and call order),
    :class:`PlanBackend` (what a server builds: the plan's prefill and decode backends, each forward mode on its own),
    :func:`create_backend` and :func:`backend_factory` (attngate's backend for an ``attention_backend`` name, from the
    backend registry :mod:`attngate.plan.backends`), :class:`BackendFactory` (the one signature every backend is
    built with), :class:`ReferenceBackend` (plain PyTorch, CPU or GPU: the specification and the oracle),
    :func:`refusals` (why a backend cannot serve a plan's layers; torch-free).
The runtime
    :class:`MHATokenToKVPool`, :class:`MLATokenToKVPool`, :func:`kv_pool_for`, :func:`kv_storage_dtype`,
    :class:`ReqToTokenPool`, :class:`PageAllocator`, :class:`ForwardBatch`, :class:`BatchLengths`,
    :class:`AttentionLayer`, :func:`layers_from_model`, :func:`build_batch`, :func:`check_batch`.

The kernel backends' own modules (``flashattention``, ``flashinfer``, ``flashinfer_mla``) and the helpers beside them
are internal: build them by name.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module that defines it.
_MODULES: dict[str, str] = {
    "AttentionBackend": "base",
    "BackendFactory": "factories",
    "backend_factory": "factories",
    "create_backend": "factories",
    "PlanBackend": "plan_backend",
    "ReferenceBackend": "reference",
    "refusals": "capabilities",
    "check_batch": "checks",
    "kv_storage_dtype": "checks",
    "MHATokenToKVPool": "runtime.kv_cache",
    "MLATokenToKVPool": "runtime.kv_cache",
    "PageAllocator": "runtime.kv_cache",
    "ReqToTokenPool": "runtime.kv_cache",
    "kv_pool_for": "runtime.kv_cache",
    "ForwardBatch": "runtime.forward_batch",
    "BatchLengths": "runtime.batch_metadata",
    "AttentionLayer": "runtime.layer",
    "layers_from_model": "runtime.layer",
    "build_batch": "runtime.batch_builder",
}

__all__ = list(_MODULES)


def __getattr__(name: str) -> Any:
    """The public name ``name``, its module imported on first use (PEP 562).

    Raises
    ------
    AttributeError
        ``name`` is not public (a submodule of this package is imported by the import system instead).
    """
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
