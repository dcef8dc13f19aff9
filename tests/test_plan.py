"""`tessel plan`: valid schedules, never slower than a baseline it ran, memory pruning, inputs, CLI."""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from shared_files import checker_verdict

from tessel.costmodel import A100, GIB, flava_spec, gpt_spec
from tessel.plan import Cluster, candidates, load_model, plan
from tessel.schedule import Schedule

SMALL_GPT = dict(hidden=1024, heads=16, seq=512, vocab=64_000, layers=8)
SMALL_FLAVA = dict(hidden=1024, heads=16, image_seq=256, text_seq=128, layers=4, fusion_layers=4)


def _checked(s: Schedule, tmp_path: Path) -> None:
    s.validate()
    f = tmp_path / "plan.json"
    s.save(f)
    checker_verdict(f)


@pytest.mark.slow
@pytest.mark.parametrize("build,opts", [(gpt_spec, SMALL_GPT), (flava_spec, SMALL_FLAVA)])
def test_plan_is_a_valid_schedule_no_slower_than_every_baseline(build, opts, tmp_path: Path) -> None:
    cluster = Cluster.of(A100, 8, per_node=4)  # two nodes: cross-node TP is on the table
    result = plan(build(8, cluster.hardware, **opts), cluster, 16, time_limit=20, fast_top=3, tessel_top=1)
    assert result.best.schedule is not None
    _checked(result.best.schedule, tmp_path)
    baselines = [r for r in result.rows if r.method in ("1f1b", "gpipe", "chimera") and r.status == "ok"]
    assert baselines, "the plan evaluates the baselines"
    assert all(result.best.makespan <= b.makespan + 1e-9 for b in baselines)
    assert result.best_baseline is not None and result.best_baseline.makespan == min(b.makespan for b in baselines)
    # every searched or baseline schedule fits the memory its placement's weights leave
    for r in result.rows:
        if r.schedule is not None:
            assert all(p <= b for p, b in zip(r.schedule.peak_memory, r.candidate.budget))
    assert result.best.candidate.name in result.why and "baseline" in result.why


@pytest.mark.slow
def test_memory_pruning_refuses_candidates_over_the_limit() -> None:
    # 12 GiB devices: a 256k x 4096 vocabulary in 16-byte training state is 16 GiB whole,
    # so only placements that split it (sharded, or tensor-parallel stages) can hold it
    hw = replace(A100, memory=12 * GIB)
    cluster = Cluster.of(hw, 4)
    spec = gpt_spec(4, cluster.hardware, hidden=4096, heads=32, seq=1024, vocab=256_000, layers=4)
    result = plan(spec, cluster, 8, time_limit=15, fast_top=2, tessel_top=1)
    weights = [r for r in result.rows if r.reason.startswith("weights leave")]
    assert weights, "some candidate's weights exceed 12 GiB"
    for r in weights:
        assert r.status == "pruned" and r.schedule is None and min(r.candidate.budget) <= 0
    assert min(result.best.candidate.budget) > 0
    assert all(p <= b for p, b in zip(result.best.schedule.peak_memory, result.best.candidate.budget))
    # activations: one micro-batch over the budget is refused before any search
    tight = [c for c in candidates(spec, cluster) if min(c.budget) > 0]
    c = tight[0]
    one = max(sum(max(b.memory, 0) for b in c.placement.blocks_on(d)) for d in range(4))
    from tessel.plan.planner import _memory_check
    squeezed = replace(c, budget=(int(one) - 1,) * 4)
    row = _memory_check(squeezed, 8)
    assert row is not None and row.status == "pruned" and "one micro-batch keeps" in row.reason


def test_candidates_cover_the_families_and_keep_tp_inside_a_node() -> None:
    cluster = Cluster.of(A100, 16, per_node=8)
    names = {c.name for c in candidates(flava_spec(16, cluster.hardware, **SMALL_FLAVA), cluster)}
    # 12 layers cannot fill 16 one-device stages: tp1 pipelines are left out
    assert {"pipeline tp2", "pipeline tp8", "branches+join on all tp2", "tp tp16"} <= names
    assert "pipeline tp1" not in names
    assert not any(c.tp > 8 for c in candidates(flava_spec(16, cluster.hardware, **SMALL_FLAVA), cluster)
                   if c.family not in ("tp",))


