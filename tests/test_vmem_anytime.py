"""v-mem anytime (baselines/vmem.py): past a deadline set around the build, the shortest block
timed by then where the first timings cover every micro-batch, OutOfTime where they do not."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from shared_files import checker_verdict

from tessel import library
from tessel.baselines import BASELINES, BaselineError
from tessel.baselines import vmem as vmem_module
from tessel.baselines.deadline import OutOfTime, until
from tessel.placement import Placement

V_HALF = 6  # chunk activations a device at p = 4: V-Half's memory


def profiled(p: int) -> Placement:
    """zbv with the zero-bubble repository's profile (a chunk: half a stage) and its latency."""
    return library.zbv(p, forward=0.5, backward=0.488, weight=0.252, latency=0.032)


def stopping_after(timings: int) -> Callable[..., Any]:
    """fill_weights as it is, until `timings` walks have run: then OutOfTime, as at a deadline
    (the deadline itself is a wall clock: this stands for it at a fixed point of the build)."""
    real = vmem_module.fill_weights
    done = [0]

    def walk(*args: Any, **kwargs: Any) -> Any:
        if done[0] >= timings:
            raise OutOfTime("stopped at the race's deadline (the search's clock)")
        done[0] += 1
        return real(*args, **kwargs)
    return walk


def test_stopped_where_the_first_timings_cover_every_micro_batch_it_keeps_the_best_so_far(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    z = profiled(4)
    full = BASELINES["v-mem"](z, 8, V_HALF)  # 8 micro-batches: the first timings are of all of them
    monkeypatch.setattr(vmem_module, "fill_weights", stopping_after(3))
    s = BASELINES["v-mem"](z, 8, V_HALF)
    assert s.errors() == [] and max(s.peak_memory) <= V_HALF
    assert s.makespan >= full.makespan - 1e-9  # the best of three blocks, never shorter than of all
    s.save(tmp_path / "s.json")
    checker_verdict(tmp_path / "s.json")


def test_stopped_before_every_micro_batch_was_timed_it_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vmem_module, "fill_weights", stopping_after(3))
    with pytest.raises(BaselineError):  # 16 micro-batches: the first timings are of 12
        BASELINES["v-mem"](profiled(4), 16, V_HALF)


def test_a_deadline_already_past_stops_the_build() -> None:
    with until(time.perf_counter() - 1), pytest.raises(BaselineError):
        BASELINES["v-mem"](profiled(16), 32, 18)
