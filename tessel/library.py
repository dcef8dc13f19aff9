"""Named placements of the paper, as functions of the device count and the block costs.

With their defaults they give the public suite's placements (`../shared/bench/suite.json`, beside the repo) block for
block: the same ids, kinds, durations, memory, devices and edges. Costs: `forward` and
`backward` are the durations of a pipeline stage's blocks, `shard` the duration of a block on all
devices (forward and backward alike), `memory` the activation a stage keeps, `latency` the
cross-device edge cost. Each docstring shows one micro-batch of the default 4-device form
(`tessel show NAME`), blocks as early as their inputs allow.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable

from .builder import Stage, build_stages
from .placement import Number, Placement, PlacementError


def _devices(name: str, devices: int, least: int = 1, even: bool = False) -> int:
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < least or (even and devices % 2):
        need = f"an even device count >= {least}" if even else f"a device count >= {least}"
        raise PlacementError(f"placement {name} needs {need}, got {devices!r}")
    return devices


def _chain(stages: list[Stage]) -> list[tuple[str, str]]:
    return [(a.name, b.name) for a, b in zip(stages, stages[1:])]


def _pipeline(p: int, forward: Number, backward: Number, memory: Number, weight: Number = 0) -> list[Stage]:
    """Stage i on device i: forward f{i}, backward b{p-1-i} (backward ids count from the loss)."""
    return [Stage(f"s{i}", (i,), forward, backward, weight, memory, (f"f{i}", f"b{p - 1 - i}", f"w{p - 1 - i}"))
            for i in range(p)]


def _sharded(p: int, fid: str, bid: str, shard: Number, backward: bool = True, memory: Number = 0) -> Stage:
    return Stage(fid, tuple(range(p)), shard, shard if backward else 0, 0, memory, (fid, bid, "w" + bid[1:]))


def vshape(devices: int = 4, forward: Number = 1, backward: Number = 3, memory: Number = 1,
           latency: Number = 0) -> Placement:
    """1F1B pipeline: stage i's forward on device i, its backward back on device i.

    d0  f0 .. .. .. .. .. .. .. .. .. .. .. .. b3 b3 b3
    d1  .. f1 .. .. .. .. .. .. .. .. b2 b2 b2 .. .. ..
    d2  .. .. f2 .. .. .. .. b1 b1 b1 .. .. .. .. .. ..
    d3  .. .. .. f3 b0 b0 b0 .. .. .. .. .. .. .. .. ..
    """
    p = _devices("vshape", devices)
    stages = _pipeline(p, forward, backward, memory)
    return build_stages(f"vshape-{p}", p, stages, _chain(stages), latency=latency)


def interleaved(devices: int = 4, chunks: int = 2, forward: Number = 1, backward: Number = 3,
                memory: Number = 1, latency: Number = 0) -> Placement:
    """Looped pipeline (Megatron interleaved): `chunks` model chunks per device, stage k on
    device k mod p; `forward`/`backward` are one chunk's costs. chunks=2:

    d0  f0 .. .. .. f4 .. .. .. .. .. .. .. .. .. .. .. .. b3 b3 b3 .. .. .. .. .. .. .. .. .. b7 b7 b7
    d1  .. f1 .. .. .. f5 .. .. .. .. .. .. .. .. b2 b2 b2 .. .. .. .. .. .. .. .. .. b6 b6 b6 .. .. ..
    d2  .. .. f2 .. .. .. f6 .. .. .. .. b1 b1 b1 .. .. .. .. .. .. .. .. .. b5 b5 b5 .. .. .. .. .. ..
    d3  .. .. .. f3 .. .. .. f7 b0 b0 b0 .. .. .. .. .. .. .. .. .. b4 b4 b4 .. .. .. .. .. .. .. .. ..
    """
    p = _devices("interleaved", devices)
    if not isinstance(chunks, int) or chunks < 1:
        raise PlacementError(f"placement interleaved needs chunks >= 1, got {chunks!r}")
    s = p * chunks
    stages = [Stage(f"s{k}", (k % p,), forward, backward, 0, memory, (f"f{k}", f"b{s - 1 - k}", f"w{s - 1 - k}"))
              for k in range(s)]
    return build_stages(f"interleaved-{p}x{chunks}", p, stages, _chain(stages), latency=latency)


def interleaved_zb(devices: int = 4, chunks: int = 2, forward: Number = 1, backward: Number = 1, weight: Number = 1,
                   memory: Number = 1, latency: Number = 0, weight_release: Number = 1) -> Placement:
    """Looped pipeline with the backward split into B and W (torch's ScheduleInterleavedZeroBubble):
    `chunks` model chunks per device, stage k on device k mod p, each backward an input-gradient B
    (`backward`) and a weight-gradient W (`weight`, `weight_release` as in `zb`). Costs are one chunk's.

    d0  f0 .. .. .. f4 .. .. .. .. .. .. b3 w3 .. .. b7 w7
    d1  .. f1 .. .. .. f5 .. .. .. .. b2 w2 .. .. b6 w6 ..
    d2  .. .. f2 .. .. .. f6 .. .. b1 w1 .. .. b5 w5 .. ..
    d3  .. .. .. f3 .. .. .. f7 b0 w0 .. .. b4 w4 .. .. ..
    """
    p = _devices("interleaved-zb", devices)
    if not isinstance(chunks, int) or chunks < 1:
        raise PlacementError(f"placement interleaved-zb needs chunks >= 1, got {chunks!r}")
    s = p * chunks
    stages = [Stage(f"s{k}", (k % p,), forward, backward, weight, memory, (f"f{k}", f"b{s - 1 - k}", f"w{s - 1 - k}"))
              for k in range(s)]
    return build_stages(f"interleaved-zb-{p}x{chunks}", p, stages, _chain(stages), split_weight=True,
                        latency=latency, weight_release=weight_release)


def zb(devices: int = 4, forward: Number = 1, backward: Number = 2, weight: Number = 1, memory: Number = 1,
       latency: Number = 0, weight_release: Number = 1) -> Placement:
    """V pipeline with the backward split (zero bubble): B (`backward`, input gradient) passes the
    gradient on, W (`weight`, weight gradient) runs after it on the same device and releases the
    activation, or the fraction `weight_release` of it with B freeing the rest (tessel.builder).

    d0  f0 .. .. .. .. .. .. .. .. .. b3 b3 w3
    d1  .. f1 .. .. .. .. .. .. b2 b2 w2 .. ..
    d2  .. .. f2 .. .. .. b1 b1 w1 .. .. .. ..
    d3  .. .. .. f3 b0 b0 w0 .. .. .. .. .. ..
    """
    p = _devices("zb", devices)
    stages = _pipeline(p, forward, backward, memory, weight)
    return build_stages(f"zb-{p}", p, stages, _chain(stages), split_weight=True, latency=latency,
                        weight_release=weight_release)


def zbv(devices: int = 4, forward: Number = 1, backward: Number = 1, weight: Number = 1, memory: Number = 1,
        latency: Number = 0, weight_release: Number = 1) -> Placement:
    """Zero-bubble V placement (ZB-V, Qi et al. 2024): two model chunks per device, chunk 0 on
    devices 0..p-1 (f0..f{p-1}), chunk 1 back on p-1..0 (f{p}..f{2p-1}), so the loss is on device 0;
    each backward split into B and W (`weight`, `weight_release` as in `zb`). Costs are one chunk's.

    d0  f0 .. .. .. .. .. .. f7 b0 w0 .. .. .. .. .. b7 w7
    d1  .. f1 .. .. .. .. f6 .. .. b1 w1 .. .. .. b6 w6 ..
    d2  .. .. f2 .. .. f5 .. .. .. .. b2 w2 .. b5 w5 .. ..
    d3  .. .. .. f3 f4 .. .. .. .. .. .. b3 w3 b4 w4 .. ..
    """
    p = _devices("zbv", devices)
    s = 2 * p
    stages = [Stage(f"s{k}", (k if k < p else s - 1 - k,), forward, backward, weight, memory,
                    (f"f{k}", f"b{s - 1 - k}", f"w{s - 1 - k}")) for k in range(s)]
    return build_stages(f"zbv-{p}", p, stages, _chain(stages), split_weight=True, latency=latency,
                        weight_release=weight_release)


def xshape(devices: int = 4, forward: Number = 1, backward: Number = 3, memory: Number = 1,
           latency: Number = 0) -> Placement:
    """Two opposite pipelines in one micro-batch (Chimera): one runs devices 0..p-1, the other
    p-1..0; at every step the lower device's block has the even id.

    d0  f0 .. .. f6 b0 b0 b0 .. .. .. .. .. .. b6 b6 b6
    d1  .. f2 f4 .. .. .. .. b2 b2 b2 b4 b4 b4 .. .. ..
    d2  .. f3 f5 .. .. .. .. b3 b3 b3 b5 b5 b5 .. .. ..
    d3  f1 .. .. f7 b1 b1 b1 .. .. .. .. .. .. b7 b7 b7
    """
    p = _devices("xshape", devices, 2, even=True)

    def stage(pipe: str, step: int, device: int, other: int, bstep: int) -> Stage:
        lo = int(device > other)
        return Stage(f"{pipe}{step}", (device,), forward, backward, 0, memory,
                     (f"f{2 * step + lo}", f"b{2 * bstep + lo}", f"w{2 * bstep + lo}"))

    down = [stage("d", k, k, p - 1 - k, p - 1 - k) for k in range(p)]
    up = [stage("u", k, p - 1 - k, k, p - 1 - k) for k in range(p)]
    return build_stages(f"xshape-{p}", p, down + up, _chain(down) + _chain(up), latency=latency)


def mshape(devices: int = 4, forward: Number = 1, backward: Number = 3, shard: Number = 1, memory: Number = 1,
           latency: Number = 0) -> Placement:
    """An embedding sharded on all devices before the pipeline, its backward after it.

    d0  fA0  f0 ... ... ... ... ... ... ... ... ... ... ... ...  b3  b3  b3 bA0
    d1  fA0 ...  f1 ... ... ... ... ... ... ... ...  b2  b2  b2 ... ... ... bA0
    d2  fA0 ... ...  f2 ... ... ... ...  b1  b1  b1 ... ... ... ... ... ... bA0
    d3  fA0 ... ... ...  f3  b0  b0  b0 ... ... ... ... ... ... ... ... ... bA0
    """
    p = _devices("mshape", devices)
    stages = [_sharded(p, "fA0", "bA0", shard)] + _pipeline(p, forward, backward, memory)
    return build_stages(f"mshape-{p}", p, stages, _chain(stages), latency=latency)


def nnshape(devices: int = 4, forward: Number = 1, backward: Number = 3, shard: Number = 1, memory: Number = 1,
            encoder: int | None = None, latency: Number = 0) -> Placement:
    """Encoder-decoder with a shared embedding on all devices at the start and between encoder
    (devices 0..e-1, e = p//2 unless `encoder` says) and decoder.

    d0  fA0  f0 ... fA1 ... ... ... ... ... ... ... ... bA0 ... ... ...  b3  b3  b3 bA1
    d1  fA0 ...  f1 fA1 ... ... ... ... ... ... ... ... bA0  b2  b2  b2 ... ... ... bA1
    d2  fA0 ... ... fA1  f2 ... ... ... ...  b1  b1  b1 bA0 ... ... ... ... ... ... bA1
    d3  fA0 ... ... fA1 ...  f3  b0  b0  b0 ... ... ... bA0 ... ... ... ... ... ... bA1
    """
    p = _devices("nnshape", devices, 2)
    e = p // 2 if encoder is None else encoder
    if not isinstance(e, int) or not 1 <= e < p:
        raise PlacementError(f"placement nnshape needs 1 <= encoder < {p}, got {encoder!r}")
    pipe = _pipeline(p, forward, backward, memory)
    stages = [_sharded(p, "fA0", "bA1", shard)] + pipe[:e] + [_sharded(p, "fA1", "bA0", shard)] + pipe[e:]
    return build_stages(f"nnshape-{p}", p, stages, _chain(stages), latency=latency)


def kshape(devices: int = 4, forward: Number = 1, backward: Number = 3, shard: Number = 1, memory: Number = 1,
           latency: Number = 0) -> Placement:
    """Two branches on disjoint devices (0..p/2-1 and p/2..p-1) joined by a fusion block on all
    devices (multi-modal encoders): branch A's stage i has id f{2i}, branch B's f{2i+1}.

    d0   f0 ... fA0 bA0 ... ... ...  b2  b2  b2
    d1  ...  f2 fA0 bA0  b0  b0  b0 ... ... ...
    d2   f1 ... fA0 bA0 ... ... ...  b3  b3  b3
    d3  ...  f3 fA0 bA0  b1  b1  b1 ... ... ...
    """
    p = _devices("kshape", devices, 2, even=True)
    h = p // 2

    def stage(branch: int, i: int) -> Stage:
        j = 2 * (h - 1 - i) + branch
        return Stage(f"{'ab'[branch]}{i}", (branch * h + i,), forward, backward, 0, memory,
                     (f"f{2 * i + branch}", f"b{j}", f"w{j}"))

    a, b = [stage(0, i) for i in range(h)], [stage(1, i) for i in range(h)]
    join = _sharded(p, "fA0", "bA0", shard, memory=memory)
    stages = [s for pair in zip(a, b) for s in pair] + [join]
    edges = _chain(a) + _chain(b) + [(a[-1].name, join.name), (b[-1].name, join.name)]
    return build_stages(f"kshape-{p}", p, stages, edges, latency=latency)


def alphafold(devices: int = 4, forward: Number = 1, backward: Number = 1, memory: Number = 1, passes: int = 3,
              latency: Number = 0) -> Placement:
    """Recycling: `passes` forward passes through the pipeline; only the last keeps activations
    and gets a backward (the earlier ones run without gradients).

    d0   f0 ... ... ...  f4 ... ... ...  f8 ... ... ... ... ... ...  b3
    d1  ...  f1 ... ... ...  f5 ... ... ...  f9 ... ... ... ...  b2 ...
    d2  ... ...  f2 ... ... ...  f6 ... ... ... f10 ... ...  b1 ... ...
    d3  ... ... ...  f3 ... ... ...  f7 ... ... ... f11  b0 ... ... ...
    """
    p = _devices("alphafold", devices)
    if not isinstance(passes, int) or passes < 1:
        raise PlacementError(f"placement alphafold needs passes >= 1, got {passes!r}")
    frozen = [Stage(f"s{k}", (k % p,), forward, ids=(f"f{k}", f"bf{k}", f"wf{k}")) for k in range((passes - 1) * p)]
    last = [Stage(f"s{(passes - 1) * p + i}", (i,), forward, backward, 0, memory,
                  (f"f{(passes - 1) * p + i}", f"b{p - 1 - i}", f"w{p - 1 - i}")) for i in range(p)]
    stages = frozen + last
    return build_stages(f"alphafold-{p}", p, stages, _chain(stages), latency=latency)


def mllm(devices: int = 4, forward: Number = 1, backward: Number = 3, shard: Number = 1, memory: Number = 1,
         latency: Number = 0) -> Placement:
    """Multi-modal LLM: a modality encoder sharded on all devices, the LLM pipeline, a sharded
    head on all devices; backward mirrored.

    d0  fA0  f0 ... ... ... fA1 bA0 ... ... ... ... ... ... ... ... ...  b3  b3  b3 bA1
    d1  fA0 ...  f1 ... ... fA1 bA0 ... ... ... ... ... ...  b2  b2  b2 ... ... ... bA1
    d2  fA0 ... ...  f2 ... fA1 bA0 ... ... ...  b1  b1  b1 ... ... ... ... ... ... bA1
    d3  fA0 ... ... ...  f3 fA1 bA0  b0  b0  b0 ... ... ... ... ... ... ... ... ... bA1
    """
    p = _devices("mllm", devices)
    stages = ([_sharded(p, "fA0", "bA1", shard)] + _pipeline(p, forward, backward, memory)
              + [_sharded(p, "fA1", "bA0", shard)])
    return build_stages(f"mllm-{p}", p, stages, _chain(stages), latency=latency)


def finetune(devices: int = 4, forward: Number = 1, backward: Number = 2, shard: Number = 1, memory: Number = 1,
             latency: Number = 0) -> Placement:
    """Fine-tuning: a frozen embedding on all devices (no backward, no activation kept) before a
    trained pipeline.

    d0  fA0  f0 ... ... ... ... ... ... ... ... ...  b3  b3
    d1  fA0 ...  f1 ... ... ... ... ... ...  b2  b2 ... ...
    d2  fA0 ... ...  f2 ... ... ...  b1  b1 ... ... ... ...
    d3  fA0 ... ... ...  f3  b0  b0 ... ... ... ... ... ...
    """
    p = _devices("finetune", devices)
    stages = [_sharded(p, "fA0", "bA0", shard, backward=False)] + _pipeline(p, forward, backward, memory)
    return build_stages(f"finetune-{p}", p, stages, _chain(stages), latency=latency)


PLACEMENTS: dict[str, tuple[Callable[..., Placement], str]] = {
    "vshape": (vshape, "1F1B pipeline: forwards down the devices, backwards back up"),
    "interleaved": (interleaved, "looped pipeline: several model chunks per device (Megatron interleaved)"),
    "xshape": (xshape, "two opposite pipelines in one micro-batch (Chimera)"),
    "mshape": (mshape, "embedding sharded on all devices around a pipeline"),
    "nnshape": (nnshape, "encoder-decoder with a shared embedding at the start and in between"),
    "kshape": (kshape, "two branches on disjoint devices joined by a block on all devices"),
    "alphafold": (alphafold, "recycling: several forward passes, then one backward"),
    "mllm": (mllm, "multi-modal LLM: sharded encoder, pipeline, sharded head"),
    "finetune": (finetune, "frozen sharded embedding (no backward) before a trained pipeline"),
    "interleaved-zb": (interleaved_zb, "looped pipeline with the backward split into B and W (interleaved zero bubble)"),
    "zb": (zb, "V pipeline with the backward split into B and W (zero bubble)"),
    "zbv": (zbv, "two chunks per device in a V, backward split into B and W (ZB-V)"),
}


def build(name: str, devices: int = 4, infer: bool = False, **costs: Number) -> Placement:
    """A named placement; `costs` are the function's keyword arguments (forward=, backward=, ...)."""
    if name not in PLACEMENTS:
        raise PlacementError(f"unknown placement {name!r}; known: {', '.join(PLACEMENTS)}")
    fn = PLACEMENTS[name][0]
    takes = [k for k in inspect.signature(fn).parameters if k != "devices"]
    unknown = [k for k in costs if k not in takes]
    if unknown:
        raise PlacementError(f"placement {name} takes {', '.join(takes)}; not {', '.join(unknown)}")
    p = fn(devices=devices, **costs)
    return p.inference() if infer else p
