"""Under torchrun: a named method is searched once and shared; data parallelism beside the pipeline."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tessel.cli import main

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # every test starts processes

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_single_node_searches_once_and_every_rank_runs_it() -> None:
    cmd = [TORCHRUN, "--standalone", "--nproc-per-node", "4", "-m", "tessel", "run", "--model", "mlp",
           "--placement", "vshape", "--schedule", "tessel", "-n", "4", "--steps", "1", "--check", "--timeout", "120"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("check: loss and ") == 1, r.stdout  # only global rank 0 prints
    assert "every rank ran the schedule's order" in r.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_nodes_on_localhost_with_two_replicas_match_one_process() -> None:
    """Two torchrun invocations (nodes 0 and 1), 2 processes each: 2 replicas x 2 pipeline ranks."""
    port = _free_port()
    procs = [subprocess.Popen(
        [TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2", "--master-addr",
         "127.0.0.1", "--master-port", str(port), "-m", "tessel", "run", "--model", "mlp", "--placement",
         "vshape", "--devices", "2", "--data-parallel", "2", "--schedule", "1f1b", "-n", "4", "--steps", "2",
         "--check", "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT) for node in (0, 1)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert outs[0][0].count("check: loss and ") == 1, outs[0][0]
    assert "check" not in outs[1][0]


def test_data_parallel_2_x_pipeline_2_matches_one_process(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--model", "gpt", "--placement", "vshape", "--devices", "2", "--data-parallel", "2",
               "--schedule", "1f1b", "-n", "2", "--steps", "2", "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.startswith("gpt on vshape-2 with 1f1b: 2 micro-batches of 2, 2 processes x 2 replicas")
    assert "check: loss and " in out


def test_a_schedule_file_that_differs_between_nodes_is_refused(tmp_path: Path) -> None:
    from tessel import library
    from tessel.methods import run_method
    files = []
    for node, method in enumerate(("1f1b", "gpipe")):
        files.append(tmp_path / f"node{node}.json")
        run_method(method, library.build("vshape", 2), 4).save(files[-1])
    port = _free_port()
    procs = [subprocess.Popen(
        [TORCHRUN, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr",
         "127.0.0.1", "--master-port", str(port), "-m", "tessel", "run", "--model", "mlp", "--schedule",
         str(files[node]), "--steps", "1", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT) for node in (0, 1)]
    outs = [p.communicate(timeout=200) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode != 0
        assert "the ranks hold different schedules" in err, err[-2000:]
