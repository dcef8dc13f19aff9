"""A plan's pick on the user's own blocks: a profiled 4-block model, planned on 4 devices; the
picks that rename its blocks (Chimera's `u0.f` .. `d3.f`, a pipeline's `s0.f` ..) and its own
placement run through `MappedPipeline` on 4 gloo ranks with the gradients of one process."""
from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")
import torch
import torch.nn.functional as F
from torch import nn

from tessel.costmodel import hardware
from tessel.plan import Cluster, plan
from tessel.plan.inputs import from_placement
from tessel.plan.planner import picked
from tessel.runtime.launch import Options, launch
from tessel.runtime.mapped import MappedPipeline, block_map
from tessel.runtime.pipeline import PipelineError
from tessel.runtime.profiler import profile_modules
from tessel.schedule import schedule_from_dict

pytestmark = [pytest.mark.torch, pytest.mark.slow]

N = 4
TOL = 1e-5


def user_blocks() -> dict[str, nn.Module]:
    torch.manual_seed(0)  # the same model on every rank
    return {f"s{i}": nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for i in range(4)}


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.randn(32, 8, generator=g), torch.randn(32, 8, generator=g)


def one_process() -> dict[str, list[torch.Tensor]]:
    blocks = user_blocks()
    x, y = batch()
    F.mse_loss(nn.Sequential(*blocks.values())(x), y).backward()
    return {b: [p.grad for p in m.parameters()] for b, m in blocks.items()}


def _run(ctx: Any, docs: list[dict]) -> list[dict[str, float]]:
    ref = one_process()
    out = []
    for doc in docs:
        blocks = user_blocks()
        pipe = MappedPipeline(blocks, schedule_from_dict(doc), loss_fn=F.mse_loss)
        x, y = batch()
        pipe.step(x, target=y)
        mine = {u for b, units in pipe.map.items() if ctx.rank in pipe.pipe.flow.devices(b) for u in units}
        out.append({u: max(float((p.grad - q).abs().max()) for p, q in zip(blocks[u].parameters(), ref[u]))
                    for u in sorted(mine)})
    return out


@pytest.fixture(scope="module")
def picks() -> dict[str, Any]:
    torch.manual_seed(0)
    prof = profile_modules(user_blocks(), (torch.randn(4, 8),), devices=4, warmup=0, repeats=1)
    cluster = Cluster.of(hardware("a100-80g"), 4)
    model = from_placement(prof.placement, cluster)
    result = plan(model.spec, cluster, N, time_limit=6.0, given=model.given)
    by_family: dict[str, Any] = {}
    for row in result.rows:
        fam = row.candidate.name
        if row.schedule is not None and fam in ("chimera tp1", "pipeline tp1", "given tp1") and fam not in by_family:
            by_family[fam] = picked(result, row)
    return by_family


def test_picks_map_plan_blocks_to_the_users(picks: dict[str, Any]) -> None:
    assert set(picks) == {"chimera tp1", "pipeline tp1", "given tp1"}
    chimera = block_map(picks["chimera tp1"])
    assert chimera["u0.f"] == ("s0",) and chimera["d3.f"] == ("s3",) and chimera["d0.f"] == ("s0",)
    assert block_map(picks["pipeline tp1"]) == {f"s{i}.f": (f"s{i}",) for i in range(4)}
    assert block_map(picks["given tp1"]) == {f"s{i}": (f"s{i}",) for i in range(4)}
    for s in picks.values():
        assert s.errors() == []


def test_users_blocks_run_every_pick_with_one_process_gradients(picks: dict[str, Any]) -> None:
    names = sorted(picks)
    out = launch(_run, 4, ([picks[n].to_dict() for n in names],), Options(timeout=180, pg_timeout=30))
    for i, name in enumerate(names):
        held = set().union(*(out[r][i] for r in range(4)))
        assert held == {"s0", "s1", "s2", "s3"}, name
        for r in range(4):
            for u, d in out[r][i].items():
                assert d <= TOL, (name, r, u, d)
    # Chimera keeps two copies of every block: rank 0 holds s0 (up) and s3 (down)
    assert set(out[0][names.index("chimera tp1")]) == {"s0", "s3"}


def test_missing_user_block_is_named(picks: dict[str, Any]) -> None:
    with pytest.raises(PipelineError, match="the plan's block 'u0.f' runs your block 's0'"):
        MappedPipeline({"a": nn.Linear(2, 2)}, picks["chimera tp1"], loss_fn=F.mse_loss)


def _plain_pipeline(ctx: Any, doc: dict) -> None:
    from tessel.runtime.pipeline import Pipeline
    Pipeline(user_blocks(), schedule_from_dict(doc), loss_fn=F.mse_loss, ctx=ctx)


def test_plain_pipeline_on_a_renaming_pick_points_to_the_mapping(picks: dict[str, Any]) -> None:
    """The user's first try: Pipeline with their own blocks on the pick."""
    from tessel.runtime.launch import LaunchError
    # the launcher leads with the first rank to fail: any of them, each naming its own block
    with pytest.raises(LaunchError, match=r"no module for block '([ud])(\d)\.f'.*its meta 'blocks' says which of your "
                                          r"blocks \1\2\.f runs, \['s\d'\]; run it with tessel.runtime.mapped.MappedPipeline"):
        launch(_plain_pipeline, 4, (picks["chimera tp1"].to_dict(),), Options(timeout=60, pg_timeout=20))
