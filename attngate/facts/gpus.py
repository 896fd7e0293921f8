"""The GPU architectures attngate knows, declared once: each one's compute capability, its family and the product
names nvidia-smi prints for it. The rest is derived from this table: the ``gpu_arch`` names (``GpuArch``,
``GPU_ARCHS``), the ``sm_major`` fact (``Platform.sm_major``), the product names ``--gpu`` accepts
(``platform.GPU_PRODUCTS``) and the z3 link between ``gpu_arch`` and ``sm_major`` (analysis.encoding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class GpuArchitecture:
    """One CUDA GPU architecture.

    Attributes
    ----------
    capability : tuple of int
        The compute capability ``(major, minor)``, as ``torch.cuda.get_device_capability`` gives it, e.g. ``(9, 0)``.
    family : {"ampere", "ada", "hopper", "blackwell"}
        NVIDIA's name for the generation.
    products : tuple of str
        Product names of the data-center and workstation parts, lower case without spaces or dashes, as nvidia-smi
        or ``torch.cuda.get_device_name`` print them less the vendor words (``NVIDIA H100 80GB HBM3`` -> ``h100``).
    """

    capability: tuple[int, int]
    family: Literal["ampere", "ada", "hopper", "blackwell"]
    products: tuple[str, ...]

    @property
    def name(self) -> str:
        """The architecture's name, ``sm`` and the capability's digits: ``sm90``, ``sm100``, ``sm121``."""
        return "sm{}{}".format(*self.capability)

    @property
    def major(self) -> int:
        """The compute capability's major version, the ``sm_major`` fact: 8, 9, 10 or 12."""
        return self.capability[0]

    @property
    def is_hopper(self) -> bool:
        """A Hopper GPU (SM90)."""
        return self.family == "hopper"

    @property
    def is_blackwell(self) -> bool:
        """A Blackwell GPU: the data-center SM10x and the workstation and desktop SM12x (rules.yaml's
        ``is_blackwell`` predicate, ``is_sm100 or is_sm120``)."""
        return self.family == "blackwell"


#: every architecture, in capability order (the order of ``GPU_ARCHS`` and of the product names)
_TABLE = (
    GpuArchitecture((8, 0), "ampere", ("a100", "a800", "a30")),
    GpuArchitecture((8, 6), "ampere", ("a10", "a10g", "a40", "a6000", "rtxa6000", "rtx3090")),
    GpuArchitecture((8, 9), "ada", ("l4", "l40", "l40s", "rtx4090", "rtx6000ada")),
    GpuArchitecture((9, 0), "hopper", ("h100", "h800", "h200", "h20", "gh200")),
    GpuArchitecture((10, 0), "blackwell", ("b200", "gb200")),
    GpuArchitecture((10, 3), "blackwell", ("b300", "gb300")),
    GpuArchitecture((12, 0), "blackwell", ("rtx5090", "rtxpro6000")),
    GpuArchitecture((12, 1), "blackwell", ("gb10", "dgxspark")),
)

#: each architecture by name (``sm90``)
GPUS: dict[str, GpuArchitecture] = {gpu.name: gpu for gpu in _TABLE}

#: the architecture names a Platform's ``gpu_arch`` and the ``gpu_arch`` fact take
GPU_ARCHS: tuple[str, ...] = tuple(GPUS)

#: the type of ``gpu_arch``: one of GPU_ARCHS (a Literal built from the table, so no list of names is kept beside it)
GpuArch = Literal[GPU_ARCHS]  # type: ignore[valid-type]
