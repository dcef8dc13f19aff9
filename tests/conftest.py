"""Shared fixtures: run the CLI in-process and capture what it prints."""
from __future__ import annotations

from collections.abc import Callable

import pytest

from tessel.cli import main

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def tessel(capsys: pytest.CaptureFixture[str]) -> Run:
    """`tessel(*argv)` -> (exit code, stdout, stderr), through tessel.cli.main."""
    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:  # argparse's own usage errors
            rc = int(e.code or 0)
        out, err = capsys.readouterr()
        return rc, out, err
    return run
