"""Building attngate's backends by name, from the backend registry (:mod:`attngate.plan.backends`).

Every backend is built by a factory of one signature, :class:`BackendFactory`: the backend classes themselves
(``FlashAttentionBackend``, ``ReferenceBackend``, ``PlanBackend``, ...) and ``flashinfer_backend``, which picks the
MLA class for MLA layers. A caller never asks which keywords a backend takes: every factory takes ``checked`` and
``q_dtype`` (a backend that has no use for one ignores it). A factory's module is imported when it is first asked
for, so importing this module imports no kernel package.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from attngate.backends.capabilities import no_kernel_backend
from attngate.errors import BackendRefusal
from attngate.plan.backends import backend_entry

if TYPE_CHECKING:
    import torch

    from attngate.backends.base import AttentionBackend
    from attngate.backends.runtime.layer import AttentionLayer
    from attngate.plan.schema import Plan


class BackendFactory(Protocol):
    """What builds a backend: the parameters of :class:`attngate.backends.base.AttentionBackend`, plus ``checked``
    (validate every batch before a kernel launch) and ``q_dtype`` (the queries' dtype, the model's; needed by a
    FlashInfer backend over an FP8 pool). Raises what the backend raises (BackendRefusal, BatchMetadataError,
    UsageError)."""

    def __call__(
        self,
        plan: Plan,
        kv_pool: object,
        req_to_token: torch.Tensor,
        layers: list[AttentionLayer],
        device: torch.device | str = ...,
        *,
        checked: bool = False,
        q_dtype: torch.dtype | None = None,
    ) -> AttentionBackend: ...


def backend_factory(name: str) -> BackendFactory:
    """The factory of the backend attngate runs for ``attention_backend`` ``name`` (fa3 and fa4 share one).

    Parameters
    ----------
    name : str
        An ``attention_backend`` value the registry holds with a factory (:data:`KERNEL_BACKEND_NAMES`).

    Returns
    -------
    BackendFactory
        The registered callable, its module imported on first use.

    Raises
    ------
    UsageError
        ``name`` is not in the registry.
    BackendRefusal
        The registry holds ``name`` but attngate runs it on no GPU kernel (triton, torch_native, ...).
    """
    path = backend_entry(name).factory
    if path is None:
        raise BackendRefusal(no_kernel_backend(name, hint=True))
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def create_backend(
    name: str,
    plan: Plan,
    kv_pool: object,
    req_to_token: torch.Tensor,
    layers: list[AttentionLayer],
    device: torch.device | str = "cuda",
    *,
    checked: bool = False,
    q_dtype: torch.dtype | None = None,
) -> AttentionBackend:
    """Build attngate's backend for ``attention_backend`` ``name`` (for both of a plan's sides at once, per forward
    mode: :class:`attngate.backends.plan_backend.PlanBackend`).

    Parameters
    ----------
    name : str
        ``"fa3"``, ``"fa4"`` or ``"flashinfer"`` (:data:`KERNEL_BACKEND_NAMES`).
    plan, kv_pool, req_to_token, layers, device, checked, q_dtype
        As :class:`BackendFactory` takes them.

    Returns
    -------
    AttentionBackend

    Raises
    ------
    UsageError
        ``name`` is not in the registry.
    BackendRefusal
        attngate runs ``name`` on no GPU kernel, or the backend refuses the plan or the layers.
    BatchMetadataError
        As the backend raises it (heads, pool dtype or page size not the plan's).
    """
    factory = backend_factory(name)
    return factory(plan, kv_pool, req_to_token, layers, device, checked=checked, q_dtype=q_dtype)
