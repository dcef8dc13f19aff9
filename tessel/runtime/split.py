"""Split a model into pipeline blocks, and the chain placement that runs them.

Three ways in, each giving `{block id: module}` in forward order (ids `s0`, `s1`, ...):

- `split_sequential`: an `nn.Sequential` or `nn.ModuleList` cut into consecutive parts;
- `split_at`: any model, cut at the named submodules (`split_points=["transformer.h.2", ...]`:
  a block begins at each), through torch.distributed.pipelining's `pipeline()` tracer (the model
  must export with `torch.export`; a block then returns what the next one reads, as a tuple);
- `split_pipe`: the stages of a `pipeline()` result the caller made (any of its split specs).

`chain_placement` puts block i on device i mod D (interleaved when there are more blocks than
devices), with unit costs or with the ms/MiB a profile measured (see profiler.profile_modules).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from ..builder import Stage, build_stages
from ..placement import Number, Placement, PlacementError


class SplitError(ValueError):
    """The model cannot be cut as asked; the message names the part or module."""


def split_sequential(model: nn.Sequential | nn.ModuleList, parts: int | Sequence[int]) -> dict[str, nn.Module]:
    """Consecutive layers of `model` as blocks: `parts` equal parts (the first ones one layer larger
    when it does not divide) or parts of the given sizes."""
    layers = list(model)
    if isinstance(parts, int):
        if not 1 <= parts <= len(layers):
            raise SplitError(f"cannot split {len(layers)} layers into {parts} parts")
        q, r = divmod(len(layers), parts)
        sizes = [q + (i < r) for i in range(parts)]
    else:
        sizes = list(parts)
        if any(s < 1 for s in sizes) or sum(sizes) != len(layers):
            raise SplitError(f"part sizes {sizes} must be positive and add up to the model's {len(layers)} layers")
    out: dict[str, nn.Module] = {}
    start = 0
    for i, s in enumerate(sizes):
        out[f"s{i}"] = nn.Sequential(*layers[start:start + s])
        start += s
    return out


def split_at(model: nn.Module, split_points: Sequence[str], example_args: Sequence[Any],
             example_kwargs: Mapping[str, Any] | None = None) -> dict[str, nn.Module]:
    """`model` cut before each named submodule: len(split_points) + 1 blocks, traced by
    torch.distributed.pipelining on one micro-batch of example arguments."""
    from torch.distributed.pipelining import SplitPoint, pipeline
    names = dict(model.named_modules())
    for p in split_points:
        if p not in names or not p:
            near = [n for n in names if n and n.rsplit(".", 1)[-1] == p.rsplit(".", 1)[-1]][:3]
            raise SplitError(f"split point {p!r} is not a submodule of {type(model).__name__}"
                             + (f" (similar: {', '.join(near)})" if near else ""))
    if len(set(split_points)) != len(split_points):
        raise SplitError(f"split points repeat: {list(split_points)}")
    try:
        pipe = pipeline(model, mb_args=tuple(example_args), mb_kwargs=dict(example_kwargs or {}),
                        split_spec={p: SplitPoint.BEGINNING for p in split_points})
    except Exception as e:
        raise SplitError(f"torch.distributed.pipelining could not trace {type(model).__name__} to split it "
                         f"at {list(split_points)}: {type(e).__name__}: {str(e).splitlines()[0]}") from e
    blocks = split_pipe(pipe)
    if len(blocks) != len(split_points) + 1:
        raise SplitError(f"{len(split_points)} split points gave {len(blocks)} blocks: a split point the "
                         "trace never reaches in order (check the order of split_points)")
    return blocks


def split_pipe(pipe: Any) -> dict[str, nn.Module]:
    """The stages of a torch.distributed.pipelining `Pipe` as blocks."""
    return {f"s{i}": pipe.get_stage_module(i) for i in range(pipe.num_stages)}


def chain_placement(blocks: Sequence[str], devices: int, *, name: str = "chain", forward: Number = 1,
                    backward: Number = 2, weight: Number = 0, memory: Number = 1,
                    costs: Mapping[str, tuple[Number, Number, Number, Number]] | None = None,
                    split_weight: bool = False, latency: Number = 0) -> Placement:
    """Block i of the chain on device i mod `devices`; forward ids are the block names, backward
    `<name>.b`, weight `<name>.w`. `costs` (block -> forward, backward, weight, memory) overrides the
    uniform costs, e.g. measured ones; `split_weight` splits each backward into B and W."""
    if devices < 1 or len(blocks) < devices:
        raise PlacementError(f"a chain of {len(blocks)} blocks cannot use {devices} devices "
                             "(every device needs a block)")
    stages = []
    for i, b in enumerate(blocks):
        f, bw, w, m = (costs or {}).get(b, (forward, backward, weight, memory))
        if split_weight and not w:
            bw, w = bw / 2, bw / 2  # no measured split: half each
        stages.append(Stage(b, (i % devices,), f, bw, w, m, (b, f"{b}.b", f"{b}.w")))
    edges = [(a.name, c.name) for a, c in zip(stages, stages[1:])]
    return build_stages(f"{name}-{devices}", devices, stages, edges, split_weight=split_weight, latency=latency)

