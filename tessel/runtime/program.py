"""Lowering a schedule into one instruction list per rank, and the check that it cannot deadlock.

Torch-free. A rank's program runs its device's tasks in schedule order; around each compute task
it posts the receives of the tensors the task reads from other ranks and, after it, the sends of
the tensors it produced (see dataflow.py for which tensor goes where).

Semantics the executor implements and the check simulates:
- `recv` posts a receive and never blocks; the compute that reads the tensor waits for it;
- `send` may block until the peer has posted the matching receive: gloo's sends return at once,
  but NCCL's may wait for their receive (a large message has nowhere else to go), so the check
  assumes the worse of the two and a program passes on both;
- a compute task waits for its inputs; a task on several devices is a collective, so it also
  waits until every device of its set has reached it.

Receives from one peer are posted in the order that peer sends (moved earlier where needed), so a
transport that matches messages by order (NCCL) pairs them the same way as one matching by tag;
a receive whose send would wait for it in a cycle of ranks is posted earlier too (`lower_orders`).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

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
    the compute in between (a receive posted late costs a round trip on some transports), and
    earlier where a send would otherwise wait for it in a cycle of ranks: NCCL's sends may block
    until their receive is posted, and 1F1B's steady state, where two neighbours each send before
    posting the receive of what the other sends, then hangs (torch batches such pairs instead).
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

    def build(pulled: dict[Transfer, int]) -> Programs:
        ranks = tuple(_program(flow, r, orders[r], send_seq, lookahead, pulled) for r in range(p.devices))
        return Programs(p, micro_batches, ranks, flow)

    progs = build({})
    pulled: dict[Transfer, int] = {}
    _replay(progs, pulled)
    return build(pulled) if pulled else progs


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
             lookahead: int, pulled: dict[Transfer, int]) -> tuple[Instruction, ...]:
    """Each task's receives `lookahead` tasks before it, earlier where a peer sends in another order
    or where `pulled` says (before that compute task)."""
    anchor: dict[Transfer, int] = {}
    for i, (b, m) in enumerate(order):
        for t in _transfers_in(flow, rank, b, m):
            anchor[t] = min(max(0, i - lookahead), pulled.get(t, i))
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
    try:
        _simulate(shape_pass(progs), flow)
    except DeadlockError as e:
        raise DeadlockError(f"the shape pass (micro-batch 0's forwards) deadlocks: {e}") from None


def shape_pass(progs: Programs) -> Programs:
    """What the executor's shape pass runs before a first step: micro-batch 0's forward tasks and
    their activations' messages (a description of each), in program order."""
    ranks = tuple(tuple(i for i in prog if i.micro_batch == 0 and i.op not in ("backward", "weight")
                        and not (i.transfer is not None and i.transfer.grad)) for prog in progs.ranks)
    return replace(progs, ranks=ranks)


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


def pair_sequences(progs: Programs) -> tuple[dict[tuple[int, int], list[Transfer]], dict[tuple[int, int], list[Transfer]]]:
    """Each ordered pair's sends (as the sender posts them) and receives (as the receiver posts them)."""
    sent: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    got: dict[tuple[int, int], list[Transfer]] = defaultdict(list)
    for prog in progs.ranks:
        for ins in prog:
            if ins.transfer is not None:
                t = ins.transfer
                (sent if ins.op == "send" else got)[(t.src, t.dst)].append(t)
    return sent, got


def _check_pair_order(progs: Programs) -> None:
    """Per ordered pair of ranks, receives are posted in send order: NCCL ignores tags and matches a
    pair's point-to-point messages in the order they are posted. Names the first mismatch."""
    sent, got = pair_sequences(progs)
    for (src, dst), ts in sorted(sent.items()):
        for k, (a, b) in enumerate(zip(ts, got[(src, dst)])):
            if a != b:
                raise ScheduleError(f"rank {dst} posts its receives from rank {src} in another order than rank "
                                    f"{src} sends them (an order-matching transport such as NCCL would pair "
                                    f"them wrongly): message {k + 1} sent is {a}, message {k + 1} received is {b}")


@dataclass
class _State:
    """Where a replay of the programs stands: each rank's next instruction, how many compute tasks
    it ran and which, the receives each has posted ((src, tag)), the messages delivered ((src, dst, tag))."""
    pc: list[int]
    ran: list[int]  # compute tasks run
    done: list[set[Key]]
    posted: list[set[tuple[int, int]]]
    delivered: set[tuple[int, int, int]] = field(default_factory=set)


def _replay(progs: Programs, pulls: dict[Transfer, int] | None = None) -> _State:
    """Advance every rank as far as it can go (the result does not depend on the order: every
    condition a rank waits for only ever becomes true).

    With `pulls`, whenever no rank can go on, each send waiting for a receive not posted yet has
    it posted at once, recorded as the compute-task index its receiver has reached (`_program`
    posts it before that task): a receive posted earlier only lets more run, so the programs
    rebuilt with these pulls get at least as far, and no rank waits on a send in a cycle."""
    n = len(progs.ranks)
    st = _State([0] * n, [0] * n, [set() for _ in range(n)], [set() for _ in range(n)])
    progress = True
    while progress:
        progress = False
        for r in range(n):
            while st.pc[r] < len(progs.ranks[r]):
                ins = progs.ranks[r][st.pc[r]]
                if _waits_for(progs, st, r, ins)[0]:
                    break
                _run(progs, r, ins, st)
                progress = True
        if not progress and pulls is not None:
            blocked = [prog[st.pc[r]] for r, prog in enumerate(progs.ranks) if st.pc[r] < len(prog)]
            for ins in [i for i in blocked if i.op == "send" and _send_blocked(st, i)]:
                _pull(progs, st, ins, pulls)
                progress = True
    return st


