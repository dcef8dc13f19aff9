"""Command line: thin. Parses, calls the layers, prints tables.

Exit codes: 0 ok; 1 an invalid schedule (`check`, `show`) or a bug (with its traceback);
2 bad input (one line `tessel: error: ...`); 130 / 143 interrupted by SIGINT / SIGTERM.
Each command group lives in its own module with a `register(subparsers)` function; the module
list below is the only place that names them.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import NoReturn

from ..errors import QUOTE_CHARS, TesselError, quote
from .interrupt import Interrupted, catch_signals
from .pipes import PipeSafe

COMMAND_MODULES = ("basic", "search", "runtime", "tools", "plan", "export")
EXIT_USAGE = 2  # bad input; 1 is an invalid schedule or a bug, 128 + N signal N


class Parser(argparse.ArgumentParser):
    """argparse with its errors as one line, like every other bad input."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("tessel").strip()
        where = f"{command}: " if command else ""
        hint = f" (see `{self.prog} --help`)"
        print(f"tessel: error: {where}{message[:QUOTE_CHARS * 2]}{hint}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="tessel", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    started = time.perf_counter()  # a command's wall clock (--time-limit) counts from here
    try:
        with catch_signals(), PipeSafe():
            code = _run(argv, started)
        if argv is None and "torch" in sys.modules:
            # torch's teardown (its libraries, a store's threads) takes a second or more after the
            # work is done and printed: a process that loaded it exits at once
            _exit_now(code)
        return code
    except Interrupted as e:
        signum = e.signum
    except KeyboardInterrupt:  # a SIGINT before the handler was in place
        signum = 2
    print("tessel: interrupted", file=sys.stderr)
    if argv is None:  # the real command line: skip the interpreter's slow teardown
        _exit_now(128 + signum)
    return 128 + signum


def _exit_now(code: int) -> NoReturn:
    """Exit at once: output files are written atomically (or closed) and the streams flushed here,
    so nothing is lost by skipping the teardown of the solver's threads and loaded modules; the
    runtime's fork server, if started, ends too."""
    from ..runtime.forkserver import stop  # torch-free
    stop()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    logging.shutdown()
    os._exit(code)


def _run(argv: Sequence[str] | None, started: float) -> int:
    args = build_parser().parse_args(argv)
    args.started = started
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        from .outputs import check_outputs
        check_outputs(args)  # before any work: no output replaces an input or another output
        return int(args.func(args) or 0)
    except TesselError as e:
        print(f"tessel: error: {_one_line(str(e))}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # files the user named: missing, unreadable, a full disk
        text = f"{quote(str(e.filename))}: {e.strerror}" if e.filename and e.strerror else str(e)
        print(f"tessel: error: {_one_line(text)}", file=sys.stderr)
        return EXIT_USAGE


def _one_line(text: str) -> str:
    from .common import printable
    line = printable(" ".join(text.split()), lines=False)
    return line if len(line) <= 4 * QUOTE_CHARS else line[: 4 * QUOTE_CHARS - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
