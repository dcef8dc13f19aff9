"""The baselines: hand-made schedules and a greedy list scheduler.

Each baseline is a `fits(placement)` that raises BaselineError saying why it does not apply, and
a `starts(placement, micro_batches, limit)` that returns every task's start time.

How far they reach:
- `gpipe`: all forwards, then all backwards: each device runs its blocks in data order, each
  block over every micro-batch in turn (per-device orders timed by tessel.timing). Any placement
  whose forward blocks never wait on backward ones, inference placements too. Memory: N
  micro-batches' activations.
- `1f1b`: the greedy walk (backward first, lowest micro-batch) with each device's activations
  capped at its 1F1B depth: the number of memory-keeping forward blocks a micro-batch still
  passes from that device's first one on (p - i for stage i of a plain pipeline). On plain
  pipelines this is 1F1B exactly; blocks on several devices (M, NN, mllm, finetune shapes) run
  synchronised on all their devices at once: the paper's "1F1B+". Any training placement whose
  forward blocks never wait on backward ones.
- `interleaved`: Megatron's interleaved 1F1B orders on a looped pipeline (v >= 2 chunks per
  device); micro-batches a multiple of the device count, as Megatron requires. On a split
  backward (`interleaved-zb`) each W runs right after its B.
- `interleaved-zb-h1`: ZB-H1's ideas on the split looped pipeline (`interleaved-zb`): a warm-up
  of (v - 1)p + p - r - 1 forwards on device r and device r keeping r weight passes back for its
  cool-down (the schedule torch's ScheduleInterleavedZeroBubble runs, built here from the
  placement). Memory: v p chunk activations per device; micro-batches a multiple of p.
- `chimera`: two opposite pipelines (xshape), Chimera's (Li & Hoefler, SC'21) orders: units of
  p/2 micro-batches (p pipeline halves, p/2 per direction); in a unit each pipeline runs 1F1B and
  each device interleaves its two stages by their stand-alone times (both pipelines' forwards in
  the start-up, then 1F1B pairs, then both pipelines' backwards). Units are directly
  concatenated: unit k starts k units' device work later, so its forwards fill the previous
  unit's cool-down bubbles. Memory: p/2+1 .. p activations per device.
- `zb-h1`: zero-bubble H1 orders on a pipeline whose backwards are split into B and W: 1F1B
  warm-up, then F B per step with stage i keeping i weight passes back to fill the cool-down
  (peak memory p on every stage, 1F1B's peak).
- `zb-v-hand`: ZB-V's published hand-made schedule (tessel.baselines.zbv_hand; torch's
  ScheduleZBVZeroBubble runs it too). Memory: 2p chunk activations per device, 1F1B's.
- `dualpipev`: DeepSeek's DualPipeV on the V (`zbv`): each overlapped F&B pair run back to back
  (tessel.baselines.dualpipe); micro-batches at least the V's 2p stages. Memory: 2p + 1 chunk
  activations per device.
- `v-mem`: a memory-controlled V (Qi et al., "Pipeline Parallelism with Controllable Memory"; tessel.
  baselines.vmem) on `zbv`: one V block per micro-batch repeated at a fixed interval, a grid of
  gaps inside the block and ZB-V's warm-up cut to the limit, the W passes placed as the orders
  are timed (tessel.baselines.wfill); the shortest block that fits. Limits from 4 chunk
  activations per device up (measured at p = 4 and 6, where V-Min's are 4 and 6), 1F1B's 2p
  included; refused below.
- `torch-zbv`, `torch-dualpipev`, `torch-interleaved-1f1b`, `torch-interleaved-zb`: the orders
  of torch.distributed.pipelining's own generators (tessel.baselines.torch_orders) on the
  placement of their shape (`zbv`; `interleaved`, whose split form `interleaved-zb` the last one
  needs); only where torch is installed.
- `greedy`: any placement, any memory limit a micro-batch fits in (see tessel.baselines.engine).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..key import Key
from ..placement import Number, Placement, make_placement
from ..schedule import normalise_limit
from ..timing import earliest_starts
from .dualpipe import dualpipev_orders
from .engine import Pool, Pools, backward_first, list_schedule, memory_need, one_group, reservations
from .interleaved import interleaved, interleaved_fits, interleaved_zb, interleaved_zb_fits
from .shapes import FORWARD_PHASE, BaselineError, Chain, chain, check_phases, components, one_f_one_b, single_chain
from .torch_orders import TORCH, torch_chain, torch_orders
from .vmem import vmem_starts
from .zbv_hand import zbv_hand_orders
from .zero_bubble import Plan, zero_bubble_starts

Limit = Number | Sequence[Number] | None
Starts = dict[Key, Number]


@dataclass(frozen=True)
class Baseline:
    fits: Callable[[Placement], None]
    starts: Callable[[Placement, int, Limit], Starts]
    # micro-batches one period of the steady state may advance by, tried in turn; () for none
    shifts: Callable[[Placement], tuple[int, ...]] = lambda p: ()
    # raced by the search by default; off for torch's generators (an optional dependency whose
    # first import takes seconds): the peers bench races them on purpose
    raced: bool = True
    # built in time linear in the tasks on this placement (per-device orders in closed form,
    # timed by tessel.timing): the search races it at any size, its fallback when time runs out
    linear: Callable[[Placement], bool] = lambda p: False
    # its per-device orders before timing, where they are in closed form (else None): memory
    # depends on them alone, so a race refuses one over the limit without building it
    orders: Callable[[Placement, int], list[list[Key]] | None] = lambda p, n: None
    # a search does not race it when one of these fits the limit (they race first): it is built for
    # the memory they cannot meet, and costs many of their builds (v-mem: a grid of timings, 5 CPU
    # seconds at p = 16, m = 32; never the winner where ZB-V's order fits, 124 rows of p = 4..8)
    spared_by: tuple[str, ...] = ()


def _is_forward(p: Placement, b: str) -> bool:
    return p.by_id[b].kind in FORWARD_PHASE


def _orders_by(p: Placement, n: int, key: Callable[[str, int], tuple[Any, ...]]) -> list[list[Key]]:
    """Per-device orders that all follow one global order: they can never wait on each other."""
    tasks = sorted(((b.id, m) for b in p.blocks for m in range(n)), key=lambda t: key(*t))
    orders: list[list[Key]] = [[] for _ in range(p.devices)]
    for b, m in tasks:
        for d in p.by_id[b].devices:
            orders[d].append((b, m))
    return orders


# ---- gpipe ---------------------------------------------------------------------------------
def _gpipe_fits(p: Placement) -> None:
    check_phases(p, "gpipe")


def _gpipe(p: Placement, n: int, limit: Limit) -> Starts:
    return earliest_starts(p, n, _gpipe_orders(p, n))


def _gpipe_orders(p: Placement, n: int) -> list[list[Key]]:
    """_orders_by's (forwards first, data order, micro-batch) without sorting every task: each
    device's blocks sorted, each over every micro-batch in turn (the race checks 524k at once)."""
    rank = {b: i for i, b in enumerate(p.topo_order)}
    order = sorted(rank, key=lambda b: (not _is_forward(p, b), rank[b]))
    orders: list[list[Key]] = [[] for _ in range(p.devices)]
    for b in order:
        tasks = [(b, m) for m in range(n)]
        for d in p.by_id[b].devices:
            orders[d].extend(tasks)
    return orders


