"""``Platform``: the deployment a plan is resolved for: the GPU architecture and the kernel packages installed there.

The installed kernel providers are explicit facts, never probed behind the caller's back: a plan
resolved with ``--gpu sm90`` on a laptop equals the one resolved on the server with the same
facts. A GPU named without its kernels is a stock SGLang install on that GPU (what attngate answers
for: the server a user runs); ``Platform.detect()`` is the one place that looks at the local machine.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from attngate.errors import PlatformError, Problem, check_arguments, quoted
from attngate.facts.choices import KERNEL_PROVIDERS, SGLANG_VERSION
from attngate.facts.gpus import GPU_ARCHS, GPUS, GpuArch
from attngate.util.suggest import suggestion

#: What ``pip install attngate[gpu]`` installs: FlashInfer and FA4's flash_attn.cute (no FA3 wheel on PyPI).
ATTNGATE_KERNELS: tuple[str, ...] = ("flashinfer", "flash_attn.cute")

#: The architectures sgl_kernel builds FlashAttention-3 for (``flash_attn_interface`` in attngate's terms):
#: sgl_kernel/flash_attn.py ``is_fa3_supported`` (capability major 8 or 9).
_SGL_KERNEL_FA3_MAJORS = (8, 9)

#: Where a Platform's kernel set came from: a stock SGLang install on the GPU (the default for a named GPU),
#: named by the caller (``--kernels`` / ``kernels=`` / the ``has_*`` fields), or read off this host.
KernelSource = Literal["sglang", "given", "detected"]

#: ``--kernels`` presets: a whole deployment's kernel set by name.
KERNEL_PRESETS = ("sglang", "attngate")


def sglang_kernels(gpu_arch: str) -> tuple[str, ...]:
    """The kernel families a stock SGLang install brings on ``gpu_arch`` (e.g. ``sm90``): FlashInfer and FA4
    everywhere (sglang depends on flashinfer-python and ships flash_attn.cute), FA3 through sgl_kernel's build on
    SM80-SM90 only."""
    fa3 = GPUS[gpu_arch].major in _SGL_KERNEL_FA3_MAJORS
    return tuple(p for p in KERNEL_PROVIDERS if p != "flash_attn_interface" or fa3)


#: data-center and workstation GPUs by product name (lower case, no spaces or dashes) -> their architecture
GPU_PRODUCTS: dict[str, str] = {product: gpu.name for gpu in GPUS.values() for product in gpu.products}
_ARCH = re.compile(r"(?:sm_?)?(\d{2,3})|(\d{1,2})\.(\d)")


#: words of a device name that name no product: nvidia-smi's and torch's ``NVIDIA GeForce RTX 4090``
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "quadro")


def _product_arch(text: str) -> str | None:
    """The architecture of a product name as nvidia-smi or ``torch.cuda.get_device_name`` prints it (``NVIDIA H100
    80GB HBM3``, ``NVIDIA A100-SXM4-80GB``, ``NVIDIA RTX 6000 Ada Generation``): the longest run of leading words
    (vendor words dropped) that is a product; None where none is."""
    words = [w for w in re.split(r"[\s_\-]+", text) if w and w not in _VENDOR_WORDS]
    for n in range(len(words), 0, -1):
        arch = GPU_PRODUCTS.get("".join(words[:n]))
        if arch is not None:
            return arch
    return None


def _arch_of(name: str) -> str:
    """``sm90``, ``SM90``, ``sm_90``, ``90`` or ``9.0`` (compute capability), or a product name (``H100``,
    ``RTX 5090``, ``NVIDIA H100 80GB HBM3``) -> ``sm90``; anything else comes back as typed, for the caller to
    refuse."""
    text = name.strip().lower()
    product = _product_arch(text)
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

    Built with ``from_name`` (a named GPU: a stock SGLang install unless ``kernels`` names the set) or ``detect()``
    (this host). Constructed directly, the provider fields default to the ``gpu`` extra (FlashInfer and
    flash_attn.cute installed, FA3's flash_attn_interface not) and ``kernel_source`` to ``given``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_arch: GpuArch
    #: FlashInfer (``flashinfer``) is installed.
    has_flashinfer: bool = True
    #: FlashAttention-4's ``flash_attn.cute`` is installed.
    has_flash_attn_cute: bool = True
    #: FlashAttention-3's ``flash_attn_interface`` is installed.
    has_flash_attn_interface: bool = False
    #: SGLang's attention backends run the plan (sglang.srt.layers.attention: their bugs are the deployment's);
    #: False where attngate's own backends run it (AttngateRuntime, the plain transformers path). A rule fact.
    runs_sglang: bool = True
    #: Where the kernel set came from (not a fact the rules read): ``sglang`` (a stock SGLang install on this GPU),
    #: ``given`` (named by the caller) or ``detected`` (read off this host).
    kernel_source: KernelSource = "given"

    @property
    def sm_major(self) -> int:
        """Compute-capability major version: 8, 9, 10 or 12."""
        return GPUS[self.gpu_arch].major

    @property
    def kernel_providers(self) -> tuple[str, ...]:
        return tuple(p for p in KERNEL_PROVIDERS if getattr(self, _PROVIDER_FIELD[p]))

    @property
    def kernel_set(self) -> str:
        """The kernel set and where it came from, for a reader: ``flashinfer, flash_attn.cute, flash_attn_interface
        (stock SGLang 0.5.23 on sm90)``."""
        where = {
            "sglang": f"stock SGLang {SGLANG_VERSION} on {self.gpu_arch}",
            "given": "as given",
            "detected": "detected on this host",
        }[self.kernel_source]
        return f"{', '.join(self.kernel_providers) or 'no kernel providers'} ({where})"

    @classmethod
    def from_name(
        cls,
        name: str,
        *,
        kernels: tuple[str, ...] | list[str] | None = None,
        source: KernelSource | None = None,
        **facts: bool,
    ) -> "Platform":
        """Parse ``sm90`` (also ``SM90``, ``90``, ``9.0``, ``H100``, nvidia-smi's ``NVIDIA H100 80GB HBM3``).

        ``kernels`` names every installed provider (``flashinfer``, ``flash_attn.cute``, ``flash_attn_interface``)
        or a preset (``sglang``: :func:`sglang_kernels` of the GPU; ``attngate``: :data:`ATTNGATE_KERNELS`);
        default: ``sglang``, the deployment attngate answers for. ``source`` overrides the recorded
        ``kernel_source``; ``facts`` override single ``has_*`` fields. Raises PlatformError listing every unknown
        name (UsageError for arguments of the wrong type).
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
                    f"({', '.join(sorted(GPU_PRODUCTS))})",
                    help=suggestion(arch, [*GPU_ARCHS, *GPU_PRODUCTS]),
                    code="platform.unknown-gpu",
                )
            )
        providers = dict.fromkeys(_PROVIDER_FIELD.values(), False)
        names = ["sglang"] if kernels is None else list(kernels)
        stock = names == ["sglang"]
        for kernel in names:
            if kernel in KERNEL_PRESETS:
                preset = ATTNGATE_KERNELS if kernel == "attngate" else sglang_kernels(arch) if arch in GPU_ARCHS else ()
                providers.update({_PROVIDER_FIELD[k]: True for k in preset})
            elif kernel in _PROVIDER_FIELD:
                providers[_PROVIDER_FIELD[kernel]] = True
            else:
                problems.append(
                    Problem(
                        "--kernels",
                        f"unknown kernel provider {quoted(kernel)}; one of {', '.join(KERNEL_PROVIDERS)}, or a preset: "
                        f"{', '.join(KERNEL_PRESETS)}",
                        help=suggestion(kernel, [*KERNEL_PROVIDERS, *KERNEL_PRESETS]),
                        code="platform.unknown-kernel",
                    )
                )
        settable = [*providers, "runs_sglang"]
        unknown = [k for k in facts if k not in settable]
        problems += [
            Problem(k, f"not a platform fact; one of {', '.join(settable)}", code="platform.unknown-fact")
            for k in unknown
        ]
        if problems:
            raise PlatformError(problems)
        try:
            kernel_source = source or ("sglang" if stock and not set(facts) - {"runs_sglang"} else "given")
            return cls(gpu_arch=arch, kernel_source=kernel_source, **{**providers, **facts})
        except ValidationError as err:
            raise PlatformError(
                [Problem(".".join(map(str, e["loc"])), e["msg"], code="platform.invalid-value") for e in err.errors()]
            ) from None

    @classmethod
    def detect(cls) -> "Platform":
        """Detect the local GPU (CUDA device 0 as the driver reports it, :func:`cuda_capability`) and the installed
        kernel packages. Raises PlatformError (pass ``--gpu``)."""
        try:
            major, minor = cuda_capability()
        except (OSError, RuntimeError) as exc:  # no driver, no device, a driver error: all mean "pass --gpu"
            raise PlatformError(
                Problem(
                    "--gpu",
                    f"cannot detect the GPU ({exc}); pass --gpu sm80|sm90|sm100|sm120",
                    code="platform.undetected",
                )
            ) from None
        return cls.from_name(f"{major}{minor}", kernels=installed_kernel_providers(), source="detected")


