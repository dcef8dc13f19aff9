"""`tessel run`: launches, trains, checks against one process; under torchrun each process is a rank."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tessel import library
from tessel.cli import main
from tessel.cli.runtime import _verdict
from tessel.methods import run_method
from tessel.runtime.train import RankReport, StepReport

pytestmark = pytest.mark.torch


@pytest.mark.slow
def test_run_with_check(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "--model", "kshape", "--schedule", "tessel", "--micro-batches", "4", "--steps", "2",
               "--check"])
    out = capsys.readouterr().out
    assert rc == 0, out
    lines = out.splitlines()
    assert lines[0] == "kshape on kshape-4 with tessel: 4 micro-batches of 2, 4 processes"
    assert lines[1].split() == ["step", "loss", "seconds", "reference", "loss", "max", "grad", "error"]
    assert [line.split()[0] for line in lines[2:4]] == ["1", "2"]
    assert lines[2].split()[1] == lines[2].split()[3]  # loss == reference loss, 6 decimals
    assert out.rstrip().splitlines()[-1].startswith("check: loss and ")
    assert out.rstrip().endswith("every rank ran the schedule's order")


@pytest.mark.slow
def test_run_a_schedule_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.json"
    run_method("gpipe", library.build("vshape", 4), 4).save(path)
    assert main(["run", "--model", "mlp", "--schedule", str(path), "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("mlp on vshape-4 with gpipe: 4 micro-batches of 2, 4 processes")
    assert "most forward graphs alive per rank: 4,4,4,4" in out  # GPipe keeps every micro-batch
    memory = next(line for line in out.splitlines() if line.startswith("peak activation memory per rank"))
    found = re.search(r"declared ([\d.,]+); measured ([\d.,]+) ", memory)
    assert found, memory
    declared, measured = found.groups()
    assert declared == "4,4,4,4"
    # the same unit and rank order: each rank's measured peak near its declared 4 units (mlp blocks
    # differ in what they keep: the first reads features, the last keeps its classifier too)
    assert all(abs(float(m) - 4) <= 1.5 for m in measured.split(",")), memory
    assert main(["run", "--model", "mlp", "--schedule", str(path), "--placement", "vshape"]) == 2
    assert "do not give --placement too" in capsys.readouterr().err
    assert main(["run", "--model", "mlp", "--schedule", str(path), "--devices", "2"]) == 2
    assert capsys.readouterr().err == "tessel: error: --schedule FILE has 4 devices, not --devices 2\n"


def test_programs_are_printed_without_running(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--model", "gpt", "--placement", "mshape", "--micro-batches", "2", "--programs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("programs of mshape-4: 2 micro-batches, 4 ranks")
    assert "forward fA0#0" in out and "send grad fA0->f0#0 to 1" in out


@pytest.mark.parametrize("argv,message", [
    (["--model", "gpt", "--placement", "kshape"], "model gpt needs a chain of forward blocks"),
    (["--model", "mlp", "--schedule", "nonsense"], "unknown method 'nonsense'"),
    (["--model", "mlp", "--placement", "vshape", "--devices", "3", "--schedule", "interleaved"],
     "interleaved"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessel: error: ") and message in err and err.count("\n") == 1, err


def test_model_names_without_torch_match_the_models() -> None:
    from tessel.cli.runtime import MODEL_NAMES
    from tessel.runtime.networks import MODELS
    assert MODEL_NAMES == tuple(MODELS)


def test_verdict_fails_on_a_mismatch(capsys: pytest.CaptureFixture[str]) -> None:
    good = StepReport({"f1": 2.0}, 0.1, 1, {"f1": 2.0}, 1e-7, 3)
    bad = StepReport({}, 0.1, 1, {"f1": 2.0}, 1e-3, 3)  # a 0.1% gradient error
    off = StepReport({"f1": 2.002}, 0.1, 1, {"f1": 2.0}, 0.0, 3)  # a 0.1% loss error
    assert _verdict([RankReport(0, ("f0",), (good,))]) == 0
    assert _verdict([RankReport(0, ("f0",), (good,)), RankReport(1, ("f1",), (bad,))]) == 1
    assert "check FAILED: step 1, rank 1: relative gradient error 0.001 in a parameter" in capsys.readouterr().err
    assert _verdict([RankReport(0, ("f1",), (off,))]) == 1
    assert "step 1, rank 0: relative loss error 0.001" in capsys.readouterr().err
    wrong = RankReport(0, ("f0",), (good,), order_errors=("rank 0: task 1 ran f0#1, the schedule has b0#0",))
    assert _verdict([wrong]) == 1
    assert "check FAILED: rank 0: task 1 ran f0#1" in capsys.readouterr().err


@pytest.mark.parametrize("mine,ref,grad,named", [
    (float("nan"), 2.0, 0.0, "the pipeline's loss of block f1 is nan"),
    (2.0, float("nan"), 0.0, "the single-process run's loss of block f1 is nan"),
    (float("inf"), 2.0, 0.0, "the pipeline's loss of block f1 is inf"),
    (2.0, 2.0, float("nan"), "relative gradient error nan in f1.weight"),
])
def test_verdict_fails_on_nan_or_inf_on_either_side(mine: float, ref: float, grad: float, named: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Python's max() drops a NaN that is not first: the check must not (issue 22, item 4)."""
    good = StepReport({"f1": 2.0}, 0.1, 1, {"f1": 2.0}, 0.0, 3)
    step = StepReport({"f1": mine}, 0.1, 1, {"f1": ref}, grad, 3, worst="f1.weight")
    assert _verdict([RankReport(0, ("f1",), (good, step))]) == 1
    err = capsys.readouterr().err
    assert f"check FAILED: step 2, rank 0: {named}" in err, err


