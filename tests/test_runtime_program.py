"""Lowering schedules into per-rank programs and the check that proves them deadlock-free (no torch)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from shared_files import suite_cases

from tessel import library
from tessel.baselines import BASELINES, why_not
from tessel.placement import PlacementError, make_placement, placement_from_dict
from tessel.runtime import dataflow, lower, lower_orders
from tessel.runtime.pipelining import actions_csv, pipeline_actions
from tessel.runtime.program import Instruction, Programs, format_programs, shape_pass
from tessel.schedule import ScheduleError
from tessel.timing import DeadlockError, earliest_starts, orders_of

NAMES = ["vshape", "interleaved", "zb", "xshape", "mshape", "nnshape", "kshape", "alphafold", "mllm", "finetune"]


def _suite() -> dict:
    return {c["name"]: placement_from_dict(c["placement"]) for c in suite_cases()}


def _one_f_one_b(name: str, n: int = 4):
    return BASELINES["1f1b"](library.build(name, 4), n, None)


def test_lowering_is_torch_free() -> None:
    code = ("import sys, tessel.runtime, tessel.runtime.program, tessel.runtime.pipelining; "
            "sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.parametrize("name", NAMES)
def test_every_baseline_lowers_to_checked_programs(name: str) -> None:
    p = library.build(name, 4)
    methods = [m for m in ("1f1b", "gpipe", "greedy", "interleaved", "zb-h1", "chimera") if why_not(m, p) is None]
    assert "greedy" in methods
    for m in methods:
        s = BASELINES[m](p, 8, None)
        progs = lower(s)
        # each rank runs exactly its device's tasks, in the schedule's order
        assert progs.compute_orders() == [[(t.block, t.micro_batch) for t in ts] for ts in s.device_orders()]
        moves = {op: {(i.transfer.src, i.transfer.dst, i.transfer.tag) for prog in progs.ranks for i in prog
                      if i.op == op} for op in ("send", "recv")}
        assert moves["send"] == moves["recv"] and moves["send"], (name, m)


def test_vshape_1f1b_program_of_rank_1() -> None:
    progs = lower(_one_f_one_b("vshape"), lookahead=0)
    text = format_programs(progs, [1]).splitlines()
    assert text[1] == "rank 1 (24 instructions)"
    assert [line.split(None, 1)[1] for line in text[2:8]] == [
        "recv act f0->f1#0 from 0 (tag 0)", "forward f1#0", "send act f1->f2#0 to 2 (tag 2)",
        "recv act f0->f1#1 from 0 (tag 6)", "forward f1#1", "send act f1->f2#1 to 2 (tag 8)"]
    assert "backward b2#0" in str(progs) and "send grad f0->f1#0 to 0 (tag 1)" in str(progs)


def test_lookahead_posts_receives_one_task_early() -> None:
    prog = lower(_one_f_one_b("vshape"), lookahead=1).ranks[1]
    computes = [i for i, ins in enumerate(prog) if ins.is_compute]
    for k, i in enumerate(computes[1:], start=1):
        for ins in prog[computes[k - 1] + 1:i]:
            assert ins.op != "recv" or ins.micro_batch != prog[i].micro_batch or ins.block != prog[i].block
    with pytest.raises(ValueError, match="lookahead"):
        lower(_one_f_one_b("vshape"), lookahead=-1)


def test_multi_device_blocks_share_the_sending() -> None:
    flow = dataflow(library.build("mllm", 4))
    # f3 (device 3) feeds the head on all devices: device 3 has it, 0..2 receive from 3
    x = flow.outputs("f3")[0]
    assert [flow.source(x, r) for r in range(4)] == [3, 3, 3, None]
    # the embedding's output gradient comes back from f0's backward on device 0 to devices 1..3
    g = flow.outputs(flow.backward["f0"])[0]
    assert g.edge == ("fA0", "f0") and flow.destinations(g, 0) == (1, 2, 3)
    # kshape: the fusion block's input gradients go back to the branches from their own devices
    kflow = dataflow(library.build("kshape", 4))
    grads = kflow.outputs(kflow.backward["fA0"])
    assert {(x.edge, kflow.source(x, kflow.devices(x.edge[0])[0])) for x in grads} == {
        (("f2", "fA0"), None), (("f3", "fA0"), None)}


def test_tags_are_distinct_per_pair_and_step() -> None:
    progs = lower(BASELINES["greedy"](library.build("nnshape", 4), 8, None))
    seen = {}
    for prog in progs.ranks:
        for ins in prog:
            if ins.op == "send":
                t = ins.transfer
                key = (t.src, t.dst, t.tag)
                assert key not in seen, (seen.get(key), t)
                seen[key] = t


def test_grad_of_inferred_like_the_library_sets_it() -> None:
    suite = _suite()
    for name in NAMES:
        lib = library.build(name, 4)
        if lib.name not in suite:
            continue
        inferred = dataflow(suite[lib.name]).forward_of
        given_ = {b.id: b.grad_of for b in lib.blocks if b.grad_of is not None}
        assert inferred == given_, name


def test_untrainable_placements_are_refused() -> None:
    p = library.build("vshape", 2)  # b0 differentiates f1, b1 differentiates f0
    frozen_reader = make_placement("frozen-reader", 2, [b for b in p.blocks if b.id != "b0"],
                                   [e for e in p.edges if "b0" not in e] + [("f1", "b1")])
    with pytest.raises(PlacementError, match="f1, which reads its output, has no backward"):
        dataflow(frozen_reader)


def _bad_vshape_orders():
    """Device 0 waits for micro-batch 0's gradient before sending micro-batch 1's activation;
    device 1 runs micro-batch 1 first: each waits for the other."""
    p = library.build("vshape", 2)
    orders = [[("f0", 0), ("b1", 0), ("f0", 1), ("b1", 1)],
              [("f1", 1), ("b0", 1), ("f1", 0), ("b0", 0)]]
    return p, orders


def test_deadlock_check_catches_a_bad_ordering() -> None:
    p, orders = _bad_vshape_orders()
    progs = lower_orders(p, 2, orders)
    with pytest.raises(DeadlockError) as e:
        progs.check()
    msg = str(e.value)
    assert "rank 0 waits at" in msg and "backward b1#0" in msg and "grad f0->f1#0 from rank 1" in msg
    assert "rank 1 waits at" in msg and "forward f1#1" in msg and "act f0->f1#1 from rank 0" in msg
    with pytest.raises(DeadlockError):
        earliest_starts(p, 2, orders)  # the timing layer agrees


def test_deadlock_check_catches_a_collective_out_of_order() -> None:
    p = library.build("mshape", 2)
    s = BASELINES["gpipe"](p, 2, None)
    orders = orders_of(s)
    orders[1] = [k for k in orders[1] if k != ("fA0", 1)]
    orders[1].insert(orders[1].index(("fA0", 0)), ("fA0", 1))  # device 1 joins fA0#1 first
    with pytest.raises(DeadlockError, match="to join the collective task"):
        lower_orders(p, 2, orders).check()


def _tampered(progs: Programs, rank: int, prog: list[Instruction]) -> Programs:
    ranks = list(progs.ranks)
    ranks[rank] = tuple(prog)
    return replace(progs, ranks=tuple(ranks))


def test_check_catches_tampered_programs() -> None:
    progs = lower(_one_f_one_b("vshape"), lookahead=0)
    prog = list(progs.ranks[2])
    recvs = [i for i, ins in enumerate(prog) if ins.op == "recv"]
    with pytest.raises(ScheduleError, match="unmatched transfer .* never receives it"):
        _tampered(progs, 2, prog[:recvs[0]] + prog[recvs[0] + 1:]).check()
    swapped = list(prog)
    a, b = [i for i in recvs if not prog[i].transfer.grad][:2]
    swapped[a], swapped[b] = swapped[b], swapped[a]
    with pytest.raises(ScheduleError, match="in another order than rank 1 sends them"):
        _tampered(progs, 2, swapped).check()
    # a receive posted after the task that reads it
    i = recvs[0]
    late = prog[:i] + [prog[i + 1], prog[i]] + prog[i + 2:]
    with pytest.raises(DeadlockError, match="whose receive is not posted before it"):
        _tampered(progs, 2, late).check()
    forged = list(prog)
    j = [i for i in recvs if prog[i].transfer.src == 1][1]
    forged[j] = replace(prog[j], transfer=replace(prog[j].transfer, src=3))
    with pytest.raises(ScheduleError):
        _tampered(progs, 2, forged).check()


def _random_orders(p, n: int, seed: int, swaps: int):
    """A random valid interleaving projected on the devices, then a few adjacent swaps."""
    import random
    rng = random.Random(seed)
    indeg = {(b.id, m): len(p.preds[b.id]) for b in p.blocks for m in range(n)}
    ready, out = [k for k, v in indeg.items() if v == 0], []
    while ready:
        k = ready.pop(rng.randrange(len(ready)))
        out.append(k)
        for s in p.succs[k[0]]:
            indeg[(s, k[1])] -= 1
            if indeg[(s, k[1])] == 0:
                ready.append((s, k[1]))
    orders = [[t for t in out if d in p.by_id[t[0]].devices] for d in range(p.devices)]
    for _ in range(swaps):
        o = orders[rng.randrange(p.devices)]
        i = rng.randrange(len(o) - 1)
        o[i], o[i + 1] = o[i + 1], o[i]
    return orders


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(["vshape", "xshape", "mshape", "nnshape", "kshape", "mllm", "finetune", "zb"]),
       n=st.integers(1, 4), seed=st.integers(0, 10**6), swaps=st.integers(0, 3))
def test_check_agrees_with_the_timing_layer(name: str, n: int, seed: int, swaps: int) -> None:
    """Programs deadlock exactly when the per-device orders cannot be timed."""
    p = library.build(name, 4)
    orders = _random_orders(p, n, seed, swaps)
    try:
        earliest_starts(p, n, orders)
        timed = True
    except DeadlockError:
        timed = False
    try:
        lower_orders(p, n, orders).check()
        runs = True
    except DeadlockError:
        runs = False
    assert runs == timed


def test_pipelining_actions_csv() -> None:
    assert actions_csv(lower(_one_f_one_b("vshape"))).splitlines() == [
        "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3",
        "1F0,1F1,1F2,1B0,1F3,1B1,1B2,1B3",
        "2F0,2F1,2B0,2F2,2B1,2F3,2B2,2B3",
        "3F0,3B0,3F1,3B1,3F2,3B2,3F3,3B3"]
    zb = pipeline_actions(lower(BASELINES["zb-h1"](library.build("zb", 4), 4, None)))
    assert zb[3][:4] == ["3F0", "3I0", "3F1", "3I1"] and sum(a[1] == "W" for row in zb for a in row) == 16
    inter = pipeline_actions(lower(BASELINES["interleaved"](library.build("interleaved", 4), 4, None)))
    assert {a[0] for a in inter[0]} == {"0", "4"}  # stages 0 and 4 on rank 0
    with pytest.raises(PlacementError, match="block fA0 of mshape-4 spans devices"):
        actions_csv(lower(_one_f_one_b("mshape")))
    with pytest.raises(PlacementError, match="not a chain"):
        actions_csv(lower(_one_f_one_b("kshape")))


def test_random_orders_cover_both_outcomes() -> None:
    """The property above sees deadlocking and runnable orders alike."""
    p = library.build("vshape", 4)
    outcomes = set()
    for seed in range(40):
        try:
            lower_orders(p, 3, _random_orders(p, 3, seed, 2)).check()
            outcomes.add(True)
        except DeadlockError:
            outcomes.add(False)
    assert outcomes == {True, False}


def test_the_shape_pass_keeps_micro_batch_0s_forwards_and_activations() -> None:
    """What the executor's first step runs before the step (and the check replays): micro-batch 0's
    forwards, the activations they send each other's descriptions of, in program order."""
    progs = lower(_one_f_one_b("vshape"))
    passes = shape_pass(progs)
    for full, kept in zip(progs.ranks, passes.ranks):
        assert list(kept) == [i for i in full if i in kept]  # a subsequence, in order
        assert all(i.micro_batch == 0 and i.op in ("forward", "send", "recv") for i in kept)
        assert not any(i.transfer is not None and i.transfer.grad for i in kept)
    assert [sum(i.op == "forward" for i in prog) for prog in passes.ranks] == [1, 1, 1, 1]
    assert [sum(i.op == "send" for i in prog) for prog in passes.ranks] == [1, 1, 1, 0]
