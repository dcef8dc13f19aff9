"""Devices and links: named hardware parameters and the time of the messages they carry.

Every bandwidth is a named field with its source beside the figure. Collectives follow the
alpha-beta model of NCCL's algorithms: a message costs `alpha` to start plus bytes / bandwidth.
"""
from __future__ import annotations

import collections
import functools
import math
from dataclasses import dataclass

from ..errors import TesselError

GIB = 1024 ** 3
MIB = 1024 ** 2


@dataclass(frozen=True)
class Hardware:
    """One device type and its links. Bandwidths are in bytes/s."""
    name: str
    flops: float              # sustained dense FLOP/s (the training precision's GEMMs)
    memory: float             # bytes of device memory
    hbm: float                # effective device-memory bandwidth, for memory-bound kernels
    intra_bandwidth: float    # bus bandwidth of a ring inside a node (NVLink/NVSwitch), per device
    nic_bandwidth: float      # one network card (InfiniBand HCA) of a node, one direction
    nics_per_node: int = 8    # NCCL spreads its rings over all of them
    devices_per_node: int = 8
    link_latency: float = 10e-6   # start-up time of one message (the alpha of alpha-beta)
    reserved: float = 3 * GIB     # CUDA context, allocator slack, GEMM workspaces

    def node_of(self, device: int) -> int:
        return device // self.devices_per_node

    def spans_nodes(self, devices: tuple[int, ...]) -> bool:
        return len({self.node_of(d) for d in devices}) > 1

    def ring_bandwidth(self, devices: tuple[int, ...]) -> float:
        """Bus bandwidth of a ring over `devices`. Inside one node: NVLink. Across nodes, each of
        NCCL's rings leaves a node once through one NIC, and NCCL runs one ring per NIC a group
        can use (one per member on the node, at most the node's NICs): the node's boundary
        carries nic_bandwidth x min(nics, members on the node), never above NVLink's rate."""
        return _ring_bandwidth(self, tuple(devices))

    def p2p_bandwidth(self, devices: tuple[int, ...]) -> float:
        """One point-to-point message: NVLink inside a node, one NIC across nodes."""
        return self.nic_bandwidth if self.spans_nodes(devices) else self.intra_bandwidth

    def usable(self) -> float:
        return self.memory - self.reserved


# Sustained FLOP/s are ~50% of the dense fp16/bf16 peak, what large-model training reaches
# (Megatron-LM reports 44-52% on A100). intra_bandwidth: NCCL all-reduce bus bandwidth in one
# node (nccl-tests on DGX A100 ~230 GB/s, DGX-1 V100 hybrid cube mesh ~130 GB/s, DGX H100
# ~450 GB/s), rounded down. nic_bandwidth: one HCA, DGX A100 8 x HDR 200 Gb/s = 25 GB/s each,
# DGX H100 8 x NDR 400 Gb/s = 50 GB/s each. The paper's V100 testbed: nodes of 8 V100-32GB with
# NVLink and one 100 Gb/s InfiniBand (EDR) card per node, 12.5 GB/s (Azure NDv2's network).
HARDWARE = {
    "a100-80g": Hardware("A100-80GB", flops=150e12, memory=80 * GIB, hbm=1.6e12,
                         intra_bandwidth=200e9, nic_bandwidth=25e9, nics_per_node=8),
    "v100-32g": Hardware("V100-32GB", flops=60e12, memory=32 * GIB, hbm=0.8e12,
                         intra_bandwidth=120e9, nic_bandwidth=12.5e9, nics_per_node=1),
    "h100-80g": Hardware("H100-80GB", flops=400e12, memory=80 * GIB, hbm=2.8e12,
                         intra_bandwidth=370e9, nic_bandwidth=50e9, nics_per_node=8),
}


def hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise TesselError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}") from None


def allreduce_seconds(nbytes: float, devices: tuple[int, ...], hw: Hardware) -> float:
    """All-reduce as NCCL picks it: the faster of a ring and a tree.

    Ring: 2 (t-1)/t * bytes / bus bandwidth, in 2 (t-1) steps of alpha each.
    Tree (NCCL's double binary tree): bytes go up and down, 2 bytes / bandwidth, in
    2 ceil(log2 t) steps: what small messages (a few scalars per token) take.
    """
    t = len(devices)
    if t <= 1 or nbytes <= 0:
        return 0.0
    bw = hw.ring_bandwidth(devices)
    ring = 2 * (t - 1) / t * nbytes / bw + 2 * (t - 1) * hw.link_latency
    tree = 2 * nbytes / bw + 2 * math.ceil(math.log2(t)) * hw.link_latency
    return min(ring, tree)


def p2p_seconds(nbytes: float, src: tuple[int, ...], dst: tuple[int, ...], hw: Hardware) -> float:
    """One message between device sets: bytes / bandwidth of the slower link + start-up."""
    if set(src) == set(dst) or nbytes <= 0:
        return 0.0
    return nbytes / hw.p2p_bandwidth(tuple(src) + tuple(dst)) + hw.link_latency


@functools.lru_cache(maxsize=1024)
def _ring_bandwidth(hw: Hardware, devices: tuple[int, ...]) -> float:
    """Hardware.ring_bandwidth, remembered: the cost model asks it of the same groups for every
    layer (4,096-device groups thousands of times for the candidates of a large cluster)."""
    per = hw.devices_per_node
    members = collections.Counter(d // per for d in devices)
    if len(members) <= 1:
        return hw.intra_bandwidth
    rings = min(hw.nics_per_node, min(members.values()))
    return min(hw.intra_bandwidth, hw.nic_bandwidth * rings)
