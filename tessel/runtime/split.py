"""Split a model into pipeline blocks, and the chain placement that runs them.

Three ways in, each giving `{block id: module}` in forward order (ids `s0`, `s1`, ...):

- `split_sequential`: an `nn.Sequential` or `nn.ModuleList` cut into consecutive parts;
- `split_at`: any model, cut at the named submodules (`split_points=["transformer.h.2", ...]`:
  a block begins at each), through torch.distributed.pipelining's `pipeline()` tracer (the model
  must export with `torch.export`; a block then returns what the next one reads, as a tuple);
- `split_pipe`: the stages of a `pipeline()` result the caller made (any of its split specs).

`chain_placement` puts block i on device i mod D (interleaved when there are more blocks than
devices), with unit costs or with the ms/MiB a profile measured (see runtime.profiler.profile_modules).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from ..builder import Stage, build_stages
from ..errors import SplitError as SplitError
from ..placement import Number, Placement, PlacementError


def split_sequential(model: nn.Sequential | nn.ModuleList, parts: int | Sequence[int]) -> dict[str, nn.Module]:
    """Consecutive layers of `model` as blocks: `parts` equal parts (the first ones one layer larger
    when it does not divide) or parts of the given sizes."""
    layers = list(model)
    if isinstance(parts, int):
        if not 1 <= parts <= len(layers):
            raise SplitError(f"cannot split {len(layers)} layers into {parts} parts: ask for 1..{len(layers)} parts")
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
        raise SplitError(f"split points repeat: {list(split_points)}; give each once")
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
    """The stages of a torch.distributed.pipelining `Pipe` as a chain of blocks.

    A stage of a `Pipe` may read values of any earlier stage (GPT-2's attention mask, made by the
    first stage, is read by all); a chain passes values on only to the next block. So each block
    returns, as a tuple, its outputs and the earlier values a later block still reads.
    """
    gm = pipe.split_gm
    nodes = list(gm.graph.nodes)
    stages = [n for n in nodes if n.op == "call_module"]
    inputs = [n for n in nodes if n.op == "placeholder"]
    result = next(n for n in nodes if n.op == "output").args[0]
    final = result[0] if isinstance(result, (tuple, list)) and len(result) == 1 else result

    def key(n: Any) -> tuple[Any, int | None]:
        if n.op == "call_function" and n.args and n.args[0] in stages:
            return (n.args[0], int(n.args[1]))
        return (n, None)

    reads = [[key(a) for a in st.args] for st in stages]
    avail: list[tuple[Any, int | None]] = [(n, None) for n in inputs]
    out: dict[str, nn.Module] = {}
    for i, st in enumerate(stages):
        for k in reads[i]:
            if k not in avail:
                raise SplitError(f"stage {i} of the split reads {k[0].name}, which the blocks before it do not "
                                 "pass on (a model input read after the first block?)")
        users = [u for u in st.users if u.op == "call_function"]
        outs = sorted({(st, int(u.args[1])) for u in users}, key=lambda k: k[1]) if users else [(st, None)]
        now = avail + outs
        later = {k for r in reads[i + 1:] for k in r} | ({key(final)} if i == len(stages) - 1 else set())
        keep = [j for j, k in enumerate(now) if k in later]
        last = i == len(stages) - 1
        out[f"s{i}"] = ChainStage(getattr(gm, st.target), [avail.index(k) for k in reads[i]],
                                  len(outs) if users else None, keep, now.index(key(final)) if last else None)
        avail = [now[j] for j in keep]
    return out


class ChainStage(nn.Module):
    """One stage of a split model in a chain: reads the values passed on (a tuple; the model's
    inputs for the first), runs the stage, passes on what later stages read (the last: the output)."""

    def __init__(self, inner: nn.Module, reads: list[int], outputs: int | None, keep: list[int],
                 result: int | None) -> None:
        super().__init__()
        self.inner, self.reads, self.outputs, self.keep, self.result = inner, reads, outputs, keep, result

    def forward(self, *args: Any) -> Any:
        avail = list(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else list(args)
        got = self.inner(*[avail[j] for j in self.reads])
        now = avail + (list(got) if self.outputs is not None else [got])
        if self.result is not None:
            return now[self.result]
        return tuple(now[j] for j in self.keep)


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

