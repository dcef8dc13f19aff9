"""The suite's own rules: torch tests skip without torch, every search in a test is time-limited.

What a newcomer relies on when running `make test-fast` or the suite without the torch extra.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
# a module needs torch when it imports (at its top level) torch or a torch module of the runtime
NEEDS_TORCH = re.compile(r"^(import torch|from torch|from tessel\.runtime\.(?!program|dataflow|pipelining)\w+ import"
                         r"|from tessel\.runtime import (?!dataflow|lower|program))", re.M)
HIDE_TORCH = '''
import sys
from importlib.abc import MetaPathFinder

class HideTorch(MetaPathFinder):
    """`import torch` (or transformers) fails as it does where the extra is not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, HideTorch())
'''


def _modules() -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(TESTS.glob("test_*.py")) if f.name != Path(__file__).name}


def test_torch_modules_skip_first_and_are_marked() -> None:
    """A module that needs torch asks for it before its imports (pytest.importorskip) and is marked."""
    needing = {name for name, text in _modules().items() if NEEDS_TORCH.search(text)}
    assert {"test_runtime_api.py", "test_profiler.py"} <= needing, sorted(needing)  # the scan still finds them
    for name in sorted(needing):
        text = _modules()[name]
        skip = text.find('pytest.importorskip("torch")')
        first = NEEDS_TORCH.search(text)
        assert first is not None and 0 <= skip < first.start(), f"{name}: pytest.importorskip(\"torch\") first"
        assert re.search(r"^pytestmark = \[?pytest.mark.torch", text, re.M), f"{name}: mark it pytest.mark.torch"


def _calls(text: str, name: str) -> list[str]:
    """The argument text of every call `name(...)` (not `x.name(`, not a definition)."""
    out = []
    for m in re.finditer(rf"(?<![\w.]){name}\(", text):
        line = text[text.rfind("\n", 0, m.start()) + 1:m.start()]
        if "def " in line:
            continue
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += (text[j] in "([{") - (text[j] in ")]}")
            j += 1
        out.append(text[m.end():j - 1])
    return out


def test_every_search_in_a_test_has_a_time_limit() -> None:
    """A search that misses its bound runs to its limit: the default (minutes) is no test's to spend."""
    calls = {name: _calls(text, "search") for name, text in _modules().items()}
    assert sum(map(len, calls.values())) >= 20, "the scan found too few search() calls"
    missing = [f"{name}: search({args[:60]})" for name, found in calls.items() for args in found
               if args.strip() and "time_limit" not in args]
    assert missing == []


@pytest.mark.slow
def test_collection_without_torch_skips_the_torch_modules(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(HIDE_TORCH)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:cacheprovider",
                          str(TESTS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    skipped = set(re.findall(r"SKIPPED \[\d+\] tests/(test_\w+\.py):\d+: could not import 'torch'", run.stdout))
    marked = {name for name, text in _modules().items() if re.search(r"^pytestmark = \[?pytest.mark.torch", text, re.M)}
    assert marked and marked <= skipped, (sorted(marked - skipped), run.stdout[-2000:])
