"""Command line: thin. Parses, calls the layers, prints tables. Bad input: one line, exit 2.

Each command group lives in its own module with a `register(subparsers)` function; the module
list below is the only place that names them.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from ..placement import PlacementError
from ..schedule import ScheduleError
from .common import UsageError

COMMAND_MODULES = ("basic", "search", "runtime", "tools", "plan")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessel", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            continue  # a command group not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # a reader such as `head` closed the pipe: not an error of the user's input
        sys.stderr.close()
        return 0
    except (UsageError, PlacementError, ScheduleError, ValueError, OSError) as e:
        print(f"tessel: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tessel: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
