"""Emulated devices: real processes and messages, compute replaced by sleeping the placement's durations.

The band on step time is generous on purpose (a shared machine): the lower end holds by
construction (every task sleeps its duration), the upper end catches an emulator or executor that
serialises ranks or loses the schedule's overlap (which costs far more than 2x on these cases).
"""
from __future__ import annotations

import re
import time
from typing import Any

import pytest

pytest.importorskip("torch")

from tessel import library
from tessel.methods import run_method
from tessel.runtime.emulate import Emulation, SleepingDevice, replay_makespan, run_emulated
from tessel.runtime.launch import Options, launch
from tessel.runtime.networks import Config, example
from tessel.runtime.program import lower
from tessel.schedule import schedule_from_dict
from tests.conftest import Run

pytestmark = pytest.mark.torch

UNIT_MS = 20.0


def test_an_emulated_1f1b_step_takes_its_makespan() -> None:
    s = run_method("1f1b", library.build("vshape", 4), 4)
    assert s.errors() == []
    run = run_emulated(s, UNIT_MS, steps=2, features=256)
    assert run.order_errors == ()
    assert run.replay == replay_makespan(s) == float(s.makespan)  # 1F1B's orders, as early as possible
    assert len(run.seconds) == 2
    # the step cannot beat the schedule (every task sleeps its duration); 2x would mean lost overlap
    assert 0.97 <= run.ratio <= 2.0, (run.seconds, run.predicted)
    # one device after another would take their summed load
    serial = sum(s.placement.loads) * s.micro_batches * UNIT_MS / 1e3
    assert min(run.seconds) < 0.75 * serial


def test_emulated_collectives_via_the_cli(tessel: Run) -> None:
    """M shape: blocks on every device (collectives) and latency-free edges, checked against one process."""
    rc, out, err = tessel("run", "--placement", "mshape", "--emulate", UNIT_MS, "--emulate-size", 64,
                          "--schedule", "1f1b", "-n", "4", "--steps", "2", "--check")
    assert rc == 0, out + err
    assert out.startswith("emulated on mshape-4 with 1f1b: 4 micro-batches of 2, 4 processes")
    m = re.search(r"predicted step ([\d.]+) s .* median measured step after the first ([\d.]+) s = ([\d.]+) x", out)
    assert m is not None, out
    predicted, measured, ratio = (float(x) for x in m.groups())
    assert predicted == pytest.approx(float(run_method("1f1b", library.build("mshape", 4), 4).makespan) * UNIT_MS / 1e3)
    assert 0.97 <= ratio <= 2.0 and measured == pytest.approx(predicted * ratio, rel=0.01)
    assert "check: loss and" in out and "every rank ran the schedule's order" in out


def test_latency_is_a_delivery_delay() -> None:
    """With latency, the predicted step includes it on every cross-device edge; the run keeps up."""
    s = run_method("1f1b", library.build("vshape", 2, latency=2), 4)
    assert s.errors() == []
    plain = replay_makespan(run_method("1f1b", library.build("vshape", 2), 4))
    assert replay_makespan(s) > plain
    run = run_emulated(s, UNIT_MS, steps=1, features=16)
    assert run.order_errors == () and 0.97 <= run.ratio <= 2.0, (run.seconds, run.predicted)


@pytest.mark.parametrize("unit", [0.0, -1.0, float("nan"), 1e9])
def test_a_bad_unit_is_refused(unit: float) -> None:
    with pytest.raises(ValueError, match="emulated time unit"):
        Emulation(unit)


@pytest.mark.parametrize("argv, message", [
    (["run", "--placement", "vshape"], "--model is required (or --emulate UNIT_MS"),
    (["run", "--model", "mlp", "--emulate", "0"], "--emulate"),
])
def test_emulate_usage_errors_are_one_line(argv: list[str], message: str, tessel: Run) -> None:
    rc, out, err = tessel(*argv)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_device_cuda_is_refused_in_one_line_without_cuda(tessel: Run) -> None:
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    rc, out, err = tessel("run", "--model", "mlp", "--device", "cuda", "--steps", "1")
    assert rc == 2 and err.startswith("tessel: error: --device cuda: CUDA is not available here")
    assert len(err.strip().splitlines()) == 1 and out == ""


class _LateHost(SleepingDevice):
    """A host that wakes `late` seconds after its device's previous task ended, every time (a loaded
    machine's sleeping process), instead of `ahead` before it."""
    late = 0.0

    def idle(self, ahead: float = 0.0) -> None:
        self._sleep(self.free_at + self.late - time.perf_counter())


def _late_hosts(ctx: Any, doc: dict[str, Any], unit_ms: float, late: float, steps: int) -> list[float]:
    import torch.distributed as dist

    from tessel.runtime.executor import Executor
    s = schedule_from_dict(doc)
    ex = example("emulated", s.placement, Config(features=64))
    blocks = {b: ex.build(b, None) for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)}
    pacer = _LateHost(s.placement, Emulation(unit_ms), ctx)
    pacer.late = late
    executor = Executor(lower(s), ctx, blocks, ex.feeds, pacer=pacer)
    batch = ex.batch(s.micro_batches, seed=1)
    times = []
    for _ in range(steps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        executor.run(batch)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return times[1:]


def test_a_host_waking_late_costs_no_device_time_when_its_inputs_are_in() -> None:
    """Every rank's host wakes a quarter unit after its device's task ended, its inputs long in: the
    device's clock keeps the schedule (the step ends one wake-up late, not one per task). Gloo's
    receives say is_completed() False until awaited, so a rule asking them first charged every
    late wake-up (GPipe on 8 ranks: 1.17 x its makespan on a loaded machine)."""
    unit = 40.0
    s = run_method("gpipe", library.build("vshape", 2), 4)
    assert s.errors() == []
    times = launch(_late_hosts, 2, (s.to_dict(), unit, 0.25 * unit / 1e3, 2), Options(timeout=120))[0]
    predicted = replay_makespan(s) * unit / 1e3
    tasks = sum(len(o) for o in lower(s).compute_orders())
    # charged at every task with a received input, the step would take 0.25 unit x those more
    assert min(times) <= predicted + 2 * 0.25 * unit / 1e3 + 0.02, (times, predicted, tasks)
