"""Profiler: measure the blocks of a real PyTorch model into a placement in real units.

Given a placement and one `nn.Module` per forward block, run the blocks of one micro-batch in
dependency order and measure, per block:

- forward and backward time: the fastest of the timed runs after `warmup` runs, in two sweeps over
  all blocks (the faster sweep counts; sweeps more than `SPREAD` apart are warned about), on CPU or CUDA
  (synchronised around each run), with torch's intra-op threads pinned (`threads`, 1 by default,
  as one rank of a job and as `tessel profile`). On a loaded machine runs are slowed, never sped
  up, so the fast end of the distribution is the one that repeats; the fastest counts once a
  quarter of the runs agree with it: `repeats` runs first, and while their lower quartile is
  more than `SPREAD` (10%) above the fastest, more runs (at least 4 x `repeats` and 1 s of them,
  so that a busy spell on the machine passes; at most 1000); a time still that
  spread out is logged as a warning with its figure and listed in `Profile.warnings`. On CPU with
  one thread, the clock is the thread's CPU time (`time.thread_time`): the time the process waited
  for a core on a loaded machine is not counted, only its compute; otherwise wall time; The backward is timed alone, from a fresh forward, with an
  output gradient of the output's shape; where the placement splits a backward into an
  input-gradient block B and a weight-gradient block W, B is the input-gradient pass and W the
  rest of the full backward;
- activation memory: the bytes autograd saves for the backward, counted by
  `torch.autograd.graph.saved_tensors_hooks` over distinct storages, parameters excluded (they
  are not per micro-batch);
- the size of the tensors each block passes on (its output; the gradient back is as large).

The placement written keeps the input's blocks, devices and edges, with durations in
milliseconds and memory in MiB: a forward allocates its activation and the backward that ends
its autograd graph (W when split) releases it, so every device returns to 0. The latency is the
largest message crossing between different device sets divided by the `bandwidth` given, plus
the per-message `alpha`. A block on several devices is timed whole on one device and its time
divided by its device count (ideal tensor parallelism) unless its module is already one shard
(`sharded_modules=True`). The modules are moved to the device and their parameters' `.grad`
hold what the timed backward passes accumulated: profile copies when that matters.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor, nn

from ..errors import UsageError
from ..placement import Placement, PlacementError, make_placement

log = logging.getLogger(__name__)
MIB = 1024 ** 2


@dataclass(frozen=True)
class BlockProfile:
    """Measurements of one forward block (times in ms, sizes in bytes)."""
    block: str
    forward_ms: float
    backward_ms: float
    input_grad_ms: float
    activation_bytes: int
    output_bytes: int


@dataclass(frozen=True)
class Profile:
    """The measurements and the placement built from them."""
    placement: Placement
    blocks: tuple[BlockProfile, ...]
    device: str
    repeats: int
    bandwidth: float | None
    warnings: tuple[str, ...] = ()  # times whose runs stayed spread out (block, pass, spread)

    def table(self) -> tuple[list[str], list[list[object]]]:
        heads = ["block", "forward ms", "backward ms", "input-grad ms", "activation MiB", "output MiB"]
        rows = [[b.block, round(b.forward_ms, 3), round(b.backward_ms, 3), round(b.input_grad_ms, 3),
                 round(b.activation_bytes / MIB, 3), round(b.output_bytes / MIB, 3)] for b in self.blocks]
        return heads, rows


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


SPREAD = 0.10  # largest spread (lower quartile / fastest - 1) accepted without more runs
MORE = 4  # while the spread stays above it: at least MORE x repeats timed runs and
PATIENCE = 1.0  # seconds of them (a busy spell on the machine passes), at most
MOST_RUNS = 1000  # runs


@dataclass(frozen=True)
class Timing:
    """One measured time: the fastest run (ms), the spread (lower quartile / fastest - 1), runs timed."""
    ms: float
    spread: float
    runs: int


def quartiles(xs: Sequence[float]) -> tuple[float, float]:
    """Lower and upper quartiles (linear interpolation; one value: itself twice)."""
    if len(xs) == 1:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def measure_ms(run: Callable[[Any], Any], prepare: Callable[[], Any], device: torch.device,
               warmup: int, repeats: int, spread: float = SPREAD,
               clock: Callable[[], float] = time.perf_counter) -> Timing:
    """Time `run(prepare())` (`prepare` untimed) until a quarter of the runs are within `spread` of
    the fastest, or MORE x `repeats` runs over PATIENCE seconds, or MOST_RUNS runs."""
    times: list[float] = []

    def once() -> float:
        state = prepare()
        _sync(device)
        t0 = clock()
        run(state)
        _sync(device)
        return (clock() - t0) * 1e3

    for _ in range(warmup):
        once()
    started = time.perf_counter()
    while True:
        times.append(once())
        if len(times) < repeats:
            continue
        fastest, low = min(times), quartiles(times)[0]
        width = low / fastest - 1 if fastest > 0 else 0.0
        patient = len(times) >= MORE * repeats and time.perf_counter() - started >= PATIENCE
        if width <= spread or patient or len(times) >= MOST_RUNS:
            return Timing(fastest, width, len(times))


def _tensors(x: Any) -> list[Tensor]:
    if isinstance(x, Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _tensors(y)]
    if isinstance(x, Mapping):
        return [t for y in x.values() for t in _tensors(y)]
    return []


def _as_args(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _detached(args: Sequence[Any], grad: bool) -> tuple[Any, ...]:
    """Fresh leaves for one block's inputs (tensors anywhere in a pytree); floating ones require
    grad when the block gets gradients."""
    def leaf(a: Any) -> Any:
        if not isinstance(a, Tensor):
            return a
        a = a.detach()
        return a.requires_grad_(True) if grad and a.is_floating_point() else a
    return tuple(pytree.tree_map(leaf, list(args)))


def saved_bytes(module: nn.Module, args: Sequence[Any]) -> tuple[Any, int]:
    """Run the forward once; return its output and the bytes autograd saved (distinct storages,
    parameters and buffers excluded)."""
    own = {p.untyped_storage().data_ptr() for p in list(module.parameters()) + list(module.buffers())}
    seen: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in own:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(*args)
    return out, sum(seen.values())


def _output_grads(out: Any) -> tuple[list[Tensor], list[Tensor]]:
    """The differentiable output tensors and a gradient for each (ones for a scalar loss)."""
    outs = [t for t in _tensors(out) if t.requires_grad]
    return outs, [torch.ones_like(t) if t.dim() == 0 else torch.randn_like(t) for t in outs]


@dataclass(frozen=True)
class _Run:
    """One block's measurement setup: its module, its inputs, whether it gets a backward."""
    module: nn.Module
    args: tuple[Any, ...]
    trains: bool
    device: torch.device
    warmup: int
    repeats: int

    @property
    def clock(self) -> Callable[[], float]:
        """CPU time of this thread on CPU with one torch thread (waiting for a core is not compute)."""
        one = self.device.type == "cpu" and torch.get_num_threads() == 1
        return time.thread_time if one else time.perf_counter

    def forward_ms(self) -> Timing:
        with torch.set_grad_enabled(self.trains):
            return measure_ms(lambda a: self.module(*a), lambda: _detached(self.args, self.trains),
                              self.device, self.warmup, self.repeats, clock=self.clock)

    def _fresh(self) -> tuple[tuple[Any, ...], list[Tensor], list[Tensor]]:
        args = _detached(self.args, True)
        outs, grads = _output_grads(self.module(*args))
        return args, outs, grads

    def backward_ms(self) -> Timing:
        return measure_ms(lambda s: torch.autograd.backward(s[1], s[2]), self._fresh,
                          self.device, self.warmup, self.repeats, clock=self.clock)

    def input_grad_ms(self) -> Timing:
        """The input-gradient pass alone (the B of a split backward)."""
        def run(s: tuple[tuple[Any, ...], list[Tensor], list[Tensor]]) -> None:
            leaves = [a for a in pytree.tree_leaves(list(s[0])) if isinstance(a, Tensor) and a.requires_grad]
            if leaves:
                torch.autograd.grad(s[1], leaves, s[2], allow_unused=True)
        return measure_ms(run, self._fresh, self.device, self.warmup, self.repeats, clock=self.clock)


