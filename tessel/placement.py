"""Placement layer: blocks, edges, devices of one micro-batch; validation; to and from documents.

A placement is the contract of FORMAT.md. Everything downstream (bounds, schedules, searches,
runtime) reads it and never changes it.
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from . import graph
from .errors import LimitError, PlacementError, TesselError, quote
from .io import atomic_write, read_document

log = logging.getLogger(__name__)

KINDS = ("forward", "backward", "weight", "other")
Number = int | float
__all__ = ["Block", "Placement", "PlacementError", "make_placement", "load_placement", "read_document"]

# Input limits, checked before any work: far above every real placement, low enough that no
# input makes a command hang or run out of memory.
MAX_DEVICES = 4096
MAX_BLOCKS = 100_000
MAX_EDGES = 1_000_000
MAX_PLACEMENTS = 1_000_000  # (block, device) pairs: a block on many devices counts once per device
MAX_ID_CHARS = 200
MAX_VALUE = 1e12  # largest duration, |memory|, latency, memory limit or start accepted
MIN_DURATION = 1e-6  # far above the rules' tolerance (1e-9), so every task has a visible length


@dataclass(frozen=True)
class Block:
    id: str
    kind: str
    duration: Number
    memory: Number
    devices: tuple[int, ...]
    grad_of: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "kind": self.kind, "duration": self.duration,
                             "memory": self.memory, "devices": list(self.devices)}
        if self.grad_of is not None:
            d["grad_of"] = self.grad_of
        return d


@dataclass(frozen=True)
class Placement:
    name: str
    devices: int
    blocks: tuple[Block, ...]
    edges: tuple[tuple[str, str], ...]
    latency: Number = 0
    warnings: tuple[str, ...] = field(default=(), compare=False)

    # ---- lookups -------------------------------------------------------------------------
    @cached_property
    def by_id(self) -> dict[str, Block]:
        return {b.id: b for b in self.blocks}

    def block(self, block_id: str) -> Block:
        try:
            return self.by_id[block_id]
        except KeyError:
            raise PlacementError(f"placement {self.name!r} has no block {block_id!r}") from None

    @cached_property
    def preds(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {b.id: [] for b in self.blocks}
        for a, b in self.edges:
            out[b].append(a)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def succs(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {b.id: [] for b in self.blocks}
        for a, b in self.edges:
            out[a].append(b)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def topo_order(self) -> tuple[str, ...]:
        """Block ids in a dependency order, ties broken by declaration order."""
        rank = {b.id: i for i, b in enumerate(self.blocks)}
        return tuple(self.topo_sorted(rank.__getitem__))

    def topo_sorted(self, key: Callable[[str], Any]) -> list[str]:
        """A dependency order that, among the blocks ready at each step, takes the least `key`."""
        return graph.topo_sorted([b.id for b in self.blocks], self.succs, key)

    def edge_latency(self, a: str, b: str) -> Number:
        """Transfer time of edge a -> b: the placement latency when the device sets differ."""
        if not self.latency:
            return 0
        return self.latency if set(self.by_id[a].devices) != set(self.by_id[b].devices) else 0

    def blocks_on(self, device: int) -> tuple[Block, ...]:
        return self._on_device[device] if 0 <= device < self.devices else ()

    @cached_property
    def _on_device(self) -> tuple[tuple[Block, ...], ...]:
        on: list[list[Block]] = [[] for _ in range(self.devices)]
        for b in self.blocks:
            for d in b.devices:
                on[d].append(b)
        return tuple(tuple(x) for x in on)

    @cached_property
    def loads(self) -> tuple[Number, ...]:
        """Summed block durations per device: the least time one micro-batch costs it."""
        return tuple(sum(b.duration for b in on) for on in self._on_device)

    @property
    def is_training(self) -> bool:
        return any(b.kind in ("backward", "weight") for b in self.blocks)

    @property
    def is_integral(self) -> bool:
        vals = [b.duration for b in self.blocks] + [self.latency]
        return all(float(v).is_integer() for v in vals)

    # ---- derived placements --------------------------------------------------------------
    def inference(self) -> Placement:
        """The forward-only form: backward and weight blocks dropped, no memory kept."""
        keep = [replace(b, memory=0) for b in self.blocks if b.kind in ("forward", "other")]
        ids = {b.id for b in keep}
        edges = tuple((a, b) for a, b in self.edges if a in ids and b in ids)
        return make_placement(f"{self.name}-infer", self.devices, keep, edges, self.latency)

    def with_costs(self, **by_kind: Number) -> Placement:
        """A copy with every block of a kind given a new duration (e.g. backward=2)."""
        blocks = [replace(b, duration=by_kind.get(b.kind, b.duration)) for b in self.blocks]
        return make_placement(self.name, self.devices, blocks, self.edges, self.latency)

    # ---- I/O -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "devices": self.devices}
        if self.latency:
            d["latency"] = self.latency
        d["blocks"] = [b.to_dict() for b in self.blocks]
        d["edges"] = [[a, b] for a, b in self.edges]
        return d

    @staticmethod
    def from_dict(doc: Any, source: str = "placement") -> Placement:
        return placement_from_dict(doc, source)

    @staticmethod
    def load(path: str | Path) -> Placement:
        return load_placement(path)

    def save(self, path: str | Path) -> None:
        p = Path(path)
        if p.suffix in (".yaml", ".yml"):
            atomic_write(p, yaml.safe_dump(self.to_dict(), sort_keys=False))
        else:
            atomic_write(p, json.dumps(self.to_dict(), indent=1))


# ---- construction and validation ---------------------------------------------------------
def make_placement(name: str, devices: int, blocks: Iterable[Block],
                   edges: Iterable[tuple[str, str]], latency: Number = 0) -> Placement:
    """Build and validate a placement; raises PlacementError naming the first broken rule."""
    p = Placement(name, int(devices), tuple(blocks), tuple((a, b) for a, b in edges), latency)
    warnings = validate(p)
    for w in warnings:
        log.warning("%s", w)
    return replace(p, warnings=tuple(warnings))


def validate(p: Placement) -> list[str]:
    """Check the rules of a placement; return warnings, raise PlacementError on an error."""
    name = quote(p.name)
    if not 1 <= p.devices <= MAX_DEVICES:
        raise LimitError(f"placement {name}: devices must be 1..{MAX_DEVICES}, got {quote(p.devices)}")
    if not p.blocks:
        raise PlacementError(f"placement {name} has no blocks")
    _check_sizes(name, len(p.blocks), len(p.edges))
    if not in_range(p.latency, 0, MAX_VALUE):
        raise PlacementError(f"placement {name}: latency must be a number >= 0 (at most {MAX_VALUE:g}), "
                             f"got {quote(p.latency)}")
    if sum(len(b.devices) if isinstance(b.devices, tuple) else 0 for b in p.blocks) > MAX_PLACEMENTS:
        raise LimitError(f"placement {name}: blocks occupy more than {MAX_PLACEMENTS:,} (block, device) pairs")
    seen: set[str] = set()
    for blk in p.blocks:
        _check_block(p, blk, seen)
    for a, b in p.edges:
        for end in (a, b):
            if not isinstance(end, str) or end not in seen:
                raise PlacementError(f"edge {_plain(a)} -> {_plain(b)} names unknown block {quote(end)}")
        if a == b:
            raise PlacementError(f"edge {a} -> {b} is a self-loop")
    cycle = find_cycle(p)
    if cycle:
        raise PlacementError("dependency cycle: " + " -> ".join(cycle + [cycle[0]]))
    for blk in p.blocks:
        _check_grad_of(p, blk)
    return _memory_warnings(p)


def _plain(x: Any) -> str:
    """A short string as it is, anything else quoted and cut."""
    return x if isinstance(x, str) and len(x) <= MAX_ID_CHARS else quote(x)


def _check_sizes(name: str, blocks: int, edges: int) -> None:
    if blocks > MAX_BLOCKS:
        raise LimitError(f"placement {name}: {blocks:,} blocks, more than the {MAX_BLOCKS:,} accepted")
    if edges > MAX_EDGES:
        raise LimitError(f"placement {name}: {edges:,} edges, more than the {MAX_EDGES:,} accepted")


def in_range(x: Any, lo: float, hi: float) -> bool:
    """A real number (not a bool, not NaN or infinite, any size of int) with lo <= x <= hi."""
    if type(x) is int:  # the common case, first (schedules check every task's start)
        return lo <= x <= hi
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    # comparing first keeps huge ints (10**400) away from float conversion
    return lo <= x <= hi and (isinstance(x, int) or math.isfinite(x))


def _unicode(text: str) -> bool:
    """Text UTF-8 can hold: no lone surrogate (JSON's "\\ud800"), which no file or terminal carries."""
    return text.isascii() or not any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def _check_block(p: Placement, b: Block, seen: set[str]) -> None:
    if not isinstance(b.id, str) or not b.id or len(b.id) > MAX_ID_CHARS or not _unicode(b.id):
        raise PlacementError(f"block id must be a string of 1..{MAX_ID_CHARS} characters, got {quote(b.id)}")
    if b.id in seen:
        raise PlacementError(f"duplicate block id {b.id!r}")
    seen.add(b.id)
    if not isinstance(b.kind, str) or b.kind not in KINDS:
        raise PlacementError(f"block {b.id}: kind {quote(b.kind)} is not one of {', '.join(KINDS)}")
    if not in_range(b.duration, MIN_DURATION, MAX_VALUE):
        raise PlacementError(f"block {b.id}: duration must be a positive number, got {quote(b.duration)} "
                             f"(accepted: {MIN_DURATION:g}..{MAX_VALUE:g})")
    if not in_range(b.memory, -MAX_VALUE, MAX_VALUE):
        raise PlacementError(f"block {b.id}: memory must be a number, got {quote(b.memory)} "
                             f"(accepted: {-MAX_VALUE:g}..{MAX_VALUE:g})")
    if not isinstance(b.devices, tuple) or not b.devices:
        raise PlacementError(f"block {b.id}: empty device set")
    for d in b.devices:
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < p.devices:
            raise PlacementError(f"block {b.id}: device {quote(d)} out of range 0..{p.devices - 1}")
    if len(set(b.devices)) != len(b.devices):
        raise PlacementError(f"block {b.id}: device listed twice in {list(b.devices)}")


def _check_grad_of(p: Placement, b: Block) -> None:
    if b.grad_of is None:
        return
    if not isinstance(b.grad_of, str):
        raise PlacementError(f"block {b.id}: grad_of must be a block id, got {quote(b.grad_of)}")
    if b.kind not in ("backward", "weight"):
        raise PlacementError(f"block {b.id}: grad_of is only for backward/weight blocks, not {b.kind}")
    fwd = p.by_id.get(b.grad_of)
    if fwd is None:
        raise PlacementError(f"block {b.id}: grad_of names unknown block {quote(b.grad_of)}")
    if set(fwd.devices) != set(b.devices):
        raise PlacementError(f"block {b.id}: runs on devices {list(b.devices)} but its forward "
                             f"{fwd.id} runs on {list(fwd.devices)}")


def find_cycle(p: Placement) -> list[str]:
    """One dependency cycle as a list of block ids, or [] when the graph is acyclic."""
    ids = [b.id for b in p.blocks]
    return graph.find_cycle(ids, graph.successors(ids, p.edges))


def _memory_warnings(p: Placement) -> list[str]:
    if not p.is_training:
        return []
    out = []
    for d, on in enumerate(p._on_device):
        total = sum(b.memory for b in on)
        if abs(total) > 1e-9:
            out.append(f"placement {p.name}: memory on device {d} sums to {total:g}, not 0, "
                       "over one micro-batch (memory would grow without bound)")
    return out


# ---- documents -------------------------------------------------------------------------
PLACEMENT_FIELDS = ("name", "devices", "latency", "blocks", "edges")
BLOCK_FIELDS = ("id", "kind", "duration", "memory", "devices", "grad_of")
SCHEDULE_FIELDS = ("format", "version", "placement", "memory_limit", "micro_batches", "tasks", "repetend", "meta")
TASK_FIELDS = ("block", "micro_batch", "start")


def check_fields(doc: Mapping[str, Any], known: Iterable[str], where: str,
                 error: type[TesselError] = PlacementError) -> None:
    """Refuse a field the format does not know (a typo such as `memroy` would otherwise pass as a
    missing optional field), naming the closest known one."""
    import difflib
    known = tuple(known)
    if len(doc) == len(known) and all(k in doc for k in known):
        return  # the common case, e.g. each of a million tasks: every field there, nothing else
    for key in doc:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise error(f"{where}: unknown field {quote(key)} ({hint}known: {', '.join(known)})")


def _field(doc: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in doc:
        return doc[key]
    if default is ...:
        raise PlacementError(f"{where}: missing field {key!r}")
    return default


def _block_from_dict(doc: Any, i: int) -> Block:
    if not isinstance(doc, Mapping):
        raise PlacementError(f"blocks[{i}] must be an object, got {type(doc).__name__}")
    where = f"blocks[{i}] ({quote(doc.get('id', '?'))})"
    check_fields(doc, BLOCK_FIELDS, where)
    devs = _field(doc, "devices", where)
    if isinstance(devs, int) and not isinstance(devs, bool):
        devs = [devs]
    if not isinstance(devs, list):
        raise PlacementError(f"{where}: devices must be a list of device ids")
    if len(devs) > MAX_DEVICES:
        raise LimitError(f"{where}: {len(devs):,} devices listed, more than the {MAX_DEVICES} accepted")
    return Block(id=_field(doc, "id", where), kind=_field(doc, "kind", where, "other"),
                 duration=_field(doc, "duration", where), memory=_field(doc, "memory", where, 0),
                 devices=tuple(devs), grad_of=doc.get("grad_of"))


def _edges_from_doc(doc: Any, source: str) -> list[tuple[str, str]]:
    edges_doc = _field(doc, "edges", source, [])
    if not isinstance(edges_doc, list):
        raise PlacementError(f"{source}: edges must be a list of [from, to] pairs, got {quote(edges_doc)}")
    edges = []
    for i, e in enumerate(edges_doc):
        if not isinstance(e, list) or len(e) != 2 or not all(isinstance(x, str) for x in e):
            raise PlacementError(f"{source}: edges[{i}] must be a pair of block ids [from, to], got {quote(e)}")
        edges.append((e[0], e[1]))
    return edges


def placement_from_dict(doc: Any, source: str = "placement") -> Placement:
    """A placement from a parsed document; every problem raises PlacementError (or LimitError)."""
    source = quote(source).strip("'\"")
    if not isinstance(doc, Mapping):
        raise PlacementError(f"{source}: a placement must be an object with blocks and edges")
    check_fields(doc, PLACEMENT_FIELDS, source)
    blocks_doc, devices = _field(doc, "blocks", source), _field(doc, "devices", source)
    if not isinstance(blocks_doc, list):
        raise PlacementError(f"{source}: blocks must be a list")
    if not isinstance(devices, int) or isinstance(devices, bool):
        raise PlacementError(f"{source}: devices must be an integer, got {quote(devices)}")
    if not 1 <= devices <= MAX_DEVICES:
        raise LimitError(f"{source}: devices must be 1..{MAX_DEVICES}, got {quote(devices)}")
    _check_sizes(source, len(blocks_doc), len(doc["edges"]) if isinstance(doc.get("edges"), list) else 0)
    name = doc.get("name", Path(source).stem)
    if not isinstance(name, str) or len(name) > MAX_ID_CHARS or not _unicode(name):
        raise PlacementError(f"{source}: name must be a string of at most {MAX_ID_CHARS} characters, "
                             f"got {quote(name)}")
    latency = doc.get("latency", 0)
    blocks = [_block_from_dict(b, i) for i, b in enumerate(blocks_doc)]
    return make_placement(name, devices, blocks, _edges_from_doc(doc, source), 0 if latency is None else latency)


def load_placement(path: str | Path) -> Placement:
    return placement_from_dict(read_document(path), str(path))
