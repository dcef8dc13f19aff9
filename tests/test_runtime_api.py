"""The Pipeline API on 4 gloo ranks against one process: pytree outputs between blocks, gradient
accumulation, recomputation, a searched schedule shared by every rank, models split by
split_sequential and by torch pipelining's tracer; errors name the block. One launch runs the
checks that pass (start-up costs seconds); each failure case has its own launch.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from tessel import library
from tessel.methods import run_method
from tessel.runtime.launch import LaunchError, Options, launch
from tessel.runtime.pipeline import Pipeline, PipelineError, WithLoss
from tessel.runtime.share import schedule_digest
from tessel.runtime.split import SplitError, chain_placement, split_at, split_sequential

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # every test starts processes

ROOT = Path(__file__).resolve().parents[1]
RTOL, ATOL = 1e-5, 1e-7  # float32 sums in another order


def close(a: Tensor, b: Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=RTOL, atol=ATOL))


# ---- models -------------------------------------------------------------------------------------
class Embed(nn.Module):
    """Returns a dict: hidden states and the (integer) token ids the next block needs again."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)

    def forward(self, ids: Tensor) -> dict[str, Any]:
        return {"h": self.emb(ids), "ids": ids, "mask": ids > 10}


class Mix(nn.Module):
    """Reads the dict, returns a tuple (hidden, a half-precision side output)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        h = torch.tanh(self.lin(x["h"])) * x["mask"].unsqueeze(-1) + x["ids"].unsqueeze(-1) * 0.01
        return h, (h * 2).to(torch.bfloat16)


class Merge(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: tuple[Tensor, Tensor]) -> Tensor:
        return self.lin(x[0]) + x[1].float()


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.out = nn.Linear(16, 50)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(h).mean(dim=1)


def pytree_model() -> nn.Sequential:
    torch.manual_seed(1)
    return nn.Sequential(Embed(), Mix(), Merge(), Head())


def mlp() -> nn.Sequential:
    torch.manual_seed(2)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(12, 12), nn.GELU())], nn.Linear(12, 5))


class Traced(nn.Module):
    """A model that is not a Sequential: split by module names through torch's tracer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.inp = nn.Linear(12, 12)
        self.layers = nn.ModuleList(nn.Linear(12, 12) for _ in range(3))
        self.out = nn.Linear(12, 5)

    def forward(self, x: Tensor) -> Tensor:
        x = torch.relu(self.inp(x))
        for layer in self.layers:
            x = torch.relu(layer(x)) + x
        return self.out(x)


def reference_grads(model: nn.Module, batches: list[tuple[Tensor, Tensor]]) -> tuple[list[float], dict[str, Tensor]]:
    """Plain autograd on one process: the losses, and the gradients summed over the batches."""
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(float(loss))
    return losses, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(pipe: Pipeline, ref: dict[str, Tensor], names: dict[str, str]) -> list[str]:
    """Parameters whose gradient differs from the reference (pipeline name -> reference name)."""
    bad = []
    for name, p in pipe.named_parameters():
        if p.grad is None or not close(p.grad, ref[names[name]]):
            bad.append(name)
    return bad


def seq_names(blocks: dict[str, nn.Module], model: nn.Sequential) -> dict[str, str]:
    """`s1.0.weight` -> the model's `2.weight`, from split_sequential's consecutive parts."""
    out, start = {}, 0
    for b, part in blocks.items():
        assert isinstance(part, nn.Sequential)
        for name, _ in part.named_parameters():
            i, _, rest = name.partition(".")
            out[f"{b}.{name}"] = f"{start + int(i)}.{rest}"
        start += len(part)
    return out