#: cuda.h's CUdevice_attribute values of the compute capability
_CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76


def cuda_capability() -> tuple[int, int]:
    """(major, minor) compute capability of CUDA device 0, read from the CUDA driver (libcuda through ctypes): no
    torch or CUDA toolkit to import, so ``attngate explain`` on a GPU host starts as fast as on a laptop, and
    ``CUDA_VISIBLE_DEVICES`` decides which device is 0, as it does for torch and SGLang.

    Raises
    ------
    OSError
        Where no CUDA driver library can be loaded.
    RuntimeError
        Where the driver reports an error (no device visible: ``CUDA_ERROR_NO_DEVICE``, 100).
    """
    driver = ctypes.CDLL("nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1")  # the driver's own names

    def check(result: int, call: str) -> None:
        if result != 0:  # CUDA_SUCCESS
            detail = "no CUDA device is visible" if result == 100 else f"CUresult {result}"
            raise RuntimeError(f"the CUDA driver's {call} failed: {detail}")

    check(driver.cuInit(0), "cuInit")
    device, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    check(driver.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
    for value, attribute in (
        (major, _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
        (minor, _CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
    ):
        check(driver.cuDeviceGetAttribute(ctypes.byref(value), attribute, device), "cuDeviceGetAttribute")
    return major.value, minor.value


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
