"""The backend registry: one entry per attention backend name, every table about backends derived from it.

An entry says who serves the backend's kernels (explain's summary), whether ``explain``, ``matrix`` and the
default's fallback evaluate it as a candidate (in registry order), and, for the backends attngate runs on GPU
kernels, the factory that builds one and the function that lists what it refuses. Like SGLang's
``attention_registry.py`` and vLLM's ``register_backend``, this is the one table; the others are views of it:

- :data:`CANDIDATE_BACKENDS`: the candidates, in order (``attngate.engine.explain``, ``attngate.engine.fallback``
  and the columns of ``attngate matrix``);
- :data:`KERNEL_BACKEND_NAMES`: the names attngate runs on GPU kernels (``attngate.backends.capabilities.REFUSALS``
  and ``attngate.backends.plan_backend.KERNEL_BACKENDS`` are keyed by them);
- :func:`kernel_provider`: who serves a backend's kernels where the plan does not say.

Torch-free: the factory and the refusal function are named by import path (strings), and
``attngate.backends.factories`` imports a factory only when a backend is built, so the CLI and the engine read this
table without torch or a kernel package.
"""

from __future__ import annotations

from dataclasses import dataclass

from attngate.errors import Problem, UsageError
from attngate.util.suggest import suggestion


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """One attention backend name (an SGLang ``--attention-backend`` value) and what attngate knows of it.

    Parameters
    ----------
    name : str
        The ``attention_backend`` value, e.g. ``"fa3"``.
    provider : str or None
        Who serves its kernels, as explain's summary names it; None: the plan's ``fa.provider`` gate names the
        package (fa3 and fa4 run either FlashAttention package).
    candidate : bool
        Whether explain, matrix and the default's fallback evaluate it (in registry order).
    factory : str or None
        ``"module:attribute"`` of the callable that builds attngate's backend for it, with the
        :class:`attngate.backends.factories.BackendFactory` signature; None: attngate runs it on no GPU kernel.
    refusals : str or None
        The name of its refusal function in ``attngate.backends.capabilities`` (``refusals(plan, layers,
        sm_major)``); set exactly where ``factory`` is.
    """

    name: str
    provider: str | None
    candidate: bool = False
    factory: str | None = None
    refusals: str | None = None

    def __post_init__(self) -> None:
        if (self.factory is None) != (self.refusals is None):
            raise ValueError(f"backend {self.name!r}: a factory and a refusal function go together")


_FA = "attngate.backends.flashattention:FlashAttentionBackend"
_FLASHINFER = "attngate.backends.flashinfer:flashinfer_backend"

#: Every backend name attngate knows something of; the candidates first, in the order they are tried.
BACKENDS: tuple[BackendEntry, ...] = (
    BackendEntry("fa3", None, candidate=True, factory=_FA, refusals="fa_refusals"),
    BackendEntry("fa4", None, candidate=True, factory=_FA, refusals="fa_refusals"),
    BackendEntry("flashinfer", "flashinfer", candidate=True, factory=_FLASHINFER, refusals="flashinfer_refusals"),
    BackendEntry("triton", "SGLang's triton kernels", candidate=True),
    BackendEntry("torch_native", "torch SDPA", candidate=True),
    BackendEntry("trtllm_mha", "flashinfer (trtllm-gen kernels)"),
    BackendEntry("trtllm_mla", "flashinfer (trtllm-gen kernels)"),
    BackendEntry("flashmla", "flash_mla"),
    BackendEntry("cutlass_mla", "sgl_kernel"),
)

_BY_NAME: dict[str, BackendEntry] = {entry.name: entry for entry in BACKENDS}

#: The backends attngate ships or plans (the candidates ``explain`` evaluates for rejection reasons), in order.
CANDIDATE_BACKENDS: tuple[str, ...] = tuple(entry.name for entry in BACKENDS if entry.candidate)

#: The backend names attngate runs on GPU kernels (each has a factory and a refusal function).
KERNEL_BACKEND_NAMES: tuple[str, ...] = tuple(entry.name for entry in BACKENDS if entry.factory is not None)

#: Who serves the kernels of a backend the registry does not name.
UNKNOWN_PROVIDER = "SGLang's own kernels"


def backend_entry(name: str) -> BackendEntry:
    """The registry entry of ``name``.

    Parameters
    ----------
    name : str
        An ``attention_backend`` value.

    Returns
    -------
    BackendEntry

    Raises
    ------
    UsageError
        ``name`` is not in the registry (the message names the ones that are, with a did-you-mean).
    """
    entry = _BY_NAME.get(name)
    if entry is None:
        raise UsageError(
            Problem(
                "backend",
                f"{name!r}: not a backend attngate knows; one of {', '.join(_BY_NAME)}",
                help=suggestion(name, _BY_NAME),
                code="usage.unknown-backend",
            )
        )
    return entry


def kernel_provider(name: str) -> str | None:
    """Who serves ``name``'s kernels where the plan does not say: the registry's provider, ``UNKNOWN_PROVIDER`` for a
    name it does not hold, None where the plan's ``fa.provider`` names the package (fa3, fa4)."""
    entry = _BY_NAME.get(name)
    return UNKNOWN_PROVIDER if entry is None else entry.provider
