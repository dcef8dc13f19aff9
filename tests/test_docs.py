"""Every Python block of README.md and docs/*.md runs as written, each on its own (as pasted).

A block that builds a `Pipeline` runs where its text says it runs: on every rank of a job, here
the processes of tessel's local launcher (as many as the block's `devices=`, else 4). A block
that only defines `train(ctx)` (the tutorial) is then trained, as `examples/own_model.py` does.
Every other block runs in this process, in a temporary directory (it may write files).
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[tuple[str, str]]:
    """(page:number, code) of every fenced python block."""
    return [(f"{page.relative_to(ROOT)}:{i + 1}", code) for page in PAGES
            for i, code in enumerate(FENCE.findall(page.read_text()))]


BLOCKS = python_blocks()
DISTRIBUTED = [(name, code) for name, code in BLOCKS if "Pipeline(" in code]
LOCAL = [(name, code) for name, code in BLOCKS if "Pipeline(" not in code]


def test_the_pages_have_python_blocks() -> None:
    """The fence pattern still finds the blocks (a changed fence would make the tests below vacuous)."""
    names = [n for n, _ in BLOCKS]
    assert len(BLOCKS) >= 4 and {"README.md:1", "docs/runtime.md:1"} <= set(names), names
    assert all(code.strip() for _, code in BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("name,code", LOCAL, ids=[n for n, _ in LOCAL])
def test_block_runs(name: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(code, name, "exec"), namespace)  # the repository's own docs, nothing from outside
    schedules = [v for v in namespace.values() if type(v).__name__ == "Schedule"]
    assert all(s.errors() == [] for s in schedules)


def run_block(ctx: Any, name: str, code: str) -> list[float]:
    """One rank: the block as written, then `train(ctx)` when it defines one; its losses, or the
    makespan of the schedule its pipeline agreed on."""
    namespace: dict[str, Any] = {"__name__": "__doc_block__"}
    exec(compile(code, name, "exec"), namespace)
    if "train" in namespace:
        return [float(v) for v in namespace["train"](ctx)]
    if "loss" in namespace:
        return [float(namespace["loss"])]
    schedule = namespace["pipe"].schedule  # a block that only builds a pipeline: the schedule it agreed on
    assert schedule.errors() == []
    return [float(schedule.makespan)]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name,code", DISTRIBUTED, ids=[n for n, _ in DISTRIBUTED])
def test_pipeline_block_runs_on_every_rank(name: str, code: str) -> None:
    pytest.importorskip("torch")
    from tessel.runtime.launch import Options, launch
    m = re.search(r"devices=(\d+)", code)
    ranks = int(m.group(1)) if m else 4
    results = launch(run_block, ranks, (name, code), Options(timeout=300))
    assert len(results) == ranks
    assert all(r == results[0] for r in results), results  # every rank: the same mean loss (or schedule)
    assert results[0] and all(math.isfinite(v) and v > 0 for v in results[0]), results[0]
