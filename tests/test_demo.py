"""The tour of `make demo`, on one small case: every file it names exists and reads back."""
from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from tessel.demo import Case, tour
from tessel.schedule import Schedule


@pytest.mark.slow
def test_tour_writes_a_report_with_its_pictures_tables_schedules_and_traces(tmp_path: Path) -> None:
    said: list[str] = []
    report = tour(tmp_path, cases=(Case("kshape", "K shape", 6),), micro_batches=4, sizes=(4, 8),
                  time_limit=5.0, say=said.append)
    text = report.read_text()
    assert report == tmp_path / "report.md" and said
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert "kshape/compare.png" in images and "scaling-kshape.png" in images
    assert len(images) >= 3  # comparison, scaling and at least one Gantt chart
    for rel in images:
        img = mpimg.imread(str(tmp_path / rel))
        assert img.shape[0] > 200 and img.shape[1] > 400
        assert np.mean(np.any(img[..., :3] < 0.9, axis=-1)) > 0.02, rel  # something drawn
    table = [line for line in text.splitlines() if line.startswith("| ")]
    methods = {line.split("|")[1].strip() for line in table[1:]}
    assert {"tessel", "1f1b", "greedy"} <= methods
    assert "kshape/tessel.png" in images  # the searched schedule is pictured
    links = re.findall(r"\]\(([^)]+\.json)\)", text)
    assert links
    for rel in links:
        path = tmp_path / rel
        if rel.endswith(".trace.json"):
            assert any(e["ph"] == "X" for e in json.loads(path.read_text())["traceEvents"])
        else:
            s = Schedule.load(path, check=True)  # the four rules
            assert s.micro_batches == 4 and s.memory_limit == (6,) * 4
