"""The executor on 4 gloo ranks: every example model under every schedule method gives the loss and
the gradients of a single-process run; memory is freed as the schedule says; torch pipelining runs
our exported programs with the same gradients. One launch runs every check (start-up costs seconds).
"""
from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest

pytest.importorskip("torch")
import torch
import torch.distributed as dist

from tessel import library
from tessel.methods import run_method, why_not_method
from tessel.runtime import tp
from tessel.runtime.executor import Executor
from tessel.runtime.launch import Options, launch
from tessel.runtime.memory import unit_bytes
from tessel.runtime.networks import declare_kept, example
from tessel.runtime.pipelining import stage_module, torch_runtime, write_actions_csv
from tessel.runtime.program import lower
from tessel.runtime.tp import shard_of
from tessel.runtime.train import TrainJob, run_jobs
from tessel.schedule import schedule_from_dict

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # every test starts processes

TOL = 1e-5
N = 4
CASES = [("mlp", "vshape"), ("mlp", "interleaved"), ("mlp", "zb"), ("mlp", "finetune"), ("mlp", "xshape"),
         ("gpt", "mllm"), ("gpt", "nnshape"), ("kshape", "kshape")]
METHODS = ["tessel", "1f1b", "gpipe", "greedy"]
SHAPE_METHODS = {"interleaved": "interleaved", "zb": "zb-h1", "xshape": "chimera"}  # made for that shape
INTEROP = [("vshape", "1f1b"), ("interleaved", "interleaved"), ("zb", "zb-h1")]
UNIT_MEMORY = ("vshape", "interleaved", "zb")  # every forward keeps one unit until its backward


def _schedules() -> dict[tuple[str, str, str], Any]:
    out = {}
    for model, name in CASES:
        p = declare_kept(example(model, library.build(name, 4)))  # as `tessel run` declares them
        for m in METHODS + [SHAPE_METHODS.get(name, "")]:
            if m and why_not_method(m, p) is None:
                out[(model, name, m)] = run_method(m, p, N)
    out[("mlp", "vshape-infer", "greedy")] = run_method("greedy", library.build("vshape", 4, infer=True), N)
    return out


def _interop(ctx: Any, doc: dict, csv_path: str) -> float:
    """Our executor and torch's _PipelineScheduleRuntime on the same CSV-exported programs."""
    s = schedule_from_dict(doc)
    progs = lower(s)
    if ctx.rank == 0:
        write_actions_csv(progs, csv_path)
    dist.barrier()
    ex = example("mlp", s.placement)
    flow, sink = ex.flow, ex.flow.sinks[0]
    mine = [b for b in flow.forwards if ctx.rank in flow.devices(b)]
    ours, theirs = ({b: ex.build(b, None) for b in mine} for _ in range(2))
    batch = ex.batch(2 * N, seed=5)
    Executor(progs, ctx, ours, ex.feeds).run(batch)
    rt = torch_runtime(progs, csv_path, {b: stage_module(m) for b, m in theirs.items()}, ctx.device,
                       ex.whole(sink).loss)
    first = flow.forwards[0]
    rt.step(*([batch[f] for f in ex.feeds[first]] if first in mine else []),
            target=batch[ex.feeds[sink][-1]] if sink in mine else None)
    return max(float((p.grad - q.grad).abs().max()) for b in mine
               for p, q in zip(ours[b].parameters(), theirs[b].parameters()))


def _tp(ctx: Any) -> dict[str, float]:
    """Each parallel layer over all 4 ranks against the whole layer: outputs, input and weight grads."""
    group = dist.new_group(list(range(ctx.world)))
    torch.manual_seed(0)
    x = torch.randn(3, 5, 32)
    ids = torch.randint(0, 64, (3, 5))
    col, row, emb = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.Embedding(64, 32)
    out: dict[str, float] = {}

    def compare(name: str, whole: Any, part: Any, inp: torch.Tensor, split_input: bool = False) -> None:
        a = inp.clone().requires_grad_(inp.is_floating_point())
        b = (inp.chunk(4, -1)[ctx.rank] if split_input else inp).clone().requires_grad_(inp.is_floating_point())
        ya, yb = whole(a), part(b)
        ya.square().sum().backward()
        yb.square().sum().backward()
        out[f"{name} output"] = float((ya - yb).abs().max())
        if inp.is_floating_point():
            ga = a.grad.chunk(4, -1)[ctx.rank] if split_input else a.grad
            out[f"{name} input grad"] = float((ga - b.grad).abs().max())
        out[f"{name} weight grad"] = float((shard_of(part.weight, whole.weight.grad) - part.weight.grad).abs().max())
        whole.zero_grad()

    compare("colwise", col, tp.ColumnParallelLinear(col, group, gather_output=True), x)
    compare("rowwise", row, tp.RowParallelLinear(row, group), torch.randn(3, 5, 64), split_input=True)
    compare("embedding", emb, tp.VocabParallelEmbedding(emb, group), ids)
    logits = torch.randn(3, 5, 64, requires_grad=True)
    part = logits.detach().chunk(4, -1)[ctx.rank].clone().requires_grad_(True)
    whole_loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    part_loss = tp.VocabParallelCrossEntropy(group)(part, ids)
    whole_loss.backward()
    part_loss.backward()
    out["cross-entropy loss"] = float((whole_loss - part_loss).abs())
    out["cross-entropy grad"] = float((logits.grad.chunk(4, -1)[ctx.rank] - part.grad).abs().max())
    out["shard rows"] = tp.ColumnParallelLinear(col, group).weight.shape[0]
    out["shard cols"] = tp.RowParallelLinear(row, group).weight.shape[1]
    return out