@pytest.mark.slow
def test_a_placement_family_file_is_planned(tmp_path: Path) -> None:
    f = tmp_path / "k.json"
    f.write_text(json.dumps({"family": "kshape", "forward": 2, "backward": 4, "memory": 1}))
    cluster = Cluster.of(A100, 4)
    model = load_model(str(f), cluster)
    assert model.given is not None and model.given.placement.devices == 4
    result = plan(model.spec, cluster, 8, time_limit=10, fast_top=2, tessel_top=1, given=model.given)
    _checked(result.best.schedule, tmp_path)
    with pytest.raises(ValueError, match="neither a known model"):
        load_model(str(tmp_path / "missing.json"), cluster)
    with pytest.raises(ValueError, match="takes"):
        load_model("gpt", cluster, {"colour": 1})


def test_cli_writes_placement_and_schedule_and_rejects_bad_input(tessel, tmp_path: Path) -> None:
    sched, place = tmp_path / "s.json", tmp_path / "p.json"
    rc, out, err = tessel("plan", "flava", "--devices", "4", "-n", "8", "--time-limit", "10",
                          "--set", "hidden=1024", "--set", "layers=4", "--set", "fusion_layers=2",
                          "--set", "image_seq=128", "--set", "text_seq=64", "--set", "heads=16",
                          "-o", sched, "--placement-out", place)
    assert rc == 0, err
    assert "chose" in out and "period bound" in out
    # the table says what it planned and what its placement names mean
    assert out.splitlines()[0].startswith("flava: 10 layers, hidden 1,024, heads 16, image seq 128, text seq 64")
    legend = out[out.index("placement names"):]
    assert "\n  pipeline: the model as one chain of stages" in legend and "tpT: T devices per" in legend
    # inference keeps nothing from forward to backward: its peak is a block's activation, not 0.0
    peaks = [line.split()[-3] for line in out.splitlines() if line.split()[-1:] == ["ok"]]
    assert peaks and all(float(p.split("/")[0]) > 0 for p in peaks), peaks
    s = Schedule.load(sched, check=True)
    assert s.placement.to_dict() == json.loads(place.read_text())
    assert s.meta["plan"].startswith("chose")
    if "blocks" in s.meta:  # which of the model's units each forward block of the pick runs
        assert set(s.meta["blocks"]) <= {b.id for b in s.placement.blocks}
    rc, out, err = tessel("plan", "gpt", "--devices", "12", "--devices-per-node", "8")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "12 devices" in err
    rc, out, err = tessel("plan", "gpt", "--set", "layers")
    assert rc == 2 and "KEY=VALUE" in err


def _bench_paper():  # bench/ is scripts, not a package
    import importlib.util
    path = Path(__file__).resolve().parents[1] / "bench" / "paper.py"
    spec = importlib.util.spec_from_file_location("bench_paper", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_paper"] = module
    spec.loader.exec_module(module)
    return module


def test_paper_check_fails_when_a_stored_cell_no_longer_matches(tmp_path: Path) -> None:
    bp = _bench_paper()
    setup = bp.setups()["paper"]
    args = bp.argparse.Namespace(time_limit=5.0, plan_limit=5.0)
    lines = []
    for key, point, methods in bp.CHECK_POINTS["paper"]:
        case = bp.flava_case(setup.hardware) if key == "flava-sweep" else next(c for c in setup.cases if c.key == key)
        d, n, digits = (4, point, 3) if key == "flava-sweep" else (point, case.micro_batches(point), 2)
        res = bp.run_point(case, d, n, setup, args, methods)
        lines += [f"### {case.title}", "", "| point | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods),
                  f"| {point} | " + " | ".join(bp.cell(res[m], digits) for m in methods) + " |", ""]
    good = tmp_path / "paper.md"
    good.write_text("\n".join(lines))
    assert bp.check(setup, good, args) == 0
    stale = tmp_path / "stale.md"
    text = "\n".join(lines)
    row = next(ln for ln in lines if ln.startswith("| 4 |"))
    cells = row.split(" | ")
    cells[1] = "0.01"  # a 1F1B figure the code does not give
    stale.write_text(text.replace(row, " | ".join(cells)))
    assert bp.check(setup, stale, args) == 1
