"""NCCL readiness of the lowering: per ordered pair of ranks, receives are posted in send order,
and no send waits for its receive in a cycle of ranks.

NCCL ignores tags: two ranks' point-to-point messages pair up in the order each side posts them.
The lowering orders receives by their peer's sends and its check refuses any program that does
not, naming the first mismatch. An NCCL send may also block until its receive is posted: the
check replays the programs with sends that wait for it, and the lowering posts a receive earlier
where a send would otherwise wait in a cycle. Torch-free, no processes.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from tessel import library
from tessel.methods import METHODS, run_method, why_not_method
from tessel.runtime import lower
from tessel.runtime.program import Instruction, Programs, pair_sequences
from tessel.schedule import Schedule, ScheduleError
from tessel.timing import DeadlockError, orders_of

N = 4


def _schedule(name: str, method: str) -> Schedule:
    opts = {"time_limit": 2.0} if method == "tessel" else {}
    n = 2 * N if "dualpipev" in method else N  # DualPipeV needs as many micro-batches as the V's 8 stages
    return run_method(method, library.build(name, 4), n, **opts)


CASES = [(name, m) for name in library.PLACEMENTS for m in METHODS
         if m != "exact" and why_not_method(m, library.build(name, 4)) is None]


CASES8 = [(name, m) for name in library.PLACEMENTS for m in ("gpipe", "1f1b")
          if why_not_method(m, library.build(name, 8)) is None]


def test_the_cases_cover_every_placement_and_the_search() -> None:
    assert {name for name, _ in CASES} == set(library.PLACEMENTS)
    assert {"tessel", "fast", "1f1b", "gpipe", "greedy", "zb-v"} <= {m for _, m in CASES}


@pytest.mark.parametrize("name, method", CASES)
def test_every_placement_and_method_lowers_in_send_order(name: str, method: str) -> None:
    s = _schedule(name, method)
    assert s.errors() == []
    progs = lower(s)  # checks the pair order (and deadlock freedom) itself
    sent, got = pair_sequences(progs)
    assert sent.keys() == got.keys()
    for pair in sent:  # the same property, derived here independently of the lowering's check
        assert [t.tag for t in sent[pair]] == [t.tag for t in got[pair]], (name, method, pair)


def test_a_reordered_program_is_caught_naming_the_first_mismatch() -> None:
    s = run_method("1f1b", library.build("zbv", 4), N)
    progs = lower(s)
    rank = 1
    prog = list(progs.ranks[rank])
    # two receives from the same peer, swapped: still deadlock-free, but NCCL would pair them wrongly
    by_src: dict[int, list[int]] = defaultdict(list)
    for i, ins in enumerate(prog):
        if ins.op == "recv" and ins.transfer is not None:
            by_src[ins.transfer.src].append(i)
    src, (a, b) = next((k, v[:2]) for k, v in sorted(by_src.items()) if len(v) >= 2)
    first, second = prog[a].transfer, prog[b].transfer
    assert first is not None and second is not None
    prog[a], prog[b] = prog[b], prog[a]
    ranks = list(progs.ranks)
    ranks[rank] = tuple(prog)
    tampered = replace(progs, ranks=tuple(ranks))
    with pytest.raises(ScheduleError) as e:
        tampered.check()
    message = str(e.value)
    assert "\n" not in message
    assert f"rank {rank} posts its receives from rank {src} in another order than rank {src} sends them" in message
    assert f"message 1 sent is {first}, message 1 received is {second}" in message


@pytest.mark.parametrize("name, method", CASES8)
def test_eight_ranks_lower_without_a_send_waiting_in_a_cycle(name: str, method: str) -> None:
    """At 8 ranks the receives posted one task ahead leave sends waiting in cycles of up to 8 ranks
    (mllm's 1F1B) unless the lowering posts them earlier; lower() checks it with blocking sends."""
    s = run_method(method, library.build(name, 8), 8)
    progs = lower(s)
    assert progs.compute_orders() == [list(o) for o in orders_of(s)]  # the schedule's order, kept


def _late_receives(progs: Programs) -> Programs:
    """Every receive moved to right before the compute task that reads it (lookahead 0, no receive
    posted early): what the lowering gave before sends were assumed to block."""
    ranks = []
    for prog in progs.ranks:
        recvs = [i for i in prog if i.op == "recv"]
        out: list[Instruction] = []
        for ins in prog:
            if ins.is_compute:
                out += [r for r in recvs if (r.block, r.micro_batch) == (ins.block, ins.micro_batch)]
            if ins.op != "recv":
                out.append(ins)
        ranks.append(tuple(out))
    return replace(progs, ranks=tuple(ranks))


def test_two_neighbours_each_sending_before_receiving_are_caught() -> None:
    """1F1B's steady state with late receives: rank 2 sends micro-batch 1's activation before posting
    micro-batch 0's gradient receive, rank 3 sends that gradient before posting the activation's
    receive. Deadlock-free with sends that return at once (gloo), a hang when they wait (NCCL)."""
    progs = _late_receives(lower(run_method("1f1b", library.build("vshape", 4), N)))
    with pytest.raises(DeadlockError) as e:
        progs.check()
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("programs deadlock in a wait cycle rank 2 -> rank 3 -> rank 2: ")
    assert "rank 2 waits at instruction 5 send act f2->f3#1 to 3 (tag 10) for rank 3 to post its receive" in message
    assert "rank 3 waits at instruction 3 send grad f2->f3#0 to 2 (tag 5) for rank 2 to post its receive" in message


def test_a_longer_wait_cycle_is_caught_naming_every_rank_in_it() -> None:
    progs = _late_receives(lower(run_method("gpipe", library.build("kshape", 8), 8)))
    with pytest.raises(DeadlockError) as e:
        progs.check()
    message = str(e.value)
    assert "\n" not in message
    assert "wait cycle rank 0 -> rank 1 -> rank 2 -> rank 3 -> rank 0: " in message
    for r, peer in ((0, 1), (1, 2), (2, 3), (3, 0)):
        assert f"rank {r} waits at instruction" in message
        assert f"to {peer} (tag" in message.split(f"rank {r} waits at")[1].split(";")[0]