@pytest.mark.slow
def test_run_check_fails_when_training_diverges_to_nan() -> None:
    """--lr 1e6 (the largest accepted; inf is refused up front): by step 3 both sides compute NaN;
    the check names the step and fails (exit 1)."""
    r = subprocess.run([sys.executable, "-m", "tessel", "run", "--model", "mlp", "--placement", "vshape",
                        "--devices", "2", "-n", "2", "--steps", "3", "--schedule", "1f1b", "--lr", "1e6",
                        "--check"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 1, (r.stdout, r.stderr[-2000:])
    assert "check FAILED: step " in r.stderr and "is nan" in r.stderr, r.stderr
    assert "match the single-process run" not in r.stdout


@pytest.mark.slow
def test_under_torchrun() -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc-per-node", "2", "-m", "tessel", "run", "--model", "mlp",
           "--placement", "vshape", "--devices", "2", "--micro-batches", "2", "--steps", "1", "--check"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("check: loss and 14 parameter gradients per step match") == 1  # rank 0 prints


def test_n_is_micro_batches(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--model", "gpt", "--placement", "mshape", "-n", "2", "--programs"]) == 0
    assert capsys.readouterr().out.startswith("programs of mshape-4: 2 micro-batches")


@pytest.mark.slow
def test_a_failed_run_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--model", "mlp", "--schedule", "gpipe", "--timeout", "0.01"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tessel: run failed: the job ran past its timeout of 0.01 s"), err


def test_profile_on_an_unknown_device_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "mlp", "--device", "tpu", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "tessel: error: --device must be cpu, cuda or cuda:N, got 'tpu'\n", err
    assert not out.exists()


def test_a_gpipe_order_fails_a_tessel_check() -> None:
    from tessel.runtime.program import lower
    from tessel.runtime.train import order_errors
    placement = library.build("vshape", 4)
    gpipe, searched = run_method("gpipe", placement, 4), run_method("tessel", placement, 4)
    ran = lower(gpipe).compute_orders()  # what an executor of the GPipe programs runs, rank by rank
    assert all(order_errors(gpipe, r, ran[r]) == [] for r in range(4))
    errors = [e for r in range(4) for e in order_errors(searched, r, ran[r])]
    assert errors and all(re.match(r"rank \d: task \d+ ran [fb]\d#\d, the schedule has", e) for e in errors), errors