def _pull(progs: Programs, st: _State, send: Instruction, pulls: dict[Transfer, int]) -> None:
    """Post the receive `send` waits for where its receiver stands: before the compute task it is
    at, or, past a task (at its sends), before that task."""
    t = send.transfer
    assert t is not None
    d = t.dst
    at_compute = st.pc[d] < len(progs.ranks[d]) and progs.ranks[d][st.pc[d]].is_compute
    pulls[t] = st.ran[d] if at_compute else max(st.ran[d] - 1, 0)
    st.posted[d].add((t.src, t.tag))


def _simulate(progs: Programs, flow: Dataflow) -> None:
    st = _replay(progs)
    stuck = [r for r in range(len(progs.ranks)) if st.pc[r] < len(progs.ranks[r])]
    if not stuck:
        return
    waits = {r: _waits_for(progs, st, r, progs.ranks[r][st.pc[r]]) for r in stuck}
    cycle = _cycle({r: w[1] for r, w in waits.items()})
    shown = cycle or stuck
    head = ("programs deadlock: " if not cycle else
            "programs deadlock in a wait cycle " + " -> ".join(f"rank {r}" for r in cycle + cycle[:1]) + ": ")
    more = len(stuck) - len(shown)
    raise DeadlockError(head + "; ".join(
        f"rank {r} waits at instruction {st.pc[r]} {progs.ranks[r][st.pc[r]]} for {waits[r][0]}" for r in shown)
        + (f" ({more} more rank{'s' if more > 1 else ''} wait behind them)" if more else ""))


def _cycle(on: dict[int, int | None]) -> list[int]:
    """A cycle in the wait-for relation (rank -> the rank it waits on), or []."""
    for start in sorted(on):
        path: list[int] = []
        r: int | None = start
        while r is not None and r in on and r not in path:
            path.append(r)
            r = on[r]
        if r is not None and r in path:
            return path[path.index(r):]
    return []


def _run(progs: Programs, r: int, ins: Instruction, st: _State) -> None:
    """Advance rank r (and, for a collective task, every device of its set) past `ins`."""
    if ins.is_compute:
        for d in progs.flow.devices(ins.block):
            st.done[d].add((ins.block, ins.micro_batch))
            st.pc[d] += 1
            st.ran[d] += 1
        return
    t = ins.transfer
    assert t is not None
    if ins.op == "send":
        st.delivered.add((t.src, t.dst, t.tag))
    else:
        st.posted[r].add((t.src, t.tag))
    st.pc[r] += 1


def _send_blocked(st: _State, ins: Instruction) -> bool:
    t = ins.transfer
    assert t is not None
    return (t.src, t.tag) not in st.posted[t.dst]


def _waits_for(progs: Programs, st: _State, r: int, ins: Instruction) -> tuple[str, int | None]:
    """What instruction `ins` on rank r still waits for ('' when it can run), and on which rank
    (None when on none: its own program is wrong)."""
    if ins.op == "recv":
        return "", None
    if ins.op == "send":
        t = ins.transfer
        assert t is not None
        if _send_blocked(st, ins):
            return f"rank {t.dst} to post its receive (a send may wait for it, as NCCL's does)", t.dst
        return "", None
    flow = progs.flow
    devs = flow.devices(ins.block)
    absent = [d for d in devs if st.pc[d] >= len(progs.ranks[d]) or progs.ranks[d][st.pc[d]] != ins]
    for d in [r] + [d for d in devs if d != r and d not in absent]:
        why, on = _missing_input(flow, d, ins, st)
        if why:
            return (why, on) if d == r else (f"rank {d}, which waits for {why}", on if on is not None else d)
    if absent:
        return "rank " + ", ".join(map(str, absent)) + " to join the collective task", absent[0]
    return "", None


def _missing_input(flow: Dataflow, r: int, ins: Instruction, st: _State) -> tuple[str, int | None]:
    m = ins.micro_batch
    local = flow.local_predecessor(ins.block)
    if local is not None and (local, m) not in st.done[r]:
        return f"{local}#{m} on its own rank", None
    for x in flow.inputs(ins.block):
        src = flow.source(x, r)
        if src is None:
            if (x.producer, m) not in st.done[r]:
                return f"{x.producer}#{m} on its own rank", None
            continue
        tag = tag_of(flow, x.edge, x.grad, m)
        t = Transfer(x.edge, x.grad, m, src, r, tag)
        if (src, tag) not in st.posted[r]:
            return f"{t} from rank {src}, whose receive is not posted before it", None
        if (src, r, tag) not in st.delivered:
            return f"{t} from rank {src}", src
    return "", None


# ---- printing ------------------------------------------------------------------------------------
def format_programs(progs: Programs, ranks: Iterable[int] | None = None) -> str:
    lines = [f"programs of {progs.placement.name}: {progs.micro_batches} micro-batches, "
             f"{len(progs.ranks)} ranks"]
    for r in ranks if ranks is not None else range(len(progs.ranks)):
        prog = progs.ranks[r]
        lines.append(f"rank {r} ({len(prog)} instructions)")
        lines += [f"  {i:4d}  {ins}" for i, ins in enumerate(prog)]
    return "\n".join(lines)
