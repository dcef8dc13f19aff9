"""Ideas with one home stay there: a cheap scan of the sources for the copies that were removed.

Each pattern below is the tell-tale line of a helper that now lives in one module (graph.py,
key.py, numeric.py, Schedule.kernel); a copy elsewhere would drift apart from it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

TESSEL = Path(__file__).resolve().parents[1] / "tessel"

ONE_HOME = [
    # (what, the pattern of a copy, the one module allowed to hold it)
    ("the task key", r"^Key = ", "key.py"),
    ("the repetend window test", r"\.start - EPS <= .*< .*\.end - EPS", "schedule.py"),
    ("Kahn's in-degree walk", r"indeg\[\w+\] -= 1", "graph.py"),
    ("union-find", r"root\[x\] = root\[root\[x\]\]", "graph.py"),
    ("the ancestor closure", r"\.union\(\*\(\{a\} \| anc\[a\]", "graph.py"),
    ("the integer snap", r"int\(round\(x\)\) if abs\(x - round\(x\)\) < EPS", "numeric.py"),
    ("the 1F1B pair loop", r"order \+= \[fwd\[warm \+ \w+\], bwd\[\w+\]\]", "baselines/shapes.py"),
    ("one schedule on every rank", r"the ranks hold different schedules", "runtime/share.py"),
    ("the schedule's canonical JSON", r"json\.dumps\(\w+(\.to_dict\(\))?, sort_keys=True", "runtime/share.py"),
    ("is it a file or a name", r"def \w*is_file\w*\(", "io.py"),
    ("the validity rules", r"def _rule1\(", "rules.py"),
]
MAX_LINES = 450  # a module longer than this does more than one job: split it along them


@pytest.mark.parametrize("what,pattern,home", ONE_HOME, ids=[w for w, _, _ in ONE_HOME])
def test_helper_has_one_home(what: str, pattern: str, home: str) -> None:
    rx = re.compile(pattern, re.M)
    holders = sorted(str(f.relative_to(TESSEL)) for f in TESSEL.rglob("*.py") for _ in rx.finditer(f.read_text()))
    assert holders == [home], f"{what} is written {len(holders)} times, in {holders}; once, in {home}, is enough"


def test_no_module_is_over_the_line_limit() -> None:
    # tessel/search/ is left to the search's own split (issue 20's passes); include it once that lands
    lines = {str(f.relative_to(TESSEL)): len(f.read_text().splitlines()) for f in sorted(TESSEL.rglob("*.py"))
             if f.relative_to(TESSEL).parts[0] != "search"}
    assert len(lines) > 50, "the walk found too few modules"
    assert {f: n for f, n in lines.items() if n > MAX_LINES} == {}
