"""Files: reading JSON/YAML documents safely and writing outputs atomically.

Every file the library reads goes through `read_document`, every file it writes through
`atomic_write`; plots, traces, schedules and the runtime share these rules.
"""
from __future__ import annotations

import json
import os
import re
import stat
import tempfile
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from .errors import LimitError, OutputError, PlacementError, TesselError, quote

MAX_DOCUMENT_BYTES = 256 * 2**20
MAX_DEPTH = 64  # nesting of a JSON/YAML document
NAME_MAX, PATH_MAX = 255, 4096  # Linux's limits on a file name and a path, in bytes
DOCUMENT_SUFFIXES = (".json", ".yaml", ".yml")

__all__ = ["DOCUMENT_SUFFIXES", "MAX_DEPTH", "MAX_DOCUMENT_BYTES", "all_or_nothing", "atomic_write", "check_writable",
           "is_file_ref", "read_document"]


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load, strict: no anchors and aliases (a few hundred bytes of aliases can expand to
    gigabytes, and a placement or schedule never needs them), no duplicate keys (the later value
    would win without a word), no merge keys, and none of YAML 1.1's silent conversions where a
    number or a string is meant (`1:30` read as 90, `0x1f`, `017`, `1_000`, `yes`/`on` as true,
    dates): each is refused with its line, not converted."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise PlacementError(f"YAML alias *{quote(event.anchor)} at line {event.start_mark.line + 1}: "
                                 "aliases are not accepted")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key, _ in node.value:
            if key.tag == "tag:yaml.org,2002:merge":
                raise PlacementError(f"YAML merge key << at line {key.start_mark.line + 1}: merge keys are "
                                     "not accepted (write the fields out)")
            k = self.construct_object(key, deep=True)
            try:
                dup = k in seen
                seen.add(k)
            except TypeError:  # an unhashable key: SafeLoader refuses it below
                dup = False
            if dup:
                raise PlacementError(f"YAML key {quote(k)} at line {key.start_mark.line + 1} appears twice "
                                     "in one mapping (the later value would silently win)")
        return super().construct_mapping(node, deep)


def _strict_scalar(kind: str, ok: re.Pattern[str], hint: str) -> Any:
    """A SafeLoader constructor that accepts only the plain forms of YAML 1.2's core schema."""
    base = yaml.SafeLoader.yaml_constructors[f"tag:yaml.org,2002:{kind}"]

    def construct(loader: yaml.SafeLoader, node: Any) -> Any:
        text = str(node.value)
        if node.style is None and not ok.fullmatch(text):
            raise PlacementError(f"YAML value {quote(text)} at line {node.start_mark.line + 1}: {hint}")
        return base(loader, node)
    return construct


_NUMBER = r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"
_STRICT = {
    "bool": (r"true|True|TRUE|false|False|FALSE", "YAML 1.1 reads this as a boolean; write true/false, "
             "or quote it for a string"),
    "int": (r"[-+]?(0|[1-9][0-9]*)", "YAML 1.1 reads this as an integer in another base or notation "
            "(sexagesimal, octal, hex, underscores); write the plain decimal number, or quote it"),
    "float": (_NUMBER, "YAML 1.1 reads this as a number in a notation (sexagesimal, underscores) that is "
              "not accepted; write the plain decimal number, or quote it"),
    "timestamp": (r"(?!)", "YAML 1.1 reads this as a date; quote it for a string"),
}
# YAML 1.2 reads 1e3 as a number; YAML 1.1 as a string
_NoAliasLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                     re.compile(r"^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
                                     list("-+0123456789."))
for _kind, (_ok, _hint) in _STRICT.items():
    _NoAliasLoader.add_constructor(f"tag:yaml.org,2002:{_kind}", _strict_scalar(_kind, re.compile(_ok), _hint))


