"""Lowering a schedule into one instruction list per rank, and the check that it cannot deadlock.

Torch-free. A rank's program runs its device's tasks in schedule order; around each compute task
it posts the receives of the tensors the task reads from other ranks and, after it, the sends of
the tensors it produced (see dataflow.py for which tensor goes where).

Semantics the executor implements and the check simulates:
- `recv` posts a receive and never blocks; the compute that reads the tensor waits for it;
- `send` posts a send and never blocks (the sender keeps the tensor until it is delivered);
- a compute task waits for its inputs; a task on several devices is a collective, so it also
  waits until every device of its set has reached it.

Receives from one peer are posted in the order that peer sends (moved earlier where needed), so a
transport that matches messages by order (NCCL) pairs them the same way as one matching by tag.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..errors import UsageError
from ..key import Key
from ..placement import Placement
from ..schedule import Schedule, ScheduleError
from ..timing import DeadlockError, check_orders, orders_of
from .dataflow import Dataflow, dataflow

COMPUTE_OPS = ("forward", "backward", "weight")
LOOKAHEAD = 1
TAG_LIMIT = 1 << 28  # data tags stay below; the executor's shape messages use tags above


@dataclass(frozen=True)
class Transfer:
    """One tensor moving from rank `src` to rank `dst`; `tag` is unique per step for the pair."""
    edge: tuple[str, str]
    grad: bool
    micro_batch: int
    src: int
    dst: int
    tag: int

    def __str__(self) -> str:
        what = "grad" if self.grad else "act"
        return f"{what} {self.edge[0]}->{self.edge[1]}#{self.micro_batch}"


@dataclass(frozen=True)
class Instruction:
    """A compute task (`forward`/`backward`/`weight` of `block`) or a `send`/`recv` of a transfer.

    For a send, `block` is the producing block; for a receive, the block that reads the tensor.
    """
    op: str
    block: str
    micro_batch: int
    transfer: Transfer | None = None

    @property
    def is_compute(self) -> bool:
        return self.op in COMPUTE_OPS

    def __str__(self) -> str:
        if self.transfer is None:
            return f"{self.op} {self.block}#{self.micro_batch}"
        t = self.transfer
        peer = f"to {t.dst}" if self.op == "send" else f"from {t.src}"
        return f"{self.op} {t} {peer} (tag {t.tag})"


@dataclass(frozen=True)
class Programs:
    """Per-rank instruction lists for one training (or inference) step."""
    placement: Placement
    micro_batches: int
    ranks: tuple[tuple[Instruction, ...], ...]
    flow: Dataflow = field(repr=False, compare=False)

    def __str__(self) -> str:
        return format_programs(self)

    def compute_orders(self) -> list[list[Key]]:
        return [[(i.block, i.micro_batch) for i in prog if i.is_compute] for prog in self.ranks]

    def check(self) -> Programs:
        """Raise ScheduleError/DeadlockError unless every rank's program can run to its end."""
        check_programs(self)
        return self


def tag_of(flow: Dataflow, edge: tuple[str, str], grad: bool, micro_batch: int) -> int:
    """Distinct for every (edge, direction, micro-batch) of a step."""
    return (micro_batch * len(flow.edges) + flow.edge_index[edge]) * 2 + int(grad)


def _op(p: Placement, block: str) -> str:
    kind = p.by_id[block].kind
    return "forward" if kind == "other" else kind


# ---- lowering ------------------------------------------------------------------------------------
def lower(schedule: Schedule, lookahead: int = LOOKAHEAD) -> Programs:
    """The programs that execute `schedule`'s per-device orders, checked deadlock-free."""
    return lower_orders(schedule.placement, schedule.micro_batches, orders_of(schedule), lookahead).check()


def lower_orders(p: Placement, micro_batches: int, orders: Sequence[Sequence[Key]],
                 lookahead: int = LOOKAHEAD) -> Programs:
    """Programs for given per-device task orders (not checked: call `.check()`).

    A task's receives are posted `lookahead` compute tasks before it, so the transfer overlaps
    the compute in between (a receive posted late costs a round trip on some transports).
    """
    if lookahead < 0:
        raise UsageError(f"lookahead must be >= 0, got {lookahead}")
    check_orders(p, micro_batches, orders)
    flow = dataflow(p)
    if 2 * micro_batches * len(flow.edges) > TAG_LIMIT:
        raise ScheduleError(f"{micro_batches} micro-batches of {len(flow.edges)} edges need more message "
                            f"tags than {TAG_LIMIT}: run fewer micro-batches per step")
    sends = [_sends(flow, r, order) for r, order in enumerate(orders)]
    send_seq = {(t.src, t.dst, t.tag): i for r in range(p.devices) for i, t in enumerate(sends[r])}
    ranks = tuple(_program(flow, r, orders[r], send_seq, lookahead) for r in range(p.devices))
    return Programs(p, micro_batches, ranks, flow)


