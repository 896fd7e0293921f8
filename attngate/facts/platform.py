"""``Platform``: the GPU architecture the plan is resolved for."""

from __future__ import annotations

import importlib
import importlib.util
from typing import get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attngate._suggest import did_you_mean
from attngate.errors import PlatformError, Problem
from attngate.facts.choices import GPU_ARCHS, GpuArch


class Platform(BaseModel):
    """A CUDA GPU architecture, e.g. ``sm90`` (Hopper) or ``sm100`` (Blackwell)."""

    model_config = ConfigDict(frozen=True)

    gpu_arch: GpuArch
    #: FlashAttention-3's ``flash_attn_interface`` is importable (found without importing it).
    has_flash_attn_interface: bool = Field(default_factory=lambda: importlib.util.find_spec("flash_attn_interface") is not None)

    @property
    def sm_major(self) -> int:
        """Compute-capability major version: 8, 9, 10 or 12."""
        return int(self.gpu_arch[2:-1])

    @classmethod
    def from_name(cls, name: str, **facts: bool) -> "Platform":
        """Parse ``sm90`` (also ``SM90``, ``90``, ``9.0``); ``facts`` override detected ones. Raises PlatformError."""
        text = name.strip().lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
        arch = f"sm{text}"
        try:
            return cls(gpu_arch=arch, **facts)
        except ValidationError:
            raise PlatformError(
                Problem("--gpu", f"unknown GPU architecture {name!r}; one of {', '.join(GPU_ARCHS)}" + did_you_mean(arch, get_args(GpuArch)))
            ) from None

    @classmethod
    def detect(cls) -> "Platform":
        """Detect the local GPU through torch. Raises PlatformError (pass ``--gpu``) when it cannot."""
        try:
            probe = importlib.import_module("attngate.integrations.torch_platform")
            major, minor = probe.cuda_capability()
        except Exception as exc:  # torch missing, no CUDA device, driver error: all mean "pass --gpu"
            reason = "torch is not installed" if isinstance(exc, ImportError) else str(exc)
            raise PlatformError(Problem("--gpu", f"cannot detect the GPU ({reason}); pass --gpu sm80|sm90|sm100|sm120")) from None
        return cls.from_name(f"{major}{minor}")
