"""``Platform``: the GPU architecture the plan is resolved for, and the kernel packages installed there.

The installed kernel providers are explicit facts, never probed behind the caller's back: a plan
resolved with ``--gpu sm90`` on a laptop equals the one resolved on the server with the same
facts. ``Platform.detect()`` is the one place that looks at the local machine.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from typing import get_args

from pydantic import BaseModel, ConfigDict, ValidationError

from attngate.errors import PlatformError, Problem, check_arguments
from attngate.facts.choices import GPU_ARCHS, KERNEL_PROVIDERS, GpuArch
from attngate.util.suggest import did_you_mean

#: What ``pip install attngate[gpu]`` installs: FlashInfer and FA4's flash_attn.cute (no FA3 wheel on PyPI).
DEFAULT_PROVIDERS: tuple[str, ...] = ("flashinfer", "flash_attn.cute")

#: data-center and workstation GPUs by product name (lower case, no spaces or dashes) -> their architecture
GPU_PRODUCTS: dict[str, str] = {
    "a100": "sm80", "a800": "sm80", "a30": "sm80",
    "a10": "sm86", "a10g": "sm86", "a40": "sm86", "a6000": "sm86", "rtx3090": "sm86",
    "l4": "sm89", "l40": "sm89", "l40s": "sm89", "rtx4090": "sm89", "rtx6000ada": "sm89",
    "h100": "sm90", "h800": "sm90", "h200": "sm90", "h20": "sm90", "gh200": "sm90",
    "b200": "sm100", "gb200": "sm100",
    "b300": "sm103", "gb300": "sm103",
    "rtx5090": "sm120", "rtxpro6000": "sm120",
    "gb10": "sm121", "dgxspark": "sm121",
}  # fmt: skip
_ARCH = re.compile(r"(?:sm_?)?(\d{2,3})|(\d{1,2})\.(\d)")


def _arch_of(name: str) -> str:
    """``sm90``, ``SM90``, ``sm_90``, ``90`` or ``9.0`` (compute capability), or a product name (``H100``,
    ``RTX 5090``) -> ``sm90``; anything else comes back as typed, for the caller to refuse."""
    text = name.strip().lower()
    product = GPU_PRODUCTS.get(text.replace(" ", "").replace("-", "").replace("_", "").removeprefix("nvidia"))
    if product is not None:
        return product
    match = _ARCH.fullmatch(text)
    if match is None:
        return text
    digits = match.group(1) or match.group(2) + match.group(3)
    return f"sm{digits}"


_PROVIDER_FIELD = {
    "flashinfer": "has_flashinfer",
    "flash_attn.cute": "has_flash_attn_cute",
    "flash_attn_interface": "has_flash_attn_interface",
}


class Platform(BaseModel):
    """A CUDA GPU architecture, e.g. ``sm90`` (Hopper) or ``sm100`` (Blackwell), and its kernel providers.

    The provider fields default to the ``gpu`` extra (FlashInfer and flash_attn.cute installed,
    FA3's flash_attn_interface not); ``detect()`` reads them off the local machine.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_arch: GpuArch
    #: FlashInfer (``flashinfer``) is installed.
    has_flashinfer: bool = True
    #: FlashAttention-4's ``flash_attn.cute`` is installed.
    has_flash_attn_cute: bool = True
    #: FlashAttention-3's ``flash_attn_interface`` is installed.
    has_flash_attn_interface: bool = False

    @property
    def sm_major(self) -> int:
        """Compute-capability major version: 8, 9, 10 or 12."""
        return int(self.gpu_arch[2:-1])

    @property
    def kernel_providers(self) -> tuple[str, ...]:
        return tuple(p for p in KERNEL_PROVIDERS if getattr(self, _PROVIDER_FIELD[p]))

    @classmethod
    def from_name(cls, name: str, *, kernels: tuple[str, ...] | list[str] | None = None, **facts: bool) -> "Platform":
        """Parse ``sm90`` (also ``SM90``, ``90``, ``9.0``).

        ``kernels`` names every installed provider (``flashinfer``, ``flash_attn.cute``,
        ``flash_attn_interface``; default: :data:`DEFAULT_PROVIDERS`); ``facts`` override single
        ``has_*`` fields. Raises PlatformError listing every unknown name (UsageError for arguments of the wrong type).
        """
        check_arguments(
            ("name", name, str, "e.g. 'sm90'"),
            ("kernels", kernels, (list, tuple, type(None)), "a list of provider names, e.g. ['flashinfer']"),
        )
        arch = _arch_of(name)
        problems = []
        if arch not in GPU_ARCHS:
            problems.append(
                Problem(
                    "--gpu",
                    f"unknown GPU {name!r}; an architecture ({', '.join(GPU_ARCHS)}) or a product name "
                    f"({', '.join(sorted(GPU_PRODUCTS))})" + did_you_mean(arch, [*get_args(GpuArch), *GPU_PRODUCTS]),
                )
            )
        providers = dict.fromkeys(_PROVIDER_FIELD.values(), False)
        for kernel in DEFAULT_PROVIDERS if kernels is None else kernels:
            if kernel in _PROVIDER_FIELD:
                providers[_PROVIDER_FIELD[kernel]] = True
            else:
                problems.append(
                    Problem(
                        "--kernels",
                        f"unknown kernel provider {kernel!r}; one of {', '.join(KERNEL_PROVIDERS)}"
                        + did_you_mean(kernel, KERNEL_PROVIDERS),
                    )
                )
        unknown = [k for k in facts if k not in providers]
        problems += [Problem(k, f"not a platform fact; one of {', '.join(providers)}") for k in unknown]
        if problems:
            raise PlatformError(problems)
        try:
            return cls(gpu_arch=arch, **{**providers, **facts})
        except ValidationError as err:
            raise PlatformError([Problem(".".join(map(str, e["loc"])), e["msg"]) for e in err.errors()]) from None

    @classmethod
    def detect(cls) -> "Platform":
        """Detect the local GPU through torch and the installed kernel packages. Raises PlatformError (pass ``--gpu``)."""
        try:
            probe = importlib.import_module("attngate.integrations.torch_platform")
            major, minor = probe.cuda_capability()
        except Exception as exc:  # torch missing, no CUDA device, driver error: all mean "pass --gpu"
            reason = "torch is not installed" if isinstance(exc, ImportError) else str(exc)
            raise PlatformError(
                Problem("--gpu", f"cannot detect the GPU ({reason}); pass --gpu sm80|sm90|sm100|sm120")
            ) from None
        return cls.from_name(f"{major}{minor}", kernels=installed_kernel_providers())


#: the modules that provide each kernel family, in the order they are looked for. sgl_kernel (installed with SGLang)
#: ships FlashAttention-3 under FA3's own interface (flash_attn_with_kvcache, flash_attn_varlen_func,
#: get_scheduler_metadata): in an SGLang process that is where fa3 comes from (sglang 0.5.23
#: layers/attention/flashattention_backend.py imports sgl_kernel.flash_attn).
KERNEL_MODULES: dict[str, tuple[str, ...]] = {
    "flashinfer": ("flashinfer",),
    "flash_attn.cute": ("flash_attn.cute",),
    "flash_attn_interface": ("flash_attn_interface", "sgl_kernel.flash_attn"),
}


def installed_kernel_modules() -> dict[str, str]:
    """Each kernel family importable here and the module that provides it (found without importing the module;
    a submodule's package is imported to look inside it)."""

    def found(module: str) -> bool:
        if sys.modules.get(module) is not None:  # imported already (or put there, as a test stand-in is)
            return True
        try:
            return importlib.util.find_spec(module) is not None
        except Exception:  # noqa: BLE001 - a parent package missing, broken, or failing to load its libraries
            return False

    modules = {family: next((m for m in candidates if found(m)), None) for family, candidates in KERNEL_MODULES.items()}
    return {family: module for family, module in modules.items() if module is not None}


def installed_kernel_providers() -> tuple[str, ...]:
    """The kernel families importable here (see installed_kernel_modules)."""
    return tuple(p for p in KERNEL_PROVIDERS if p in installed_kernel_modules())