# ---- the worker -------------------------------------------------------------------------------
def checks(ctx: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ids, labels = torch.randint(0, 50, (16, 6), generator=torch.Generator().manual_seed(0)), torch.arange(16) % 50

    # pytree outputs, 1f1b, two steps accumulating
    model = pytree_model()
    blocks = {f"s{i}": m for i, m in enumerate(pytree_model())}
    pipe = Pipeline(blocks, "1f1b", loss_fn=F.cross_entropy, micro_batches=4, ctx=ctx)
    losses = [pipe.step(ids, target=labels), pipe.step(ids.flip(0), target=labels.flip(0))]
    ref_losses, ref = reference_grads(model, [(ids, labels), (ids.flip(0), labels.flip(0))])
    names = {f"s{i}.{n}": f"{i}.{n}" for i, m in enumerate(model) for n, _ in m.named_parameters()}
    out["pytree"] = (losses, ref_losses, compare(pipe, ref, names), len(list(pipe.named_parameters())))

    # recomputation gives the same gradients
    model2 = mlp()
    x, y = torch.randn(16, 12, generator=torch.Generator().manual_seed(1)), torch.arange(16) % 5
    _, ref2 = reference_grads(model2, [(x, y)])
    for recompute in (False, True):
        blocks2 = split_sequential(mlp(), 4)
        pipe2 = Pipeline(blocks2, "gpipe", loss_fn=F.cross_entropy, micro_batches=4, recompute=recompute, ctx=ctx)
        pipe2.step(x, target=y)
        out[f"recompute={recompute}"] = compare(pipe2, ref2, seq_names(blocks2, mlp()))

    # a searched schedule: made once, the same on every rank; zero-bubble placement (split backward)
    place = chain_placement(["s0", "s1", "s2", "s3"], 4, split_weight=True)
    pipe3 = Pipeline(split_sequential(mlp(), 4), "tessel", placement=place, micro_batches=8,
                     loss_fn=F.cross_entropy, ctx=ctx)
    pipe3.step(torch.cat([x, x]), target=torch.cat([y, y]))
    out["digest"] = schedule_digest(pipe3.schedule)
    out["tessel"] = compare(pipe3, ref2, seq_names(split_sequential(mlp(), 4), mlp()))
    # a Schedule object (a baseline: the same on every rank) unrolled to 16 micro-batches
    one_f = run_method("1f1b", chain_placement(["s0", "s1", "s2", "s3"], 4), 8)
    pipe3b = Pipeline(split_sequential(mlp(), 4), one_f, micro_batches=16, loss_fn=F.cross_entropy, ctx=ctx)
    pipe3b.step(torch.cat([x, x]), target=torch.cat([y, y]))
    out["unrolled"] = (pipe3b.schedule.micro_batches, compare(pipe3b, ref2, seq_names(split_sequential(mlp(), 4), mlp())))

    # split by module names (torch pipelining's tracer), then run by the pipeline
    traced = Traced()
    _, ref4 = reference_grads(traced, [(x, y)])
    blocks4 = split_at(Traced(), ["layers.0", "layers.1", "layers.2"], (x[:4],))
    pipe4 = Pipeline(blocks4, "1f1b", loss_fn=F.cross_entropy, micro_batches=4, ctx=ctx)
    pipe4.step(x, target=y)
    fqn = {n: n for n, _ in traced.named_parameters()}
    out["split_at"] = [n for n, p in pipe4.named_parameters()
                       if p.grad is None or not close(p.grad, ref4[fqn[n.split(".", 1)[1].removeprefix("inner.")]])]

    # two pipelines of 2 ranks side by side (process groups [0, 1] and [2, 3]) on the M shape: a
    # first block on both ranks of each (its process group made for both replicas), different data
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    replica = ctx.rank // 2
    mods = split_sequential(mlp(), [1, 4, 4])
    names = seq_names(mods, mlp())
    pipe5 = Pipeline(lambda b, g: split_sequential(mlp(), [1, 4, 4])[{"fA0": "s0", "f0": "s1", "f1": "s2"}[b]],
                     "greedy", placement=library.build("mshape", 2), micro_batches=4, loss_fn=F.cross_entropy,
                     group=groups[replica], ctx=ctx)
    xr = x + replica
    _, ref5 = reference_grads(mlp(), [(xr, y)])
    loss5 = pipe5.step(xr, target=y)
    rename = {"fA0": "s0", "f0": "s1", "f1": "s2"}
    out["groups"] = (loss5, [n for n, p in pipe5.named_parameters() if p.grad is None or not close(
        p.grad, ref5[names[rename[n.split(".", 1)[0]] + "." + n.split(".", 1)[1]]])],
        sorted(pipe5.groups), float(F.cross_entropy(mlp()(xr), y)))

    # a batch that does not split evenly is refused on every rank before anything moves
    try:
        pipe2.step(x[:10], target=y[:10])
        out["uneven"] = ""
    except PipelineError as e:
        out["uneven"] = str(e)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return launch(checks, 4, options=Options(timeout=240))


def test_pytree_outputs_and_accumulation_match_one_process(results: list[dict[str, Any]]) -> None:
    for r in results:
        losses, ref_losses, bad, n = r["pytree"]
        assert n > 0
        assert losses == pytest.approx(ref_losses, rel=RTOL)
        assert bad == []


def test_recomputation_keeps_the_gradients(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert r["recompute=False"] == [] and r["recompute=True"] == []


def test_a_searched_schedule_is_the_same_on_every_rank(results: list[dict[str, Any]]) -> None:
    assert len({r["digest"] for r in results}) == 1
    assert all(r["tessel"] == [] for r in results)
    assert all(r["unrolled"] == (16, []) for r in results)


def test_split_at_module_names_runs_like_the_model(results: list[dict[str, Any]]) -> None:
    assert all(r["split_at"] == [] for r in results)


def test_pipelines_on_process_groups_side_by_side(results: list[dict[str, Any]]) -> None:
    for r in results:
        loss, bad, groups, want = r["groups"]
        assert loss == pytest.approx(want, rel=RTOL) and bad == [] and groups == [(0, 1)]
    assert results[0]["groups"][0] != results[2]["groups"][0]  # the two replicas saw different data


def test_uneven_batch_is_refused_naming_the_field(results: list[dict[str, Any]]) -> None:
    for r in results:
        assert "'input0' has 10 rows" in r["uneven"] and "multiple of 4" in r["uneven"]


# ---- failures ---------------------------------------------------------------------------------
class Bad(nn.Module):
    def forward(self, x: Tensor) -> Any:
        return {"h": x, "note": "not a tensor"}


def missing_block(ctx: Any) -> None:
    blocks = split_sequential(mlp(), 4)
    del blocks["s2"]
    place = chain_placement(["s0", "s1", "s2", "s3"], 4)
    Pipeline(blocks, "1f1b", placement=place, loss_fn=F.cross_entropy, micro_batches=4, ctx=ctx).step(
        torch.randn(8, 12), target=torch.zeros(8, dtype=torch.long))


def wrong_output(ctx: Any) -> None:
    blocks: dict[str, nn.Module] = dict(split_sequential(mlp(), 4))
    blocks["s1"] = Bad()
    Pipeline(blocks, "1f1b", loss_fn=F.cross_entropy, micro_batches=4, ctx=ctx).step(
        torch.randn(8, 12), target=torch.zeros(8, dtype=torch.long))


@pytest.mark.parametrize("fn, message", [
    (missing_block, r"rank 2: .*no module for block 's2'"),
    (wrong_output, r"block 's1' returned a str inside its dict output"),
])
def test_errors_name_the_block(fn: Any, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        launch(fn, 4, options=Options(timeout=60, pg_timeout=20))


def test_loss_fn_must_give_a_scalar() -> None:
    block = WithLoss(nn.Linear(4, 3), lambda out, t: F.cross_entropy(out, t, reduction="none"), 1, "s3")
    with pytest.raises(PipelineError, match=r"loss_fn on the output of block 's3' returned a tensor of shape \[2\]"):
        block(torch.randn(2, 4), torch.zeros(2, dtype=torch.long))


def test_split_errors_name_the_part() -> None:
    with pytest.raises(SplitError, match="cannot split 9 layers into 10 parts"):
        split_sequential(mlp(), 10)
    with pytest.raises(SplitError, match=r"split point 'layer.1' is not a submodule of Traced"):
        split_at(Traced(), ["layer.1"], (torch.randn(2, 12),))
    assert [len(m) for m in split_sequential(mlp(), 4).values()] == [3, 2, 2, 2]  # type: ignore[arg-type]


# ---- the tutorial -------------------------------------------------------------------------------
def test_the_tutorial_example_trains_like_one_process() -> None:
    """examples/own_model.py (included in docs/runtime.md) on 4 processes gives the losses of
    the same model trained on one process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "own_model.py")], capture_output=True,
                         text=True, env=env, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    got = [float(v) for v in re.findall(r"[\d.]+", run.stdout.split("losses:")[1])]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16), torch.randint(0, 10, (32,))
    want = []
    for _ in range(3):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        want.append(float(loss.detach()))
    assert got == pytest.approx(want, rel=1e-5)
    assert len(got) == 3 and got[-1] < got[0]
    doc = (ROOT / "docs" / "runtime.md").read_text()
    snippet = (ROOT / "examples" / "own_model.py").read_text()
    body = snippet[snippet.index("def train"):snippet.index("if __name__")].strip()
    assert body in doc, "docs/runtime.md must include examples/own_model.py's train() verbatim"