# ---- 1f1b: the greedy walk with 1F1B depths; chimera: its units ---------------------------
def _training_fits(p: Placement, method: str) -> None:
    if not p.is_training:
        raise BaselineError(f"{method} interleaves forwards and backwards; placement {p.name} has no "
                            "backward blocks (use gpipe or greedy)")
    check_phases(p, method)


def depths(p: Placement, blocks: Sequence[str]) -> dict[int, int]:
    """Per device: the most memory-keeping forward blocks a micro-batch passes from one on it on."""
    keep = {b for b in blocks if _is_forward(p, b) and p.by_id[b].memory > 0}
    inside = set(blocks)
    ahead: dict[str, int] = {}
    for x in reversed(p.topo_order):
        if x in inside:
            nxt = [ahead[s] for s in p.succs[x] if s in inside and _is_forward(p, s)]
            ahead[x] = (x in keep) + max(nxt, default=0)
    out: dict[int, int] = {}
    for b in keep:
        for d in p.by_id[b].devices:
            out[d] = max(out.get(d, 0), ahead[b])
    return out


def _depth_pools(p: Placement, n: int, groups: Sequence[Sequence[str]]) -> Pools:
    """Caps of `depth` micro-batches in flight per pool (plus what finished ones leave behind)."""
    group = {b: g for g, ids in enumerate(groups) for b in ids}
    reserve, leave = reservations(p, group)
    caps: dict[Pool, Number] = {}
    for g, ids in enumerate(groups):
        for d, depth in depths(p, ids).items():
            caps[(d, g)] = depth * reserve[(d, g)] + (n - 1) * leave[(d, g)]
    return Pools(group, caps)