def read_document(path: str | Path) -> Any:
    """Parse a JSON or YAML file into plain data, with one clear error when it cannot: too big,
    too deeply nested, YAML aliases and malformed text are refused before or while parsing."""
    p = Path(path)
    where = quote(str(p)).strip("'\"")
    data = _read_regular(p, where)
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
    _check_text(doc, where)
    return doc


def _read_regular(p: Path, where: str) -> bytes:
    """The bytes of a regular file, at most one over the limit. A FIFO, a device or a directory
    is refused at once: opened without blocking (a FIFO with no writer would wait forever) and
    checked with fstat before any read."""
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as e:
        raise PlacementError(f"cannot read {where}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        mode = info.st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or special file"
            raise PlacementError(f"cannot read {where}: it is {what}, not a regular file")
        if info.st_size > MAX_DOCUMENT_BYTES:  # refused before reading (a sparse 2 GB file took 4 s to read up to it)
            raise LimitError(f"{where}: {info.st_size:,} bytes, more than the {MAX_DOCUMENT_BYTES:,} bytes accepted")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as e:
        raise PlacementError(f"cannot read {where}: {e.strerror or e}") from None
    finally:
        if fd >= 0:
            os.close(fd)


def _check_text(doc: Any, where: str) -> None:
    """Every string (keys included) must be text UTF-8 can hold: JSON's escapes can spell a lone
    surrogate ("\\ud800") that no file, terminal or solver name can carry."""
    stack = [doc]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            _utf8(x, where)
        elif isinstance(x, Mapping):
            for k, v in x.items():
                if isinstance(k, str):
                    _utf8(k, where)
                stack.append(v)
        elif isinstance(x, list):
            stack.extend(x)


def _utf8(text: str, where: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise PlacementError(f"{where}: a string holds {quote(text[e.start:e.end])} at character {e.start}, "
                             f"not valid Unicode text (a lone surrogate): {quote(text.encode('utf-8', 'replace').decode())}") from None


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


_STAGED: list[list[tuple[str, Path]]] = []  # open `all_or_nothing` blocks: (temporary, target) pairs


def atomic_write(path: str | Path, text: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one (a
    temporary file in the same directory, then os.replace). Refuses, with OutputError, to
    create a missing directory or to replace a file its owner made read-only. A replaced file
    keeps its permission bits. Inside `all_or_nothing`, the replace waits for the block's end."""
    p = Path(path)
    check_writable(p)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:40]}.", dir=p.parent)  # a short prefix: NAME_MAX
    try:
        try:
            mode = stat.S_IMODE(p.stat().st_mode)
        except FileNotFoundError:
            # mkstemp makes the file private; a new schedule or chart is meant to be shared
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        if _STAGED:
            _STAGED[-1].append((tmp, p))
        else:
            os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def all_or_nothing() -> Iterator[None]:
    """Every `atomic_write` inside the block lands when the block ends without an exception, and
    none of them otherwise (a chart that fails to render leaves the schedule file unwritten)."""
    _STAGED.append([])
    try:
        yield
    except BaseException:
        for tmp, _ in _STAGED.pop():
            Path(tmp).unlink(missing_ok=True)
        raise
    staged = _STAGED.pop()
    if _STAGED:  # an enclosing block decides
        _STAGED[-1].extend(staged)
        return
    for tmp, target in staged:
        os.replace(tmp, target)


def check_writable(path: str | Path) -> None:
    """Raise OutputError unless `path` can be written as a new or replaced regular file."""
    p = Path(path)
    where = quote(str(p)).strip("'\"")
    parent = p.parent
    if len(p.name.encode(errors="surrogateescape")) > NAME_MAX or len(str(p).encode(errors="surrogateescape")) > PATH_MAX:
        raise OutputError(f"{where}: the name is too long (at most {NAME_MAX} bytes a name, {PATH_MAX} a path)")
    if not p.name or p.name in (".", ".."):
        raise OutputError(f"{where}: not a file name")
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