SLOW_IMPORTS = ("sympy", "torch._dynamo", "transformers")  # seconds of start-up per process each


def _worker(ctx: Any, jobs: list[TrainJob], interop: list[dict], tmp: str) -> tuple[list, list, dict, list]:
    reports = run_jobs(ctx, jobs)
    slow = [m for m in SLOW_IMPORTS if m in sys.modules]  # before torch pipelining's own imports
    return (reports, [_interop(ctx, doc, f"{tmp}/actions{i}.csv") for i, doc in enumerate(interop)],
            _tp(ctx), slow)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    schedules = _schedules()
    jobs = [TrainJob.of(model, s, steps=2, check=True) for (model, _, _), s in schedules.items()]
    interop = [run_method(m, library.build(name, 4), N).to_dict() for name, m in INTEROP]
    out = launch(_worker, 4, (jobs, interop, str(tmp_path_factory.mktemp("csv"))),
                 Options(timeout=150, pg_timeout=30))
    reports = {key: [out[r][0][i] for r in range(4)] for i, key in enumerate(schedules)}
    interop_diffs = [[out[r][1][i] for r in range(4)] for i in range(len(INTEROP))]
    return {"schedules": schedules, "reports": reports, "interop": interop_diffs, "tp": [o[2] for o in out],
            "slow imports": [o[3] for o in out]}


def test_every_case_has_the_required_methods(results: dict) -> None:
    for model, name in CASES:
        got = {m for (mo, na, m) in results["schedules"] if (mo, na) == (model, name)}
        assert set(METHODS) | {SHAPE_METHODS.get(name, "greedy")} == got, (model, name)
    assert len(results["schedules"]) >= 28


@pytest.mark.parametrize("model,name", CASES + [("mlp", "vshape-infer")])
def test_loss_and_gradients_match_one_process(results: dict, model: str, name: str) -> None:
    for (mo, na, method), reports in results["reports"].items():
        if (mo, na) != (model, name):
            continue
        sinks = [r for r in reports if r.steps[0].loss is not None]
        assert sinks, (name, method)
        for r in reports:
            for i, s in enumerate(r.steps):
                where = f"{model} on {name} with {method}, rank {r.rank}, step {i}"
                assert s.grad_diff <= TOL, where
                assert s.loss_diff <= TOL, where
                if "infer" not in name:
                    assert s.params_checked > 0, where
        if "infer" not in name:  # the optimizer step took effect, the same way on both sides
            assert sinks[0].steps[1].loss != sinks[0].steps[0].loss


def test_forward_graphs_are_freed_when_backwards_end(results: dict) -> None:
    """With one memory unit per kept forward, the graphs alive on a rank peak at the schedule's memory."""
    checked = 0
    for (model, name, method), reports in results["reports"].items():
        if name not in UNIT_MEMORY:
            continue
        peak = results["schedules"][(model, name, method)].peak_memory
        assert [max(s.peak_graphs for s in r.steps) for r in reports] == list(peak), (name, method)
        checked += 1
    assert checked >= 7
    infer = results["reports"][("mlp", "vshape-infer", "greedy")]
    assert all(s.peak_graphs == 0 for r in infer for s in r.steps)


def test_training_imports_nothing_slow(results: dict) -> None:
    """Workers fork from a server that preloaded their imports; training steps of every model add
    none of the imports that cost seconds per process (sympy comes with torch.autograd.backward)."""
    assert results["slow imports"] == [[]] * 4


def test_measured_and_declared_peaks_agree_in_unit_and_rank_order(results: dict) -> None:
    """Every example model x placement x method: per rank, the measured peak of activation bytes in the
    placement's units is within 40% of the schedule's declared peak (sharded blocks declare what they
    keep), and a rank declaring clearly more than another also measures more."""
    for key, reports in results["reports"].items():
        s = results["schedules"][key]
        if not s.placement.is_training:
            continue
        kept: dict[str, int] = {}
        for r in reports:
            for b, n in r.block_bytes.items():
                kept[b] = max(kept.get(b, 0), n)
        unit = unit_bytes(kept, {b.id: float(b.memory) for b in s.placement.blocks if b.kind == "forward"})
        assert unit is not None, key
        measured = [max(st.peak_bytes for st in r.steps) / unit for r in reports]
        declared = list(s.peak_memory)
        for m, d in zip(measured, declared):
            assert d / 1.4 <= m <= d * 1.4, (key, declared, measured)
        for i, j in itertools.permutations(range(len(declared)), 2):
            if declared[i] > declared[j] + 0.5:
                assert measured[i] > measured[j], (key, declared, measured)


def test_torch_pipelining_runs_our_programs_with_the_same_gradients(results: dict) -> None:
    for (name, method), diffs in zip(INTEROP, results["interop"]):
        assert max(diffs) <= TOL, (name, method, diffs)


def test_tensor_parallel_layers_match_whole_layers(results: dict) -> None:
    for r, diffs in enumerate(results["tp"]):
        assert diffs["shard rows"] == 64 // 4 and diffs["shard cols"] == 64 // 4, r  # of 64 each
        for what, d in diffs.items():
            if "shard" not in what:
                assert d <= TOL, (r, what, d)