def _transfers_out(flow: Dataflow, rank: int, block: str, mb: int) -> list[Transfer]:
    return [Transfer(x.edge, x.grad, mb, rank, d, tag_of(flow, x.edge, x.grad, mb))
            for x in flow.outputs(block) for d in flow.destinations(x, rank)]


def _transfers_in(flow: Dataflow, rank: int, block: str, mb: int) -> list[Transfer]:
    out = []
    for x in flow.inputs(block):
        src = flow.source(x, rank)
        if src is not None:
            out.append(Transfer(x.edge, x.grad, mb, src, rank, tag_of(flow, x.edge, x.grad, mb)))
    return out


def _sends(flow: Dataflow, rank: int, order: Sequence[Key]) -> list[Transfer]:
    return [t for b, m in order for t in _transfers_out(flow, rank, b, m)]


def _program(flow: Dataflow, rank: int, order: Sequence[Key], send_seq: dict[tuple[int, int, int], int],
             lookahead: int) -> tuple[Instruction, ...]:
    """Each task's receives `lookahead` tasks before it, earlier where a peer sends in another order."""
    anchor: dict[Transfer, int] = {}
    for i, (b, m) in enumerate(order):
        for t in _transfers_in(flow, rank, b, m):
            anchor[t] = max(0, i - lookahead)
    def sent_at(t: Transfer) -> int:
        return send_seq[(t.src, t.dst, t.tag)]

    by_src: dict[int, list[Transfer]] = defaultdict(list)
    for t in sorted(anchor, key=sent_at):
        by_src[t.src].append(t)
    for ts in by_src.values():  # a later send's receive posted earlier pulls the earlier ones along
        for earlier, later in zip(reversed(ts[:-1]), reversed(ts[1:])):
            anchor[earlier] = min(anchor[earlier], anchor[later])
    posts: dict[int, list[Transfer]] = defaultdict(list)
    for t in sorted(anchor, key=sent_at):
        posts[anchor[t]].append(t)
    prog: list[Instruction] = []
    for i, (b, m) in enumerate(order):
        prog += [Instruction("recv", _reader(flow, t), t.micro_batch, t) for t in posts[i]]
        prog.append(Instruction(_op(flow.placement, b), b, m))
        prog += [Instruction("send", b, m, t) for t in _transfers_out(flow, rank, b, m)]
    return tuple(prog)


def _reader(flow: Dataflow, t: Transfer) -> str:
    """The block whose task reads a transferred tensor."""
    return flow.backward[t.edge[0]] if t.grad else t.edge[1]


# ---- the check -----------------------------------------------------------------------------------
def check_programs(progs: Programs) -> None:
    """Prove the programs complete: every message matched, every input available, no wait cycle.

    Independent of how the lowering ordered things: it rederives what each compute task needs
    from the placement and replays all ranks, advancing any rank whose next instruction can run.
    """
    flow, p = progs.flow, progs.placement
    orders = progs.compute_orders()
    check_orders(p, progs.micro_batches, orders)
    _check_matching(progs)
    _check_pair_order(progs)
    _simulate(progs, flow)


def _check_matching(progs: Programs) -> None:
    sent: dict[tuple[int, int, int], Transfer] = {}
    recv: dict[tuple[int, int, int], Transfer] = {}
    for r, prog in enumerate(progs.ranks):
        for ins in prog:
            t = ins.transfer
            if t is None:
                continue
            mine, table = (t.src, sent) if ins.op == "send" else (t.dst, recv)
            if mine != r:
                raise ScheduleError(f"rank {r}: {ins} belongs to rank {mine}")
            key = (t.src, t.dst, t.tag)
            if key in table:
                raise ScheduleError(f"rank {r}: tag {t.tag} used twice from {t.src} to {t.dst} ({table[key]}, {t})")
            table[key] = t
    for key in sent.keys() ^ recv.keys():
        t = sent.get(key) or recv[key]
        side = f"rank {t.dst} never receives it" if key in sent else f"rank {t.src} never sends it"
        raise ScheduleError(f"unmatched transfer {t} from {t.src} to {t.dst}: {side}")
    for key, t in sent.items():
        if recv[key] != t:
            raise ScheduleError(f"tag {t.tag} from {t.src} to {t.dst} means {t} to the sender, "
                                f"{recv[key]} to the receiver")


