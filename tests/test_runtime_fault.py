"""Faults stop every rank quickly with a message naming rank, instruction, block and micro-batch."""
from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest

pytest.importorskip("torch")

import torch

from tessel import library
from tessel.methods import run_method
from tessel.runtime.comm import make_groups
from tessel.runtime.executor import Executor
from tessel.runtime.launch import GRACE_SECONDS, LaunchError, Options, launch
from tessel.runtime.networks import example
from tessel.runtime.program import lower
from tessel.schedule import schedule_from_dict

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]  # a hang is what these tests catch: fail it early

FAST = Options(timeout=60, pg_timeout=20)
# how long a hung rank would sleep: far longer than stopping takes, so that a rank's note (what
# stopped it) tells a stopped job from one that ran out its sleep; no test measures elapsed time
SLEEP = 5.0 * (3 + GRACE_SECONDS)


class Failing(torch.nn.Module):
    """Runs the block, but raises on the micro-batch `at` (call 0 is the shape pass)."""

    def __init__(self, inner: torch.nn.Module, at: int) -> None:
        super().__init__()
        self.inner, self.at, self.calls = inner, at, 0

    def forward(self, *args: Any) -> Any:
        self.calls += 1
        if self.calls == self.at + 2:
            raise RuntimeError("deliberate failure")
        return self.inner(*args)


def _train_once(ctx: Any, model: str, doc: dict[str, Any], fail: tuple[str, int, int] | None,
                bad_field: str | None) -> str:
    s = schedule_from_dict(doc)
    ex = example(model, s.placement)
    make_groups(ctx, [b.devices for b in s.placement.blocks])
    blocks: dict[str, torch.nn.Module] = {b: ex.build(b, ctx.group(ex.flow.devices(b)) if len(ex.flow.devices(b)) > 1 else None)
              for b in ex.flow.forwards if ctx.rank in ex.flow.devices(b)}
    if fail is not None and ctx.rank == fail[2]:
        blocks[fail[0]] = Failing(blocks[fail[0]], fail[1])
    batch = ex.batch(2 * s.micro_batches)
    if bad_field is not None:
        batch[bad_field] = batch[bad_field][:, :-1]  # one feature short
    Executor(lower(s), ctx, blocks, ex.feeds).run(batch)
    return "finished"


def _sleeper(ctx: Any, seconds: float, recv_from: int | None) -> str:
    """Every rank sleeps, except rank 0 when it waits for a message `recv_from` never sends."""
    if recv_from is not None and ctx.rank == 0:
        torch.distributed.recv(torch.zeros(1), recv_from)
    else:
        time.sleep(seconds)
    return "finished"


def _failure(fn: Any, args: tuple[Any, ...], options: Options) -> str:
    with pytest.raises(LaunchError) as e:
        launch(fn, 4, args, options)
    return str(e.value)


def test_failing_tensor_parallel_block_stops_every_rank() -> None:
    """Rank 1 fails inside the head, which runs on all ranks: the others sit in its collective."""
    s = run_method("1f1b", library.build("mllm", 4), 4)
    msg = _failure(_train_once, ("gpt", s.to_dict(), ("fA1", 1, 1), None), FAST)
    lines = msg.splitlines()
    assert lines[0].startswith("rank 1: instruction ") and lines[0].endswith(
        "(forward fA1#1) failed: RuntimeError: deliberate failure"), lines[0]
    for r in (0, 2, 3):
        assert any(line.strip().startswith(f"rank {r} stopped at instruction ") and "rank 1 failed" in line
                   for line in lines), msg
    assert "imed out" not in msg, msg  # stopped by the abort note, not by a timeout


def test_bad_input_shape_names_the_first_block() -> None:
    s = run_method("gpipe", library.build("vshape", 4), 4)
    msg = _failure(_train_once, ("mlp", s.to_dict(), None, "x"), FAST)
    first = msg.splitlines()[0]
    assert first.startswith("rank 0: shape pass, instruction 0 (forward f0#0) failed: RuntimeError:"), first
    assert "shapes cannot be multiplied" in first
    # a rank slower to start (a loaded machine) is stopped before its shape pass: either stage is true
    assert all(re.search(f"rank {r} stopped at (shape pass|start-up)", msg) for r in (1, 2, 3)), msg
    assert "imed out" not in msg, msg


