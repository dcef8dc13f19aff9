"""Placement layer: blocks, edges, devices of one micro-batch; validation; JSON/YAML I/O.

A placement is the contract of FORMAT.md. Everything downstream (bounds, schedules, searches,
runtime) reads it and never changes it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from . import graph

log = logging.getLogger(__name__)

KINDS = ("forward", "backward", "weight", "other")
Number = int | float


class PlacementError(ValueError):
    """A placement that breaks a rule of FORMAT.md; the message names the culprit."""


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
        return tuple(b for b in self.blocks if device in b.devices)

    @cached_property
    def loads(self) -> tuple[Number, ...]:
        """Summed block durations per device: the least time one micro-batch costs it."""
        return tuple(sum(b.duration for b in self.blocks_on(d)) for d in range(self.devices))

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
            import yaml
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
    if p.devices < 1:
        raise PlacementError(f"placement {p.name!r}: devices must be >= 1, got {p.devices}")
    if not p.blocks:
        raise PlacementError(f"placement {p.name!r} has no blocks")
    if not _finite_nonneg(p.latency):
        raise PlacementError(f"placement {p.name!r}: latency must be a number >= 0, got {p.latency!r}")
    seen: set[str] = set()
    for b in p.blocks:
        _check_block(p, b, seen)
    for a, b in p.edges:
        for end in (a, b):
            if end not in seen:
                raise PlacementError(f"edge {a} -> {b} names unknown block {end!r}")
        if a == b:
            raise PlacementError(f"edge {a} -> {b} is a self-loop")
    cycle = find_cycle(p)
    if cycle:
        raise PlacementError("dependency cycle: " + " -> ".join(cycle + [cycle[0]]))
    for b in p.blocks:
        _check_grad_of(p, b)
    return _memory_warnings(p)


def _finite_nonneg(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _check_block(p: Placement, b: Block, seen: set[str]) -> None:
    if not isinstance(b.id, str) or not b.id:
        raise PlacementError(f"block id must be a non-empty string, got {b.id!r}")
    if b.id in seen:
        raise PlacementError(f"duplicate block id {b.id!r}")
    seen.add(b.id)
    if b.kind not in KINDS:
        raise PlacementError(f"block {b.id}: kind {b.kind!r} is not one of {', '.join(KINDS)}")
    if not _finite_nonneg(b.duration) or b.duration <= 0:
        raise PlacementError(f"block {b.id}: duration must be a positive number, got {b.duration!r}")
    if not isinstance(b.memory, (int, float)) or isinstance(b.memory, bool) or not math.isfinite(b.memory):
        raise PlacementError(f"block {b.id}: memory must be a number, got {b.memory!r}")
    if not b.devices:
        raise PlacementError(f"block {b.id}: empty device set")
    for d in b.devices:
        if not isinstance(d, int) or isinstance(d, bool) or not 0 <= d < p.devices:
            raise PlacementError(f"block {b.id}: device {d!r} out of range 0..{p.devices - 1}")
    if len(set(b.devices)) != len(b.devices):
        raise PlacementError(f"block {b.id}: device listed twice in {list(b.devices)}")


def _check_grad_of(p: Placement, b: Block) -> None:
    if b.grad_of is None:
        return
    if b.kind not in ("backward", "weight"):
        raise PlacementError(f"block {b.id}: grad_of is only for backward/weight blocks, not {b.kind}")
    fwd = p.by_id.get(b.grad_of)
    if fwd is None:
        raise PlacementError(f"block {b.id}: grad_of names unknown block {b.grad_of!r}")
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
    for d in range(p.devices):
        total = sum(b.memory for b in p.blocks_on(d))
        if abs(total) > 1e-9:
            out.append(f"placement {p.name}: memory on device {d} sums to {total:g}, not 0, "
                       "over one micro-batch (memory would grow without bound)")
    return out


# ---- documents -------------------------------------------------------------------------
def _field(doc: Mapping[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in doc:
        return doc[key]
    if default is ...:
        raise PlacementError(f"{where}: missing field {key!r}")
    return default


def _block_from_dict(doc: Any, i: int) -> Block:
    if not isinstance(doc, Mapping):
        raise PlacementError(f"blocks[{i}] must be an object, got {type(doc).__name__}")
    where = f"blocks[{i}] ({doc.get('id', '?')})"
    devs = _field(doc, "devices", where)
    if isinstance(devs, int) and not isinstance(devs, bool):
        devs = [devs]
    if not isinstance(devs, list):
        raise PlacementError(f"{where}: devices must be a list of device ids")
    return Block(id=_field(doc, "id", where), kind=_field(doc, "kind", where, "other"),
                 duration=_field(doc, "duration", where), memory=_field(doc, "memory", where, 0),
                 devices=tuple(devs), grad_of=doc.get("grad_of"))


def placement_from_dict(doc: Any, source: str = "placement") -> Placement:
    if not isinstance(doc, Mapping):
        raise PlacementError(f"{source}: a placement must be an object with blocks and edges")
    blocks_doc = _field(doc, "blocks", source)
    if not isinstance(blocks_doc, list):
        raise PlacementError(f"{source}: blocks must be a list")
    blocks = [_block_from_dict(b, i) for i, b in enumerate(blocks_doc)]
    edges = []
    for i, e in enumerate(_field(doc, "edges", source, [])):
        if not isinstance(e, (list, tuple)) or len(e) < 2:
            raise PlacementError(f"{source}: edges[{i}] must be a pair [from, to], got {e!r}")
        edges.append((str(e[0]), str(e[1])))
    devices = _field(doc, "devices", source)
    if not isinstance(devices, int) or isinstance(devices, bool):
        raise PlacementError(f"{source}: devices must be an integer, got {devices!r}")
    return make_placement(str(doc.get("name", Path(source).stem)), devices, blocks, edges,
                          doc.get("latency", 0) or 0)


def read_document(path: str | Path) -> Any:
    """Parse a JSON or YAML file into plain data, with one clear error when it cannot."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise PlacementError(f"cannot read {p}: {e.strerror or e}") from None
    if p.suffix in (".yaml", ".yml"):
        import yaml
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PlacementError(f"{p}: malformed YAML: {str(e).splitlines()[0]}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PlacementError(f"{p}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}") from None


def load_placement(path: str | Path) -> Placement:
    return placement_from_dict(read_document(path), str(path))


def atomic_write(path: str | Path, text: str | bytes) -> None:
    """Write a file so that readers see the old or the new content, never a torn one."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
