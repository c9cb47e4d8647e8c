"""GPU facts: memory, memory bandwidth and dense bf16 TFLOPS (vendor data sheets).

Units: memory is binary. Vendors print "24 GB" for 24 GiB of GDDR/HBM (an RTX
4090 shows 24,564 MiB in nvidia-smi, an A100 80GB 81,920 MiB), so we store GiB.
Bandwidth is decimal (TB/s = 10^12 bytes/s) and TFLOPS are dense, without sparsity.
"""

from __future__ import annotations

from dataclasses import dataclass

from inhouse.plan.errors import PlanError
from inhouse.plan.units import GIB


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator model."""

    name: str
    memory_gib: float
    bandwidth_tb_s: float
    bf16_tflops: float

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.bandwidth_tb_s * 1e12


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec("RTX 4090", 24, 1.008, 165),
    GpuSpec("L4", 24, 0.300, 121),
    GpuSpec("L40S", 48, 0.864, 362),
    GpuSpec("A10G", 24, 0.600, 125),  # TFLOPS of the A10; AWS does not publish A10G's
    GpuSpec("A100 40G SXM", 40, 1.555, 312),
    GpuSpec("A100 80G SXM", 80, 2.039, 312),
    GpuSpec("A100 80G PCIe", 80, 1.935, 312),
    GpuSpec("H100 SXM", 80, 3.35, 989),
    GpuSpec("H100 PCIe", 80, 2.0, 756),
    GpuSpec("H200", 141, 4.8, 989),
    GpuSpec("B200", 180, 8.0, 2250),  # 180 GB usable of 192
    GpuSpec("MI300X", 192, 5.3, 1307),
)

_ALIASES = {
    "4090": "rtx4090",
    "a100": "a10080gsxm",
    "a10080g": "a10080gsxm",
    "a10040g": "a10040gsxm",
    "a100sxm": "a10080gsxm",
    "a100pcie": "a10080gpcie",
    "h100": "h100sxm",
    "a10": "a10g",
}


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum()).replace("gb", "g")


def gpu_names() -> list[str]:
    """Names of the GPUs in the catalogue."""
    return [gpu.name for gpu in GPUS]


def find_gpu(name: str) -> GpuSpec:
    """The GPU called `name`, ignoring case, spaces and dashes ("h100-sxm", "A100-80GB")."""
    key = _key(name)
    key = _ALIASES.get(key, key)
    gpu = next((gpu for gpu in GPUS if _key(gpu.name) == key), None)
    if gpu is None:
        raise PlanError(f"unknown GPU {name!r}; known GPUs: {', '.join(gpu_names())}")
    return gpu