def profile(placement: Placement, modules: Mapping[str, nn.Module],
            inputs: Sequence[Any] | Mapping[str, Sequence[Any]], *, device: str = "cpu",
            warmup: int = 2, repeats: int = 5, bandwidth: float | None = None, alpha: float = 0.0,
            sharded_modules: bool = False, threads: int | None = 1) -> Profile:
    """Measure every forward block's module (and its backward where the placement has one) on
    one micro-batch; return the measurements and the placement in ms and MiB.

    A block's arguments are its forward predecessors' outputs in edge order, then its own
    `inputs`: one tuple given to every block without a forward predecessor, or a mapping from
    block id to extra arguments (a source's data, a sink's targets).
    `bandwidth` in bytes/s and `alpha` in seconds set the latency; without a bandwidth the
    placement's latency stays. `threads`: torch's intra-op threads while measuring (restored after;
    None leaves them as they are).
    """
    if threads is not None and threads < 1:
        raise UsageError(f"threads must be >= 1, got {threads}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _profile(placement, modules, inputs, device, warmup, repeats, bandwidth, alpha, sharded_modules)
    finally:
        torch.set_num_threads(before)


def _profile(placement: Placement, modules: Mapping[str, nn.Module],
             inputs: Sequence[Any] | Mapping[str, Sequence[Any]], device: str, warmup: int, repeats: int,
             bandwidth: float | None, alpha: float, sharded_modules: bool) -> Profile:
    if repeats < 1 or warmup < 0:
        raise UsageError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if bandwidth is not None and not bandwidth > 0:
        raise UsageError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    dev = torch.device(device)
    forwards = [b for b in placement.topo_order if placement.by_id[b].kind in ("forward", "other")]
    missing = [b for b in forwards if b not in modules]
    if missing:
        raise PlacementError(f"no module for block {missing[0]!r} of placement {placement.name!r}")
    grads = _gradient_blocks(placement)
    outputs: dict[str, Any] = {}
    runs: dict[str, _Run] = {}
    sweeps: list[dict[str, dict[str, Timing]]] = [{}, {}]
    measured = []
    for bid in forwards:
        args = _block_args(placement, bid, outputs, inputs, dev)
        runs[bid] = _Run(modules[bid].to(dev), args, bid in grads, dev, warmup, repeats)
        sweeps[0][bid] = _timings(runs[bid], "weight" in grads.get(bid, {}))
        measured.append(_shapes(bid, runs[bid], outputs))
    for bid in forwards:  # a second sweep, minutes apart on a big model: a busy spell rarely hits one block twice
        sweeps[1][bid] = _timings(runs[bid], "weight" in grads.get(bid, {}))
    warnings: list[str] = []
    measured = [_timed(m, sweeps[0][m.block], sweeps[1][m.block], warnings) for m in measured]
    for m in measured:
        log.info("profiled %s: forward %.3f ms, backward %.3f ms, activation %d bytes", m.block,
                 m.forward_ms, m.backward_ms, m.activation_bytes)
    scaled = tuple(_per_device(m, placement, sharded_modules) for m in measured)
    out = _placement_of(placement, scaled, grads, bandwidth, alpha)
    return Profile(out, scaled, str(dev), repeats, bandwidth, tuple(warnings))


def _gradient_blocks(p: Placement) -> dict[str, dict[str, str]]:
    """forward id -> {kind: block id} of the backward and weight blocks that consume its graph."""
    out: dict[str, dict[str, str]] = {}
    for b in p.blocks:
        if b.kind in ("backward", "weight"):
            if b.grad_of is None:
                raise PlacementError(f"block {b.id}: a profiled {b.kind} block needs grad_of (the forward "
                                     "whose graph it consumes)")
            out.setdefault(b.grad_of, {})[b.kind] = b.id
    return out


def _block_args(p: Placement, bid: str, outputs: Mapping[str, Any],
                inputs: Sequence[Any] | Mapping[str, Sequence[Any]], dev: torch.device) -> tuple[Any, ...]:
    preds = [a for a in p.preds[bid] if a in outputs]
    given = inputs.get(bid, ()) if isinstance(inputs, Mapping) else (() if preds else inputs)
    if not preds and not given:
        raise PlacementError(f"block {bid!r} has no forward predecessor and no input was given for it")
    extra = tuple(a.to(dev) if isinstance(a, Tensor) else a for a in _as_args(given))
    return tuple(outputs[a] for a in preds) + extra  # each predecessor's output as one argument, as the runtime


def _timings(run: _Run, split: bool) -> dict[str, Timing]:
    timings = {"forward": run.forward_ms()}
    if run.trains:
        timings["backward"] = run.backward_ms()
        if split:
            timings["input-gradient"] = run.input_grad_ms()
    return timings


def _shapes(bid: str, run: _Run, outputs: dict[str, Any]) -> BlockProfile:
    """The block's activation and output sizes (times filled in by `_timed`); its output feeds its successors."""
    if run.trains:
        out, act = saved_bytes(run.module, _detached(run.args, True))
    else:
        with torch.no_grad():
            out = run.module(*run.args)
        act = 0
    outputs[bid] = _detach_all(out)
    return BlockProfile(bid, 0.0, 0.0, 0.0, act, sum(t.nbytes for t in _tensors(out)))


def _timed(m: BlockProfile, first: Mapping[str, Timing], second: Mapping[str, Timing],
           warnings: list[str]) -> BlockProfile:
    """The faster sweep's time of each pass; a warning with the figure where a sweep's runs stayed
    spread out or the two sweeps disagree by more than SPREAD."""
    ms: dict[str, float] = {}
    for what, a in first.items():
        b = second[what]
        ms[what] = min(a.ms, b.ms)
        apart = max(a.ms, b.ms) / ms[what] - 1 if ms[what] > 0 else 0.0
        if max(a.spread, b.spread) > SPREAD:
            warnings.append(f"block {m.block} {what}: after {max(a.runs, b.runs)} runs the fastest quarter still "
                            f"spreads {max(a.spread, b.spread):.0%} above the fastest, {ms[what]:.3g} ms (more than "
                            f"{SPREAD:.0%}): a loaded machine? its cost is uncertain")
        elif apart > SPREAD:
            warnings.append(f"block {m.block} {what}: two sweeps measured {a.ms:.3g} and {b.ms:.3g} ms, {apart:.0%} "
                            f"apart (more than {SPREAD:.0%}): a loaded machine? its cost is uncertain")
        else:
            continue
        log.warning("%s", warnings[-1])
    return replace(m, forward_ms=ms["forward"], backward_ms=ms.get("backward", 0.0),
                   input_grad_ms=ms.get("input-gradient", 0.0))


def _detach_all(x: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach() if isinstance(t, Tensor) else t, x)


def _per_device(m: BlockProfile, p: Placement, sharded_modules: bool) -> BlockProfile:
    """A whole block measured on one device, spread over its devices (ideal tensor parallelism)."""
    k = len(p.by_id[m.block].devices)
    if sharded_modules or k == 1:
        return m
    return replace(m, forward_ms=m.forward_ms / k, backward_ms=m.backward_ms / k,
                   input_grad_ms=m.input_grad_ms / k, activation_bytes=m.activation_bytes // k)


MIN_MS = 0.001  # a measured time never rounds to a zero duration


def _ms(x: float) -> float:
    return max(round(x, 3), MIN_MS)


def _placement_of(p: Placement, measured: Sequence[BlockProfile], grads: Mapping[str, Mapping[str, str]],
                  bandwidth: float | None, alpha: float) -> Placement:
    by = {m.block: m for m in measured}
    mib = {m.block: round(m.activation_bytes / MIB, 3) for m in measured}
    blocks = []
    for b in p.blocks:
        if b.kind in ("forward", "other"):
            m = by[b.id]
            blocks.append(replace(b, duration=_ms(m.forward_ms), memory=mib[b.id] if b.id in grads else 0))
            continue
        f = b.grad_of
        assert f is not None  # _gradient_blocks required it
        m = by[f]
        split = "weight" in grads[f]
        if b.kind == "weight":
            blocks.append(replace(b, duration=_ms(m.backward_ms - m.input_grad_ms), memory=-mib[f]))
        else:
            blocks.append(replace(b, duration=_ms(m.input_grad_ms if split else m.backward_ms),
                                  memory=0 if split else -mib[f]))
    latency = p.latency if bandwidth is None else _latency_ms(p, by, bandwidth, alpha)
    return make_placement(p.name, p.devices, blocks, p.edges, latency)


def _latency_ms(p: Placement, by: Mapping[str, BlockProfile], bandwidth: float, alpha: float) -> float:
    """The largest message over an edge between different device sets: bytes / bandwidth + alpha."""
    def message(a: str, b: str) -> int:
        fwd = a if a in by else p.by_id[b].grad_of or p.by_id[a].grad_of
        return by[fwd].output_bytes if fwd is not None and fwd in by else 0
    sizes = [message(a, b) for a, b in p.edges if set(p.by_id[a].devices) != set(p.by_id[b].devices)]
    if not sizes:
        return 0.0
    return round((max(sizes) / bandwidth + alpha) * 1e3, 6)


def profile_modules(modules: Mapping[str, nn.Module] | Sequence[nn.Module], inputs: Sequence[Any], *,
                    devices: int | None = None, split_weight: bool = False, name: str = "chain",
                    layout: str = "loop", **options: Any) -> Profile:
    """Profile any model cut into a chain of blocks (tessel.runtime.split gives them), placed one
    block per device (block i on device i mod `devices`; default one device each).

    `inputs` are the first block's arguments for one micro-batch; every other block reads its
    predecessor's output. With `split_weight`, each backward is measured as an input-gradient
    block B and a weight-gradient block W. `options` go to `profile` (device, warmup, repeats,
    bandwidth, alpha, threads).
    """
    from ..builder import Stage, build_stages
    named = dict(modules) if isinstance(modules, Mapping) else {f"s{i}": m for i, m in enumerate(modules)}
    if not named:
        raise PlacementError("no blocks to profile")
    n = devices or len(named)
    if not 1 <= n <= len(named):
        raise PlacementError(f"{len(named)} blocks cannot use {n} devices (every device needs a block): "
                             f"use at most {len(named)} devices or cut the model into more blocks")
    if layout not in ("loop", "v"):
        raise PlacementError(f"layout must be 'loop' or 'v', got {layout!r}")
    if layout == "v" and len(named) != 2 * n:
        raise PlacementError(f"the 'v' layout puts two blocks on each device: {len(named)} blocks need "
                             f"{len(named) // 2} devices, not {n}" if len(named) % 2 == 0 else
                             f"the 'v' layout puts two blocks on each device; {len(named)} blocks is odd")
    device_of = [i % n if layout == "loop" or i < n else 2 * n - 1 - i for i in range(len(named))]
    trained = {b: any(p.requires_grad for p in m.parameters()) or i > 0 for i, (b, m) in enumerate(named.items())}
    stages = [Stage(b, (device_of[i],), 1, 1 if trained[b] else 0, 1 if split_weight and trained[b] else 0,
                    1, (b, f"{b}.b", f"{b}.w")) for i, b in enumerate(named)]
    edges = [(a.name, c.name) for a, c in zip(stages, stages[1:])]
    placement = build_stages(f"{name}-{n}" + ("-v" if layout == "v" else ""), n, stages, edges, split_weight=split_weight)
    return profile(placement, named, tuple(inputs), **options)
