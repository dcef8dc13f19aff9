"""A Hugging Face GPT-2 (from a config, random weights) on the M shape, 4 gloo ranks: the example
script trains it by a searched tessel schedule and matches the whole model on one process; a run
stopped after a checkpoint and resumed gives the losses of a run that never stopped."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tessel.runtime.launch import Options, launch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import gpt2_pipeline  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # every test starts processes

TINY = dict(layers=4, dim=32, heads=4, vocab=64, seq=8, micro_batches=8, micro_batch_size=1)


def test_gpt2_example_matches_one_process() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "gpt2_pipeline.py"), "--steps", "2", "--check",
                          "--seq", "8", "--micro-batch-size", "1", "--rtol", "1e-4"],
                         capture_output=True, text=True, env=env, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    errors = [float(x) for x in re.findall(r"max grad rel err ([\d.e+-]+)", run.stdout)]
    assert len(errors) == 2 and max(errors) < 1e-4
    first = re.search(r"step 0: loss ([\d.]+) .* reference ([\d.]+)", run.stdout)
    assert first is not None and first.group(1) == first.group(2)


def resume(ctx: Any, directory: str) -> tuple[list[float], list[float]]:
    args = gpt2_pipeline.Args(steps=3, **TINY)  # type: ignore[arg-type]
    straight = [s.loss for s in gpt2_pipeline.train(ctx, args)]
    stopped = gpt2_pipeline.train(ctx, gpt2_pipeline.Args(steps=2, save=directory, **TINY))  # type: ignore[arg-type]
    resumed = gpt2_pipeline.train(ctx, gpt2_pipeline.Args(steps=1, resume=directory, **TINY))  # type: ignore[arg-type]
    return straight, [s.loss for s in stopped + resumed]


def test_checkpoint_round_trip_reproduces_the_losses(tmp_path: Path) -> None:
    results = launch(resume, 4, (str(tmp_path / "ckpt"),), Options(timeout=400))
    straight, resumed = results[0]
    assert len(straight) == 3 and straight == resumed  # bit for bit
    assert (tmp_path / "ckpt" / ".metadata").is_file()
    assert len({tuple(r[0]) for r in results}) == 1  # every rank reports the same losses