def test_a_missing_message_times_out() -> None:
    """Rank 0 waits for a message rank 2 never sends: the process-group timeout ends the wait."""
    msg = _failure(_sleeper, (SLEEP, 2), Options(timeout=2 * SLEEP, pg_timeout=2))
    assert msg.startswith("rank 0:") and "imed out" in msg.splitlines()[0], msg
    assert all(f"rank {r} stopped at start-up: rank 0 failed" in msg for r in (1, 2, 3)), msg
    assert "finished" not in msg, msg  # the sleepers were stopped, not waited for


def test_the_job_timeout_stops_a_hung_job() -> None:
    msg = _failure(_sleeper, (2 * SLEEP, None), Options(timeout=3, pg_timeout=SLEEP))
    assert msg.startswith("the job ran past its timeout of 3 s"), msg
    assert all(f"rank {r} stopped at start-up: the launcher stopped the job" in msg for r in range(4)), msg
    assert "finished" not in msg and "imed out" not in msg, msg  # neither the sleep nor the process-group timeout


def test_a_job_that_finishes_past_its_timeout_failed() -> None:
    """Ranks that finish before their first look at the abort note (every 0.1 s) still ran past the
    wall clock: the job fails with the timeout, it does not return their results."""
    msg = _failure(_sleeper, (0.0, None), Options(timeout=0.001, pg_timeout=SLEEP))
    assert msg.startswith("the job ran past its timeout of 0.001 s"), msg


def _crasher(ctx: Any) -> str:
    """Rank 1 dies outright (no note of its own) while rank 0 waits for its message."""
    if ctx.rank == 1:
        os._exit(3)
    torch.distributed.recv(torch.zeros(1), 1)
    return "finished"


def test_a_crashed_peer_leads_even_when_the_launcher_is_slow_to_note_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1's hard exit closes rank 0's connection at once; the launcher's note comes when it next
    runs, 1.5 s late here as on a loaded machine. Rank 0 waits for that note (launch.NOTE_WAIT), not a
    guessed half second, so the crash leads and rank 0 reports that it stopped because of it."""
    from tessel.runtime import launch as launcher
    real = launcher._abort

    def slow(store: Any, message: str) -> None:
        time.sleep(1.5)
        real(store, message)
    monkeypatch.setattr(launcher, "_abort", slow)
    with pytest.raises(LaunchError) as e:
        launch(_crasher, 2, (), Options(timeout=60, pg_timeout=20))
    lines = str(e.value).splitlines()
    assert lines[0] == "rank 1 exited with code 3", lines
    assert any(line.strip() == "rank 0 stopped at start-up: the launcher stopped the job" for line in lines), lines


def test_only_a_lost_connection_waits_for_a_note() -> None:
    from tessel.errors import TesselError
    from tessel.runtime.launch import peer_gone
    gloo = "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:24474. This is typically ..."
    assert peer_gone(RuntimeError(gloo)) and peer_gone(ConnectionResetError("x")) and peer_gone(BrokenPipeError())
    assert not peer_gone(RuntimeError("deliberate failure")) and not peer_gone(RuntimeError("Timed out after 2 s"))
    assert not peer_gone(TesselError("connection closed"))


def test_an_instruction_cut_off_by_a_peer_waits_for_the_peer_s_note() -> None:
    """The executor names the instruction that failed (an ExecutionError around gloo's error): a
    peer's exit is still a consequence, so the rank waits for the peer's reason instead of racing it
    to the abort note with its own (a forged store value on rank 0 was once reported as rank 1's
    connection reset)."""
    from tessel.errors import ExecutionError
    from tessel.runtime.launch import peer_gone

    def wrapped(cause: Exception) -> ExecutionError:
        try:
            raise ExecutionError(f"rank 1: shape pass, instruction 1 (forward f1#0) failed: {cause}") from cause
        except ExecutionError as e:
            return e
    gloo = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:2980: Connection reset by peer."
    assert peer_gone(wrapped(RuntimeError(gloo))) and peer_gone(wrapped(ConnectionResetError("x")))
    assert not peer_gone(wrapped(RuntimeError("deliberate failure")))
    assert not peer_gone(wrapped(ExecutionError("step ended with state left over")))
