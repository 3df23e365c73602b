"""Topology presets for consumer GPU boxes: PCIe only, no peer-to-peer between GPUs.

TorchRec's defaults describe a datacenter node (NVLink, 600 GB/s between GPUs). On RTX-class
boxes every GPU-to-GPU transfer is bounced through host memory (device -> host -> device), so
collectives run at about half the PCIe bandwidth, and NCCL adds CPU work on top. These presets
give TorchRec's cost model those numbers, so that it prices all-to-alls as they really cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from torchrec.distributed.planner.types import (
    CollectiveType,
    GeneralizedCommsBandwidth,
    HardwareConfig,
    KernelConfig,
    Topology,
    TopologyFactory,
    TrainerConfig,
)

_GB = 1024**3
_PER_MS = 1000.0  # TorchRec's planner expresses bandwidths in bytes per millisecond


@dataclass(frozen=True)
class ConsumerGPU:
    """Spec-sheet numbers of one consumer GPU model."""

    hbm_bytes: int
    hbm_gb_per_s: float  # device memory bandwidth
    pcie_gb_per_s: float  # effective host<->device bandwidth of its x16 link, one direction


# NVIDIA spec sheets; effective PCIe x16 throughput of ~24 GB/s (gen 4) and ~12 GB/s (gen 3).
CONSUMER_GPUS: Dict[str, ConsumerGPU] = {
    "rtx3090": ConsumerGPU(hbm_bytes=24 * _GB, hbm_gb_per_s=936.0, pcie_gb_per_s=24.0),
    "rtx4090": ConsumerGPU(hbm_bytes=24 * _GB, hbm_gb_per_s=1008.0, pcie_gb_per_s=24.0),
    "rtx3080": ConsumerGPU(hbm_bytes=10 * _GB, hbm_gb_per_s=760.0, pcie_gb_per_s=24.0),
    "rtx2080ti": ConsumerGPU(hbm_bytes=11 * _GB, hbm_gb_per_s=616.0, pcie_gb_per_s=12.0),
}


class HostBouncedCommsBandwidths(GeneralizedCommsBandwidth):
    """Collective bandwidths when GPUs talk only through host memory.

    Inside a host, data crosses PCIe twice (GPU -> host, host -> GPU) and the GPUs share the host's
    memory system, so a collective moves at about half a link's bandwidth. Across hosts the NIC
    bounds it.
    """

    def __init__(self, pcie_bw: float, inter_host_bw: float) -> None:
        self._intra = pcie_bw / 2.0
        self._inter = inter_host_bw

    @property
    def intra_host_bw(self) -> float:
        return self._intra

    @property
    def inter_host_bw(self) -> float:
        return self._inter

    def get_bw(self, local_world_size: int, world_size: int, collective_type: CollectiveType) -> float:
        return self._intra if world_size <= local_world_size else min(self._intra, self._inter)

    def __hash__(self) -> int:
        return hash((self._intra, self._inter))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostBouncedCommsBandwidths) and (self._intra, self._inter) == (other._intra, other._inter)


def consumer_pcie_topology(
    world_size: int,
    gpu: str = "rtx3090",
    local_world_size: Optional[int] = None,
    ddr_cap: Optional[int] = None,
    inter_host_gb_per_s: float = 1.25,
    compute_device: str = "cuda",
) -> Topology:
    """A TorchRec Topology for ``world_size`` consumer GPUs on PCIe without peer-to-peer.

    Args:
        world_size: number of GPUs (ranks).
        gpu: a key of :data:`CONSUMER_GPUS` ("rtx3090", "rtx4090", "rtx3080", "rtx2080ti").
        local_world_size: GPUs per host (default: all on one host, Frugal's setting).
        ddr_cap: host memory per rank in bytes (TorchRec's default if None).
        inter_host_gb_per_s: NIC bandwidth between hosts (10 GbE by default).
        compute_device: "cuda" to plan for the GPUs; "cpu" plans the same box for CPU ranks
            (device memory then is host memory, as TorchRec's cpu topology has no HBM).
    """
    if gpu not in CONSUMER_GPUS:
        raise ValueError(f"unknown gpu {gpu!r}; known: {sorted(CONSUMER_GPUS)}")
    spec = CONSUMER_GPUS[gpu]
    pcie = spec.pcie_gb_per_s * _GB / _PER_MS
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(world_size=world_size, local_world_size=local_world_size or world_size),
        hardware_config=HardwareConfig(
            hbm_cap_bytes=spec.hbm_bytes,
            ddr_cap_bytes=ddr_cap,
            hbm_mem_bw=spec.hbm_gb_per_s * _GB / _PER_MS,
            hbm_to_ddr_mem_bw=pcie,
        ),
        kernel_config=KernelConfig(
            compute_device=compute_device,
            use_hardware_based_bandwidth=True,
            generalized_comms_bandwidths=HostBouncedCommsBandwidths(
                pcie_bw=pcie, inter_host_bw=inter_host_gb_per_s * _GB / _PER_MS
            ),
        ),
    )