def _1f1b(p: Placement, n: int, limit: Limit) -> Starts:
    plain = _plain_pipeline(p)
    if plain is not None:  # the closed form: linear in tasks (the walk is quadratic at 4,096 devices)
        return _pipeline_starts(p, plain, n)
    return list_schedule(p, n, backward_first(p), _depth_pools(p, n, [[b.id for b in p.blocks]]))


def _plain_pipeline(p: Placement) -> Chain | None:
    """The chain of a plain pipeline (one stage per device or per tensor-parallel group, groups
    disjoint, each forward keeping memory, no weight blocks), where the greedy walk with 1F1B
    depths is 1F1B's per-device orders exactly; else None. A group acts as one device: the chain
    is found on the placement with each block on its group's first device."""
    comps = components(p)
    if len(comps) != 1 or not p.is_training:
        return None
    groups = {b.devices for b in p.blocks}
    if sum(len(g) for g in groups) != len({d for g in groups for d in g}):
        return None  # groups overlap
    one = p if all(len(g) == 1 for g in groups) else \
        make_placement(p.name, p.devices, [replace(b, devices=b.devices[:1]) for b in p.blocks], p.edges, p.latency)
    try:
        c = chain(one, comps[0])
    except BaselineError:
        return None
    devs = c.devices(one)
    if c.weight or not c.backward or len(set(devs)) != len(devs) or \
            not all(p.by_id[f].memory > 0 for f in c.forward):
        return None
    return c


def _pipeline_starts(p: Placement, c: Chain, n: int) -> Starts:
    return earliest_starts(p, n, _pipeline_orders(p, c, n))


def _pipeline_orders(p: Placement, c: Chain, n: int) -> list[list[Key]]:
    orders: list[list[Key]] = [[] for _ in range(p.devices)]
    for s, f in enumerate(c.forward):
        order = _stage_1f1b(c, s, n)
        for d in p.by_id[f].devices:
            orders[d] = order
    return orders


def _1f1b_orders(p: Placement, n: int) -> list[list[Key]] | None:
    plain = _plain_pipeline(p)
    return None if plain is None else _pipeline_orders(p, plain, n)


def _chimera_chains(p: Placement) -> list[Chain]:
    comps = components(p)
    if len(comps) != 2:
        raise BaselineError(f"chimera needs two opposite pipelines (xshape); placement {p.name} has "
                            f"{len(comps)} separate part(s)")
    try:
        chains = [chain(p, ids) for ids in comps]
    except BaselineError as e:
        raise BaselineError(f"chimera needs two opposite pipelines (xshape): {e}") from None
    down, up = (c.devices(p) for c in chains)
    if sorted(down) != list(range(p.devices)) or up != down[::-1] or not all(c.backward for c in chains):
        raise BaselineError("chimera needs two pipelines over all devices in opposite directions, "
                            "each with its backward")
    return chains


def _chimera_fits(p: Placement) -> None:
    _chimera_chains(p)


def _part(p: Placement, ids: Sequence[str]) -> Placement:
    keep = set(ids)
    return make_placement(p.name, p.devices, [b for b in p.blocks if b.id in keep],
                          [e for e in p.edges if e[0] in keep], p.latency)


def _stage_1f1b(c: Chain, stage: int, micro_batches: int) -> list[Key]:
    """Stage `stage` of the chain as a 1F1B pipeline over `micro_batches`: warm-up, F B pairs, cool-down."""
    depth = len(c.forward)
    warm = min(depth - 1 - stage, micro_batches)
    fwd = [(c.forward[stage], m) for m in range(micro_batches)]
    bwd = [(c.backward[depth - 1 - stage], m) for m in range(micro_batches)]
    return one_f_one_b(fwd, bwd, warm)


