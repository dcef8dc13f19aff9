"""The public suite's cases travel with the repository (tests/data/suite.json, a copy of
../shared/bench/suite.json: a test checks they are equal when ../shared is there), so no test skips
for want of them. The independent checker lives in ../shared only: it is a second opinion, and a
test that needs it skips, naming the path it looked at, when that folder is missing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared"
SUITE = Path(__file__).resolve().parent / "data" / "suite.json"
SHARED_SUITE = SHARED / "bench" / "suite.json"
CHECKER = SHARED / "tools" / "check_schedule.py"


def suite_cases() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(SUITE.read_text())["cases"]
    return cases


def suite_case(name: str) -> dict[str, Any]:
    return next(c for c in suite_cases() if c["name"] == name)


def run_checker(path: Path | str) -> subprocess.CompletedProcess[str]:
    """`check_schedule.py PATH`: exit code and JSON verdict on stdout."""
    if not CHECKER.exists():
        pytest.skip(f"independent checker not found at {CHECKER}")
    return subprocess.run([sys.executable, str(CHECKER), str(path)], capture_output=True, text=True)


def checker_verdict(path: Path | str) -> dict[str, Any] | None:
    """The checker's verdict on a file it must find valid, or None without ../shared: a second
    opinion that a test's own assertions do not depend on."""
    if not CHECKER.exists():
        return None
    out = subprocess.run([sys.executable, str(CHECKER), str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    verdict: dict[str, Any] = json.loads(out.stdout)
    assert verdict["valid"], verdict
    return verdict
