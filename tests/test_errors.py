"""The one error family: every exception class tessel defines is a TesselError.

The CLI turns a TesselError into one line and exit 2 and treats anything else as a bug, so a
class outside the family would print a traceback for bad input. The runtime's classes joined the
family; those that were a TypeError or RuntimeError still are one, for older callers.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import tessel
from tessel.errors import TesselError

TESSEL = Path(tessel.__file__).resolve().parent
# not errors, each with the reason: control flow that never leaves its module (none today; signals
# are KeyboardInterrupts, outside Exception, and left out by the walk)
NOT_ERRORS: dict[str, str] = {}
OPTIONAL = ("torch", "transformers")  # extras: a module needing one is skipped without it


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(tessel.__path__, "tessel."))


def _exception_classes() -> tuple[list[type[Exception]], list[str]]:
    found, skipped = [], []
    for name in _modules():
        if name.endswith(".__main__"):  # runs the CLI when imported
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] not in OPTIONAL:
                raise
            skipped.append(name)
            continue
        found += [c for _, c in inspect.getmembers(module, inspect.isclass)
                  if issubclass(c, Exception) and c.__module__ == name]  # not signals (KeyboardInterrupt)
    return found, skipped


def test_every_exception_class_is_a_tessel_error() -> None:
    classes, skipped = _exception_classes()
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    # the runtime's seven, found by the walk (so the walk reaches them when torch is installed)
    if "tessel.runtime.pipeline" not in skipped:
        runtime = {"PipelineError", "SplitError", "CheckpointError", "WireError", "ExecutionError",
                   "LaunchError", "PackError"}
        assert runtime <= {n.rsplit(".", 1)[1] for n in names}, sorted(names)
    outside = sorted(n for c, n in ((c, f"{c.__module__}.{c.__qualname__}") for c in classes)
                     if not issubclass(c, TesselError) and n not in NOT_ERRORS)
    assert outside == [], f"exception classes outside the TesselError family: {outside}"


def test_runtime_errors_keep_their_old_bases() -> None:
    from tessel import errors
    assert issubclass(errors.PackError, TypeError)
    assert issubclass(errors.ExecutionError, RuntimeError) and issubclass(errors.LaunchError, RuntimeError)
    for name in ("PipelineError", "SplitError", "CheckpointError", "WireError"):
        assert issubclass(getattr(errors, name), ValueError), name


def test_runtime_raises_no_bare_builtin_errors() -> None:
    """Errors raised on purpose in the runtime are of the family (a bare ValueError would be a bug)."""
    rx = re.compile(r"raise (ValueError|TypeError|RuntimeError|KeyError|Exception)\(")
    hits = [f"{f.relative_to(TESSEL)}:{i}" for f in sorted((TESSEL / "runtime").glob("*.py"))
            for i, line in enumerate(f.read_text().splitlines(), 1) if rx.search(line)]
    assert hits == []


@pytest.mark.parametrize("name", ["PipelineError", "SplitError", "CheckpointError", "WireError", "ExecutionError",
                                  "LaunchError", "PackError"])
def test_runtime_modules_still_export_their_error(name: str) -> None:
    pytest.importorskip("torch")
    module = {"PipelineError": "pipeline", "SplitError": "split", "CheckpointError": "checkpoint",
              "WireError": "wire", "ExecutionError": "executor", "LaunchError": "launch", "PackError": "pack"}[name]
    from tessel import errors
    assert getattr(importlib.import_module(f"tessel.runtime.{module}"), name) is getattr(errors, name)
