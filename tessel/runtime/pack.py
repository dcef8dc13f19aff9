"""Packing: a block's output of any pytree shape (tensor, tuple, list, dict of tensors) as one tensor.

The runtime moves one tensor per edge and micro-batch. A block that returns several tensors has
them packed into one flat buffer of a floating "carrier" type: floating leaves are cast to the
widest floating type among them (exact: a widening cast) and concatenated differentiably, so the
buffer's gradient is the leaves' gradients; other leaves (token ids, masks) are copied bit for bit
(viewed as carrier elements, padded to whole ones) and get no gradient. A single tensor is its own
packing, untouched.

A `Packing` says how to undo it; it travels between ranks as JSON (the tree structure in
torch.utils._pytree's JSON form), never pickled.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import Tensor

from ..errors import PackError as PackError

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool)}
WIDTH = {torch.float16: 1, torch.bfloat16: 1, torch.float32: 2, torch.float64: 3}
MAX_DIMS = 8


@dataclass(frozen=True)
class Leaf:
    shape: tuple[int, ...]
    dtype: torch.dtype
    start: int  # offset into the buffer, in carrier elements
    size: int   # length in carrier elements


@dataclass(frozen=True)
class Packing:
    """How a block's output maps onto the buffer sent: `tree` None means a single tensor."""
    tree: str | None
    leaves: tuple[Leaf, ...]
    carrier: torch.dtype

    @property
    def single(self) -> bool:
        return self.tree is None

    @property
    def buffer_shape(self) -> tuple[int, ...]:
        return self.leaves[0].shape if self.single else (sum(x.size for x in self.leaves),)

    def describe(self) -> str:
        if self.single:
            return f"a tensor of shape {list(self.leaves[0].shape)} and type {_name(self.leaves[0].dtype)}"
        return f"{len(self.leaves)} tensors ({', '.join(f'{list(x.shape)} {_name(x.dtype)}' for x in self.leaves)})"

    def to_json(self) -> str:
        return json.dumps({"tree": self.tree, "carrier": _name(self.carrier),
                           "leaves": [[list(x.shape), _name(x.dtype), x.start, x.size] for x in self.leaves]},
                          separators=(",", ":"), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> Packing:
        doc = json.loads(text)
        leaves = tuple(Leaf(tuple(int(n) for n in s), _dtype(d), int(a), int(z)) for s, d, a, z in doc["leaves"])
        tree = doc["tree"]
        return Packing(None if tree is None else str(tree), leaves, _dtype(doc["carrier"]))


def _name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise PackError(f"unknown tensor type {name!r} (ranks running different tessel versions?)")
    return DTYPES[name]


def packing_of(out: Any, what: str) -> Packing:
    """The packing of a block's output; PackError naming `what` when a leaf is not a tensor."""
    if isinstance(out, Tensor):
        _check_leaf(out, what)
        return Packing(None, (Leaf(tuple(out.shape), out.dtype, 0, out.numel()),), out.dtype)
    leaves, spec = pytree.tree_flatten(out)
    if not leaves:
        raise PackError(f"{what} returned {type(out).__name__} with no tensor in it: expected a tensor or a "
                        "tuple/list/dict of tensors")
    for x in leaves:
        if not isinstance(x, Tensor):
            raise PackError(f"{what} returned a {type(x).__name__} inside its {type(out).__name__} output: "
                            "expected only tensors (a tensor or a tuple/list/dict of tensors)")
        _check_leaf(x, what)
    floats = [x.dtype for x in leaves if x.is_floating_point()]
    carrier = max(floats, key=lambda d: WIDTH[d]) if floats else torch.float32
    if WIDTH[carrier] == 1 and len(set(floats)) > 1:
        carrier = torch.float32  # float16 and bfloat16: neither holds the other
    out_leaves, start = [], 0
    for x in leaves:
        size = x.numel() if x.is_floating_point() else math.ceil(x.numel() * x.element_size() /
                                                                  carrier.itemsize)
        out_leaves.append(Leaf(tuple(x.shape), x.dtype, start, size))
        start += size
    return Packing(pytree.treespec_dumps(spec), tuple(out_leaves), carrier)


def _check_leaf(x: Tensor, what: str) -> None:
    if x.dtype not in DTYPES.values() or x.dim() > MAX_DIMS:
        raise PackError(f"{what} returned a tensor of type {x.dtype} with {x.dim()} dimensions: the runtime "
                        f"moves types {', '.join(DTYPES)} with up to {MAX_DIMS} dimensions")


def pack(out: Any, p: Packing, what: str) -> Tensor:
    """The buffer for `out`, which must have packing `p` (the one learned from micro-batch 0)."""
    got = packing_of(out, what)
    if got != p:
        raise PackError(f"{what} returned {got.describe()}, but {p.describe()} for the first micro-batch: "
                        "every micro-batch must give the same shapes")
    if p.single:
        assert isinstance(out, Tensor)
        return out
    parts = []
    for x, leaf in zip(pytree.tree_leaves(out), p.leaves):
        if x.is_floating_point():
            parts.append(x.reshape(-1).to(p.carrier))
        else:
            raw = x.detach().contiguous().reshape(-1).view(torch.uint8)
            pad = leaf.size * p.carrier.itemsize - raw.numel()
            if pad:
                raw = torch.cat([raw, raw.new_zeros(pad)])
            parts.append(raw.view(p.carrier))
    return torch.cat(parts)


def unpack(buf: Tensor, p: Packing) -> Any:
    """The block output `buf` packs (differentiable for floating leaves)."""
    if p.single:
        return buf
    leaves = []
    for leaf in p.leaves:
        part = buf[leaf.start:leaf.start + leaf.size]
        if leaf.dtype.is_floating_point:
            leaves.append(part.to(leaf.dtype).reshape(leaf.shape))
        else:
            n = math.prod(leaf.shape) * leaf.dtype.itemsize
            raw = part.detach().contiguous().view(torch.uint8)[:n]
            leaves.append(raw.view(leaf.dtype).reshape(leaf.shape).clone())
    assert p.tree is not None
    return pytree.tree_unflatten(leaves, pytree.treespec_loads(p.tree))
