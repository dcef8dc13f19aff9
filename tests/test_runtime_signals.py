"""Stopping `tessel run`: its ranks never outlive the launcher; a user's interrupt is one line."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(300)]  # a hang is what these tests catch: fail it early

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
LONG_RUN = [sys.executable, "-m", "tessel", "run", "--model", "mlp", "--schedule", "gpipe", "-n", "4",
            "--steps", "100000", "--timeout", "100"]


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for k in children.get(todo.pop(), []):
            out.append(k)
            todo.append(k)
    return out


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start() -> tuple[subprocess.Popen[str], list[int]]:
    """The launcher, once its fork server and four ranks run (and a moment more, to be training)."""
    p = subprocess.Popen(LONG_RUN, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, env=ENV, cwd=ROOT)
    deadline = time.monotonic() + 120
    while len(_descendants(p.pid)) < 5 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    time.sleep(2)
    procs = _descendants(p.pid)
    assert len(procs) >= 5, (procs, p.poll())
    return p, procs


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [q for q in pids if _running(q)]
        if not left:
            return []
        time.sleep(0.2)
    return [q for q in pids if _running(q)]


@pytest.mark.parametrize("sig,group,code", [(signal.SIGTERM, False, 143), (signal.SIGINT, True, 130)])
def test_an_interrupted_run_stops_its_ranks_and_says_one_line(sig: signal.Signals, group: bool, code: int) -> None:
    p, procs = _start()
    if group:
        os.killpg(p.pid, sig)  # Ctrl-C in a terminal: the whole process group
    else:
        os.kill(p.pid, sig)
    _, err = p.communicate(timeout=60)
    assert p.returncode == code, err
    assert err == "tessel: interrupted\n", err  # no C++ stack traces, no Python traceback
    assert _gone_within(procs, 10) == []


def test_ranks_end_when_their_launcher_is_killed_outright() -> None:
    p, procs = _start()
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    # each rank notices its store is gone (comm.LOST_POLLS polls) and ends, well within --timeout 100
    assert _gone_within(procs, 30) == []


@pytest.mark.parametrize("argv,message", [
    (["run", "--model", "mlp", "--timeout", "0"], "--timeout: --timeout must be a finite number > 0 and at most 1e+06 (seconds), got '0'"),
    (["run", "--model", "mlp", "--timeout", "-1"], "--timeout: --timeout must be a finite number > 0"),
    (["run", "--model", "mlp", "--timeout", "nan"], "--timeout: --timeout must be a finite number > 0"),
])
def test_bad_timeouts_are_refused_before_launching(argv: list[str], message: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tessel", *argv], capture_output=True, text=True, env=ENV,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
