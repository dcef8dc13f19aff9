"""Measured activation memory: the bytes autograd graphs keep for their backward, per rank.

`GraphMemory` is a pair of saved-tensor hooks: every tensor a forward saves for its backward is
counted once per storage (parameters excluded: they are not activations) until its graph is freed.
It reports the peak over a step and, per forward block, the bytes one micro-batch's forward keeps;
`units` turns bytes into the placement's memory units so that measured and declared peaks can be
put side by side.
"""
from __future__ import annotations

import statistics
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn


class _Held:
    """A saved tensor, counted while the graph that saved it lives."""
    __slots__ = ("meter", "tensor", "ptr")

    def __init__(self, meter: GraphMemory, tensor: Tensor, ptr: int) -> None:
        self.meter, self.tensor, self.ptr = meter, tensor, ptr

    def __del__(self) -> None:
        self.meter._release(self.ptr)


class GraphMemory:
    def __init__(self, params: Iterable[Tensor]) -> None:
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.live: dict[int, list[int]] = {}  # storage -> [references, bytes]
        self.bytes = 0
        self.peak = 0
        self.block: str | None = None
        self.block_bytes: dict[str, int] = {}  # forward block -> most bytes one forward of it kept
        self._current = 0

    def watch(self, blocks: Mapping[str, nn.Module]) -> list[Any]:
        """Attribute what each block's forward saves to that block; returns the hook handles."""
        handles = []
        for name, m in blocks.items():
            handles.append(m.register_forward_pre_hook(lambda _m, _a, name=name: self._enter(name)))
            handles.append(m.register_forward_hook(lambda _m, _a, _o: self._leave()))
        return handles

    @contextmanager
    def measuring(self) -> Iterator[GraphMemory]:
        """Count within: a step's forwards and backwards run inside."""
        self.peak = self.bytes
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self

    def _enter(self, block: str) -> None:
        self.block, self._current = block, 0

    def _leave(self) -> None:
        if self.block is not None and torch.is_grad_enabled():
            self.block_bytes[self.block] = max(self.block_bytes.get(self.block, 0), self._current)
        self.block = None

    def _pack(self, t: Tensor) -> Any:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr in self.params or storage.nbytes() == 0:
            return t
        entry = self.live.get(ptr)
        if entry is None:
            self.live[ptr] = [1, storage.nbytes()]
            self.bytes += storage.nbytes()
            self._current += storage.nbytes()
            self.peak = max(self.peak, self.bytes)
        else:
            entry[0] += 1
        return _Held(self, t, ptr)

    @staticmethod
    def _unpack(x: Any) -> Tensor:
        return x.tensor if isinstance(x, _Held) else x

    def _release(self, ptr: int) -> None:
        entry = self.live[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self.live[ptr]


def unit_bytes(block_bytes: Mapping[str, float], declared: Mapping[str, float]) -> float | None:
    """Bytes per memory unit: the median, over blocks that declare memory, of measured / declared."""
    ratios = [block_bytes[b] / m for b, m in declared.items() if m > 0 and block_bytes.get(b, 0) > 0]
    return statistics.median(ratios) if ratios else None
