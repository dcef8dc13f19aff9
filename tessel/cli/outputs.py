"""The files a command that produces a schedule can write: schedule JSON, picture, trace.

Output paths are checked when arguments are parsed (directory there, file not read-only), so a
bad name fails before a long search, not after; the files are written only once the command has
its result, each atomically, so an interrupted command leaves them untouched.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import OutputError
from ..io import check_writable
from ..schedule import Schedule

PICTURE_SUFFIXES = (".png", ".svg")


def output_path(text: str) -> str:
    """An argparse type: a file this command may create or replace."""
    try:
        check_writable(text)
    except OutputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def picture_path(text: str) -> str:
    if Path(text).suffix.lower() not in PICTURE_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text[:200]}: a picture must end in .png or .svg")
    return output_path(text)


def add_output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", metavar="FILE", type=output_path, help="write the schedule JSON here")
    p.add_argument("--plot", metavar="FILE", type=picture_path, help="write a Gantt chart (.png or .svg)")
    p.add_argument("--trace", metavar="FILE", type=output_path, help="write a Chrome/Perfetto trace (.json)")


def write_outputs(s: Schedule, args: argparse.Namespace) -> None:
    if getattr(args, "output", None):
        s.save(args.output)
        print(f"wrote {args.output}")
    if getattr(args, "plot", None):
        from ..viz.gantt import plot_schedule
        plot_schedule(s, args.plot)
        print(f"wrote {args.plot}")
    if getattr(args, "trace", None):
        from ..viz.trace import write_trace
        write_trace(s, args.trace)
        print(f"wrote {args.trace}")
