"""GPU detection through torch, kept here so that the core never imports torch."""

from __future__ import annotations

import torch


def cuda_capability() -> tuple[int, int]:
    """(major, minor) compute capability of CUDA device 0. Raises RuntimeError without a device."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device is visible to torch")
    return torch.cuda.get_device_capability(0)