def _unit_times(p: Placement, c: Chain, micro_batches: int) -> Starts:
    """One pipeline's stand-alone 1F1B start times over one unit's micro-batches."""
    part = _part(p, c.forward + c.backward)
    orders: list[list[Key]] = [[] for _ in range(p.devices)]
    for s, d in enumerate(c.devices(p)):
        orders[d] = _stage_1f1b(c, s, micro_batches)
    return earliest_starts(part, micro_batches, orders)


def _chimera(p: Placement, n: int, limit: Limit) -> Starts:
    """Units of p/2 micro-batches (p pipeline halves); each device merges its two stages' 1F1B
    orders by their stand-alone times (ties: forwards, then the older micro-batch); unit k runs
    k units' device work later, so its start-up forwards fill the previous unit's cool-down
    (direct concatenation). One global key orders every device, and it grows along every edge:
    no deadlock."""
    chains = _chimera_chains(p)
    unit = max(1, p.devices // 2)
    work = max(sum(b.duration for b in p.blocks_on(d)) for d in range(p.devices))
    key: dict[Key, tuple[Number, bool, int, int]] = {}
    for first in range(0, n, unit):
        size = min(unit, n - first)
        for g, c in enumerate(chains):
            for (b, m), t in _unit_times(p, c, size).items():
                key[(b, first + m)] = (t + first * work, not _is_forward(p, b), m, g)
    return earliest_starts(p, n, _orders_by(p, n, lambda b, m: key[(b, m)]))


# ---- greedy ---------------------------------------------------------------------------------
def _greedy(p: Placement, n: int, limit: Limit) -> Starts:
    group = one_group(p)
    lim = normalise_limit(limit, p.devices)
    caps = {}
    if lim is not None:
        for (d, g), need in memory_need(p, n, group).items():
            if need > lim[d]:
                raise BaselineError(f"greedy: device {d} needs memory {need:g} to run every micro-batch "
                                    f"(its blocks' allocations), over its limit {lim[d]:g}")
            caps[(d, g)] = lim[d]
    return list_schedule(p, n, backward_first(p), Pools(group, caps))


# ---- zb-h1 ----------------------------------------------------------------------------------
def _split_chain(p: Placement, method: str = "zb-h1") -> Chain:
    c = single_chain(p, method)
    if sorted(c.devices(p)) != list(range(p.devices)):
        raise BaselineError(f"{method} needs a pipeline with one stage on each device")
    if not c.backward or len(c.weight) != len(c.backward):
        raise BaselineError(f"{method} needs every backward split into B and W (placement zb)")
    return c


def _zb_h1_fits(p: Placement) -> None:
    _split_chain(p)


def _zb_h1(p: Placement, n: int, limit: Limit) -> Starts:
    c = _split_chain(p)
    k_dev = p.devices
    orders: list[list[Key]] = [[] for _ in range(k_dev)]
    for i, f in enumerate(c.forward):
        b = c.backward[k_dev - 1 - i]
        w = c.weight[b]
        warm = min(k_dev - 1 - i, n)
        order: list[Key] = []
        held: list[int] = []
        for key in one_f_one_b([(f, m) for m in range(n)], [(b, m) for m in range(n)], warm):
            order.append(key)
            if key[0] != b:
                continue
            held.append(key[1])
            if len(held) > i:  # stage i keeps i weight passes back for the cool-down's bubbles
                order.append((w, held.pop(0)))
        orders[c.device(p, f)] = order + [(w, j) for j in held]
    return earliest_starts(p, n, orders)


# ---- zb-h2, zb-v and its memory variants: the zero-bubble walk under a memory budget ------------
def _v_chain(p: Placement, method: str) -> Chain:
    c = single_chain(p, method)
    k = p.devices
    if c.devices(p) != list(range(k)) + list(range(k - 1, -1, -1)):
        raise BaselineError(f"{method} needs a V: two chunks per device, chunk 0 on devices 0..p-1 and "
                            "chunk 1 back on p-1..0 (placement zbv)")
    if not c.backward or len(c.weight) != len(c.backward):
        raise BaselineError(f"{method} needs every backward split into B and W (placement zbv)")
    return c


def _budget_caps(p: Placement, limit: Limit, per_device: float) -> list[Number]:
    """`per_device` micro-batches' activations on each device (at least one), capped by the limit."""
    lim = normalise_limit(limit, p.devices)
    caps: list[Number] = []
    for d in range(p.devices):
        one = sum(max(b.memory, 0) for b in p.blocks_on(d))
        cap = max(one, per_device * one)
        caps.append(cap if lim is None else min(cap, lim[d]))
    return caps


def _zero_bubble(chain: Callable[[Placement, str], Chain], budget: Callable[[int], float],
                 method: str) -> Baseline:
    def fits(p: Placement) -> None:
        chain(p, method)

    def starts(p: Placement, n: int, limit: Limit) -> Starts:
        try:
            return zero_bubble_starts(p, n, Plan(chain(p, method), _budget_caps(p, limit, budget(p.devices))))
        except BaselineError as e:
            raise BaselineError(f"{method}: {e}") from None
    return Baseline(fits, starts, _few)


def _zbv_hand(p: Placement, n: int, limit: Limit) -> Starts:
    return earliest_starts(p, n, zbv_hand_orders(p, _v_chain(p, "zb-v-hand"), n))


def _vmem(p: Placement, n: int, limit: Limit) -> Starts:
    lim = normalise_limit(limit, p.devices)
    try:
        return vmem_starts(p, _v_chain(p, "v-mem"), n, lim)
    except BaselineError as e:
        raise BaselineError(f"v-mem: {e} (memory {max(lim) if lim else 0:g} per device)") from None


def _dualpipev_fits(p: Placement, method: str = "dualpipev") -> None:
    _v_chain(p, method)


def _dualpipev(p: Placement, n: int, limit: Limit) -> Starts:
    return earliest_starts(p, n, dualpipev_orders(p, _v_chain(p, "dualpipev"), n))


def _torch(method: str) -> Baseline:
    def fits(p: Placement) -> None:
        torch_chain(p, method)

    def starts(p: Placement, n: int, limit: Limit) -> Starts:
        return earliest_starts(p, n, torch_orders(p, method, n))
    return Baseline(fits, starts, lambda p: (1, 2, 3, 4, p.devices), raced=False)


def _few(p: Placement) -> tuple[int, ...]:
    return (1, 2, 3, 4)


def _always(p: Placement) -> bool:
    return True


REGISTRY: dict[str, Baseline] = {
    "gpipe": Baseline(_gpipe_fits, _gpipe, linear=_always, orders=_gpipe_orders),
    "1f1b": Baseline(lambda p: _training_fits(p, "1f1b"), _1f1b, _few,
                     linear=lambda p: _plain_pipeline(p) is not None, orders=_1f1b_orders),
    "interleaved": Baseline(interleaved_fits, interleaved, lambda p: (p.devices,), linear=_always),
    "chimera": Baseline(_chimera_fits, _chimera, lambda p: (math.ceil(p.devices / 2),), linear=_always),
    "zb-h1": Baseline(_zb_h1_fits, _zb_h1, _few, linear=_always),
    # memory in micro-batches of activations per device; 1F1B's is p
    "zb-h2": _zero_bubble(_split_chain, lambda k: 2 * k - 1, "zb-h2"),
    "zb-v": _zero_bubble(_v_chain, lambda k: k, "zb-v"),
    "zb-v-half": _zero_bubble(_v_chain, lambda k: k / 2 + 1, "zb-v-half"),
    "zb-v-min": _zero_bubble(_v_chain, lambda k: k / 3 + 1, "zb-v-min"),
    "zb-v-hand": Baseline(lambda p: _dualpipev_fits(p, "zb-v-hand"), _zbv_hand, _few, linear=_always),
    "dualpipev": Baseline(_dualpipev_fits, _dualpipev, _few, linear=_always),
    **{name: _torch(name) for name in TORCH},  # torch's own generators (tessel.baselines.torch_orders)
    "greedy": Baseline(lambda p: None, _greedy, _few),
    # after greedy: charts give a baseline its colour by this order (tessel.viz.compare), so a new
    # one takes the next colour and leaves the others theirs (the race still runs greedy last)
    "interleaved-zb-h1": Baseline(interleaved_zb_fits, interleaved_zb, lambda p: (p.devices,)),
    # a grid of blocks timed: linear in the tasks, but not cheap enough to race at any size; no
    # repetend (its unroll shifts starts by a fractional period, and the float dust of a shifted
    # allocation can land a hair before the release it follows: over the limit by rule 4)
    "v-mem": Baseline(lambda p: _dualpipev_fits(p, "v-mem"), _vmem, spared_by=("zb-v-hand", "dualpipev")),
}
