"""Run SGLang's own server-argument resolution for a GPU this host does not have.

SGLang 0.5.23 resolves its arguments in pure Python; what ties the result to a GPU is a handful of device
queries. :func:`fake_gpu` answers them for one architecture and changes nothing else: every patched
function is listed in :data:`PATCHED`, with the reason.

SGLang's probes are ``lru_cache``-d and some of its modules import GPU-only packages when a probe says
CUDA at import time, so the modules resolution needs are imported first (:func:`preload`, no GPU
answered), and the probes' caches are cleared on entry and exit.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from attngate.facts.gpus import GPUS


@dataclass(frozen=True)
class GpuProfile:
    """What SGLang reads off a GPU: the name, the capability, the memory (GiB) and SM count of the
    data-centre part of each architecture (SGLang's chunked-prefill and CUDA-graph defaults read memory)."""

    name: str
    capability: tuple[int, int]
    memory_gib: int
    sm_count: int


#: the part each architecture is answered as: (device name, memory GiB, SM count); its capability is the GPU table's
_PARTS: dict[str, tuple[str, int, int]] = {
    "sm80": ("NVIDIA A100-SXM4-80GB", 80, 108),
    "sm86": ("NVIDIA RTX A6000", 48, 84),
    "sm89": ("NVIDIA L40S", 48, 142),
    "sm90": ("NVIDIA H100 80GB HBM3", 80, 132),
    "sm100": ("NVIDIA B200", 180, 148),
    "sm103": ("NVIDIA B300 SXM6 AC", 268, 148),
    "sm120": ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 96, 188),
    "sm121": ("NVIDIA GB10", 119, 48),
}
assert set(_PARTS) == set(GPUS)
PROFILES: dict[str, GpuProfile] = {
    arch: GpuProfile(name, GPUS[arch].capability, memory, sms) for arch, (name, memory, sms) in _PARTS.items()
}

#: Every function patched under :func:`fake_gpu`, and why. Nothing else of SGLang or torch is touched.
PATCHED: dict[str, str] = {
    "torch.cuda.is_available": "SGLang's is_cuda(): the CUDA branch of every platform probe",
    "torch.version.cuda": "is_sm*_supported() compare the CUDA toolkit version (a CPU build of torch has none)",
    "torch.cuda.is_initialized": "get_device_sm() asks NVML while CUDA is uninitialised; True sends it to the capability",
    "torch.cuda.get_device_capability": "the compute capability (sm90 -> (9, 0))",
    "torch.cuda.get_device_name": "model overrides that key on the part name",
    "torch.cuda.device_count": "parallel-size checks against the visible GPUs",
    "torch.cuda.mem_get_info": "GPU memory, read by the chunked-prefill and CUDA-graph batch defaults",
    "torch.cuda.get_device_properties": "memory and SM count read through the device properties",
    "sglang.srt.utils.common.get_nvgpu_memory_capacity": "runs nvidia-smi, which would answer for this host's GPU",
    "sglang.srt.utils.common.is_flashinfer_available": "SGLang installs FlashInfer with itself; its import needs CUDA",
    "sglang.srt.layers.quantization.QUANTIZATION_METHODS": "a CUDA import registers mxfp4 (gpt-oss) at import time",
}

DEVICE_COUNT = 8


def preload() -> None:
    """Import what SGLang's resolution imports lazily, before any GPU is answered (its GPU-only kernels
    are imported at module level where a probe says CUDA)."""
    import sglang.srt.arg_groups as groups
    import sglang.srt.configs.model_config  # noqa: F401
    import sglang.srt.server_args  # noqa: F401
    import sglang.srt.speculative.dflash_utils  # noqa: F401  (DFLASH's hook; its sampler imports sgl_kernel under CUDA)

    for info in pkgutil.walk_packages(groups.__path__, groups.__name__ + "."):
        importlib.import_module(info.name)


def _clear_probe_caches() -> None:
    from sglang.srt.utils import common

    for value in vars(common).values():
        if callable(value) and hasattr(value, "cache_clear"):
            value.cache_clear()


@contextlib.contextmanager
def fake_gpu(arch: str, *, devices: int = DEVICE_COUNT) -> Iterator[GpuProfile]:
    """Answer SGLang's device queries as ``devices`` GPUs of architecture ``arch`` (``sm90``...) would.

    Raises KeyError for an arch outside :data:`PROFILES`. Call :func:`preload` first (once per process).
    """
    import torch
    from sglang.srt.utils import common

    gpu = PROFILES[arch]
    total = gpu.memory_gib << 30
    properties = types.SimpleNamespace(
        name=gpu.name,
        major=gpu.capability[0],
        minor=gpu.capability[1],
        total_memory=total,
        multi_processor_count=gpu.sm_count,
    )
    answers: dict[str, Any] = {
        "torch.cuda.is_available": lambda: True,
        "torch.version.cuda": torch.version.cuda or "12.9",
        "torch.cuda.is_initialized": lambda: True,
        "torch.cuda.get_device_capability": lambda device=None: gpu.capability,
        "torch.cuda.get_device_name": lambda device=None: gpu.name,
        "torch.cuda.device_count": lambda: devices,
        "torch.cuda.mem_get_info": lambda device=None: (total, total),
        "torch.cuda.get_device_properties": lambda device=None: properties,
        "sglang.srt.utils.common.get_nvgpu_memory_capacity": lambda: total >> 20,
        "sglang.srt.utils.common.is_flashinfer_available": lambda: True,
    }
    from sglang.srt.layers import quantization

    cuda_methods = {"mxfp4": quantization.Mxfp4Config}
    assert {*answers, "sglang.srt.layers.quantization.QUANTIZATION_METHODS"} == PATCHED.keys()
    with contextlib.ExitStack() as stack:
        for target, value in answers.items():
            stack.enter_context(mock.patch(target, value))
        stack.enter_context(mock.patch.dict(quantization.QUANTIZATION_METHODS, cuda_methods))
        _clear_probe_caches()
        stack.callback(_clear_probe_caches)
        del common
        yield gpu
