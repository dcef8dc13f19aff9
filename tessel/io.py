"""Files: reading JSON/YAML documents safely and writing outputs atomically.

Every file the library reads goes through `read_document`, every file it writes through
`atomic_write`; plots, traces, schedules and the runtime share these rules.
"""
from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

from .errors import LimitError, OutputError, PlacementError, TesselError, quote

MAX_DOCUMENT_BYTES = 256 * 2**20
MAX_DEPTH = 64  # nesting of a JSON/YAML document
DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")

__all__ = ["DOCUMENT_SUFFIXES", "MAX_DEPTH", "MAX_DOCUMENT_BYTES", "atomic_write", "check_writable", "is_file_ref",
           "read_document"]


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without anchors and aliases: a few hundred bytes of aliases can expand to
    gigabytes, and a placement or schedule never needs them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise PlacementError(f"YAML alias *{quote(event.anchor)} at line {event.start_mark.line + 1}: "
                                 "aliases are not accepted")
        return super().compose_node(parent, index)


def read_document(path: str | Path) -> Any:
    """Parse a JSON or YAML file into plain data, with one clear error when it cannot: too big,
    too deeply nested, YAML aliases and malformed text are refused before or while parsing."""
    p = Path(path)
    where = quote(str(p)).strip("'\"")
    try:
        with p.open("rb") as f:  # at most one byte over the limit, even from /dev/zero
            data = f.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as e:
        raise PlacementError(f"cannot read {where}: {e.strerror or e}") from None
    if len(data) > MAX_DOCUMENT_BYTES:
        raise LimitError(f"{where}: more than the {MAX_DOCUMENT_BYTES:,} bytes accepted")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlacementError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        doc = _parse(text, p.suffix in (".yaml", ".yml"), where)
    except RecursionError:
        doc = None
        depth = MAX_DEPTH + 1
    else:
        depth = _depth(doc)
    if depth > MAX_DEPTH:
        raise LimitError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    return doc


def _parse(text: str, yaml_text: bool, where: str) -> Any:
    if yaml_text:
        try:
            return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as e:
            raise PlacementError(f"{where}: malformed YAML: {quote(str(e).splitlines()[0])}") from None
        except (ValueError, OverflowError) as e:  # a scalar YAML cannot convert (huge int, bad date)
            if isinstance(e, TesselError):
                raise
            raise PlacementError(f"{where}: malformed YAML value: {quote(str(e))}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PlacementError(f"{where}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise PlacementError(f"{where}: malformed JSON value: {quote(str(e))}") from None


def _depth(doc: Any) -> int:
    """Nesting depth of parsed data, without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(x, Mapping):
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            stack.extend((v, d + 1) for v in x)
    return deepest


def atomic_write(path: str | Path, text: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one (a
    temporary file in the same directory, then os.replace). Refuses, with OutputError, to
    create a missing directory or to replace a file its owner made read-only."""
    p = Path(path)
    check_writable(p)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", dir=p.parent)
    try:
        # mkstemp makes the file private; a written schedule or chart is meant to be shared
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_writable(path: str | Path) -> None:
    """Raise OutputError unless `path` can be written as a new or replaced regular file."""
    p = Path(path)
    where = quote(str(p)).strip("'\"")
    parent = p.parent
    if not parent.is_dir():
        raise OutputError(f"{where}: directory {quote(str(parent))} does not exist (create it first)")
    try:
        st = p.stat()
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"{where}: {e.strerror or e}") from None
    if st is not None:
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{where}: exists and is not a regular file; not replacing it")
        if not st.st_mode & 0o222 or not os.access(p, os.W_OK):
            raise OutputError(f"{where}: the file is read-only; not replacing it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{where}: directory {quote(str(parent))} is not writable")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_file_ref(ref: str | Path, names: Collection[str] = ()) -> bool:
    """Whether `ref` (a command-line or call argument) means a file rather than one of `names`
    (the built-in placements, the methods). A name wins; anything else that exists or ends in
    .json/.yaml/.yml is a file, so a missing one fails on opening, naming its path."""
    ref = str(ref)
    if ref in names:
        return False
    if ref.endswith(DOCUMENT_SUFFIXES):
        return True
    try:
        return Path(ref).exists()
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte, is no file
        return False
