"""bench/runtime_gpt2.py compares like with like: on a tiny GPT-2 over 2 gloo ranks, one step of
each variant through the bench's own worker gives the whole model's loss on one process (tessel
and 1F1B on the M shape, ours on the plain pipeline), the two M-shape variants the same
gradients, and our executor the gradients of torch's Schedule1F1B on the plain pipeline."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import runtime_gpt2 as bench  # noqa: E402

from tessel.runtime.hf import gpt2_batch, gpt2_loss, gpt2_model  # noqa: E402
from tessel.runtime.launch import Options, launch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow]  # every test starts processes


def test_bench_variants_compute_the_same_step() -> None:
    m = bench.Model(layers=4, dim=32, heads=4, vocab=64, seq=8, micro_batch_size=1)
    costs = {"embed": (1.0, 1.0), "stage": (4.0, 6.0), "head": (2.0, 4.0)}
    s = bench.schedules(m, 2, 4, costs)
    assert s["tessel"].meta.get("method") != "1f1b" and s["tessel"].placement == s["1f1b"].placement
    res = launch(bench.worker, 2, (m, {k: v.to_dict() for k, v in s.items()}, 1, 0), Options(timeout=300))
    reference = float(gpt2_loss(gpt2_model(m.config(), seed=0), gpt2_batch(m.config(), 4, m.seq, seed=1)).detach())
    for r in res:
        assert all(len(t) == 1 for t in r["times"].values())
        assert set(r["losses"]) == {"tessel", "1f1b-M", "ours-V"}
        for loss in r["losses"].values():
            assert loss == pytest.approx(reference, rel=1e-5)
        assert r["grad_M"] < 1e-5 and r["grad_V"] < 1e-6