def _check_pair_order(progs: Programs) -> None:
    """Per ordered pair of ranks, receives are posted in send order: NCCL ignores tags and matches a
    pair's point-to-point messages in the order they are posted. Names the first mismatch."""
    sent: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    got: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    for prog in progs.ranks:
        for ins in prog:
            if ins.transfer is not None:
                t = ins.transfer
                (sent if ins.op == "send" else got)[(t.src, t.dst)].append(t)
    for (src, dst), ts in sorted(sent.items()):
        for k, (a, b) in enumerate(zip(ts, got[(src, dst)])):
            if a != b:
                raise ScheduleError(f"rank {dst} posts its receives from rank {src} in another order than rank "
                                    f"{src} sends them (an order-matching transport such as NCCL would pair "
                                    f"them wrongly): message {k + 1} sent is {a}, message {k + 1} received is {b}")


def _simulate(progs: Programs, flow: Dataflow) -> None:
    n = len(progs.ranks)
    pc = [0] * n
    done: list[set[Key]] = [set() for _ in range(n)]
    posted: list[set[tuple[int, int]]] = [set() for _ in range(n)]  # (src, tag) posted as receives
    delivered: set[tuple[int, int, int]] = set()
    progress = True
    while progress:
        progress = False
        for r in range(n):
            while pc[r] < len(progs.ranks[r]):
                ins = progs.ranks[r][pc[r]]
                if ins.is_compute and _blocked(progs, flow, r, ins, pc, done, posted, delivered):
                    break
                _run(progs, r, ins, pc, done, posted, delivered)
                progress = True
    if any(pc[r] < len(progs.ranks[r]) for r in range(n)):
        raise DeadlockError("programs deadlock: " + "; ".join(
            f"rank {r} waits at instruction {pc[r]} {progs.ranks[r][pc[r]]} for "
            f"{_blocked(progs, flow, r, progs.ranks[r][pc[r]], pc, done, posted, delivered) or '?'}"
            for r in range(n) if pc[r] < len(progs.ranks[r])))


def _run(progs: Programs, r: int, ins: Instruction, pc: list[int], done: list[set[Key]],
         posted: list[set[tuple[int, int]]], delivered: set[tuple[int, int, int]]) -> None:
    """Advance rank r (and, for a collective task, every device of its set) past `ins`."""
    if ins.is_compute:
        for d in progs.flow.devices(ins.block):
            done[d].add((ins.block, ins.micro_batch))
            pc[d] += 1
        return
    t = ins.transfer
    assert t is not None
    if ins.op == "send":
        delivered.add((t.src, t.dst, t.tag))
    else:
        posted[r].add((t.src, t.tag))
    pc[r] += 1


def _blocked(progs: Programs, flow: Dataflow, r: int, ins: Instruction, pc: list[int],
             done: list[set[Key]], posted: list[set[tuple[int, int]]],
             delivered: set[tuple[int, int, int]]) -> str:
    """What compute instruction `ins` on rank r still waits for; '' when it can run."""
    devs = flow.devices(ins.block)
    absent = [d for d in devs if pc[d] >= len(progs.ranks[d]) or progs.ranks[d][pc[d]] != ins]
    for d in [r] + [d for d in devs if d != r and d not in absent]:
        why = _missing_input(flow, d, ins, done, posted, delivered)
        if why:
            return why if d == r else f"rank {d}, which waits for {why}"
    if absent:
        return "rank " + ", ".join(map(str, absent)) + " to join the collective task"
    return ""


def _missing_input(flow: Dataflow, r: int, ins: Instruction, done: list[set[Key]],
                   posted: list[set[tuple[int, int]]], delivered: set[tuple[int, int, int]]) -> str:
    m = ins.micro_batch
    local = flow.local_predecessor(ins.block)
    if local is not None and (local, m) not in done[r]:
        return f"{local}#{m} on its own rank"
    for x in flow.inputs(ins.block):
        src = flow.source(x, r)
        if src is None:
            if (x.producer, m) not in done[r]:
                return f"{x.producer}#{m} on its own rank"
            continue
        tag = tag_of(flow, x.edge, x.grad, m)
        t = Transfer(x.edge, x.grad, m, src, r, tag)
        if (src, tag) not in posted[r]:
            return f"{t} from rank {src}, whose receive is not posted before it"
        if (src, r, tag) not in delivered:
            return f"{t} from rank {src}"
    return ""


# ---- printing ------------------------------------------------------------------------------------
def format_programs(progs: Programs, ranks: Iterable[int] | None = None) -> str:
    lines = [f"programs of {progs.placement.name}: {progs.micro_batches} micro-batches, "
             f"{len(progs.ranks)} ranks"]
    for r in ranks if ranks is not None else range(len(progs.ranks)):
        prog = progs.ranks[r]
        lines.append(f"rank {r} ({len(prog)} instructions)")
        lines += [f"  {i:4d}  {ins}" for i, ins in enumerate(prog)]
    return "\n".join(lines)
