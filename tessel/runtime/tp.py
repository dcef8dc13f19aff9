"""Tensor-parallel building blocks for a block that runs SPMD on a process group (gloo or NCCL).

Convention the runtime relies on: a parallel block's input and output are replicated on every
rank of its group, and so is the gradient of its input. Column-parallel layers start with
`copy_to_group` (identity forward, all-reduce of the input gradient backward); row-parallel layers
and the vocabulary-parallel embedding end with `reduce_from_group` (all-reduce forward, identity
backward). Hand-written collectives with their autograd, so they work on any backend.

Every sharded parameter carries `tessel_shard = (dim, index, count)`: it is slice `index` of
`count` equal slices of the full parameter along `dim` (`shard_of` takes that slice of a full
tensor, e.g. a reference gradient).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import PipelineError

Group = Any  # a torch.distributed ProcessGroup, or a ShapeGroup


class ShapeGroup:
    """Stands for rank `rank` of a group of `size` inside one process, to measure what one rank of a
    sharded block keeps for its backward (models.declare_kept): parameters shard as on that rank and
    collectives keep their shapes (an all-reduce copies, an all-gather repeats); the values are not
    a real group's."""

    def __init__(self, rank: int, size: int) -> None:
        if not 0 <= rank < size:
            raise PipelineError(f"rank {rank} is not in a group of {size}: give 0 <= rank < size")
        self.rank, self.size = rank, size


def group_rank(group: Group | None) -> int:
    if isinstance(group, ShapeGroup):
        return group.rank
    return 0 if group is None else dist.get_rank(group)


def group_size(group: Group | None) -> int:
    if isinstance(group, ShapeGroup):
        return group.size
    return 1 if group is None else dist.get_world_size(group)


def _all_reduce(x: Tensor, group: Group, op: Any = dist.ReduceOp.SUM) -> Tensor:
    x = x.contiguous().clone()
    if not isinstance(group, ShapeGroup):
        dist.all_reduce(x, op=op, group=group)
    return x


class _CopyToGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Group) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return _all_reduce(grad, ctx.group), None


class _ReduceFromGroup(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Group) -> Tensor:
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _GatherFromGroup(torch.autograd.Function):
    """All-gather along the last dimension; backward keeps this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: Group) -> Tensor:
        ctx.rank, ctx.size = group_rank(group), group_size(group)
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        if isinstance(group, ShapeGroup):
            parts = [x.contiguous().clone() for _ in range(ctx.size)]
        else:
            dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad.chunk(ctx.size, dim=-1)[ctx.rank].contiguous(), None


def copy_to_group(x: Tensor, group: Group | None) -> Tensor:
    return x if group_size(group) == 1 else _CopyToGroup.apply(x, group)


def reduce_from_group(x: Tensor, group: Group | None) -> Tensor:
    return x if group_size(group) == 1 else _ReduceFromGroup.apply(x, group)


def gather_from_group(x: Tensor, group: Group | None) -> Tensor:
    return x if group_size(group) == 1 else _GatherFromGroup.apply(x, group)


# ---- sharded parameters ----------------------------------------------------------------------
def _shard(full: Tensor, dim: int, group: Group | None, what: str) -> nn.Parameter:
    size, rank = group_size(group), group_rank(group)
    if full.shape[dim] % size:
        raise PipelineError(f"{what}: dimension {dim} of size {full.shape[dim]} does not split over "
                            f"{size} ranks: give the block a device count that divides it")
    p = nn.Parameter(full.detach().chunk(size, dim=dim)[rank].clone())
    p.tessel_shard = (dim, rank, size)  # type: ignore[attr-defined]
    return p


def shard_of(param: Tensor, full: Tensor) -> Tensor:
    """The part of a full-model tensor (value or gradient) that `param` holds on this rank."""
    spec = getattr(param, "tessel_shard", None)
    if spec is None:
        return full
    dim, index, count = spec
    return full.chunk(count, dim=dim)[index]


def _copy(full: Tensor | None) -> nn.Parameter | None:
    return None if full is None else nn.Parameter(full.detach().clone())


class ColumnParallelLinear(nn.Module):
    """y = x W^T + b with W's output rows split over the group; optionally gathered after."""

    def __init__(self, full: nn.Linear, group: Group | None, gather_output: bool = False) -> None:
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.weight = _shard(full.weight, 0, group, "column-parallel linear")
        self.bias = None if full.bias is None else _shard(full.bias, 0, group, "column-parallel bias")

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(copy_to_group(x, self.group), self.weight, self.bias)
        return gather_from_group(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = x W^T + b with W's input columns split: reads a split input, all-reduces the output."""

    def __init__(self, full: nn.Linear, group: Group | None) -> None:
        super().__init__()
        self.group = group
        self.weight = _shard(full.weight, 1, group, "row-parallel linear")
        self.bias = _copy(full.bias)

    def forward(self, x: Tensor) -> Tensor:
        y = reduce_from_group(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding whose vocabulary rows are split over the group; the output is replicated."""

    def __init__(self, full: nn.Embedding, group: Group | None) -> None:
        super().__init__()
        self.group = group
        self.weight = _shard(full.weight, 0, group, "vocabulary-parallel embedding")
        self.start = group_rank(group) * self.weight.shape[0]

    def forward(self, ids: Tensor) -> Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        e = F.embedding(local.masked_fill(outside, 0), self.weight)
        return reduce_from_group(e.masked_fill(outside.unsqueeze(-1), 0.0), self.group)


class _VocabParallelCE(torch.autograd.Function):
    """Per-token cross-entropy of logits split over the vocabulary, without gathering them."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, group: Group) -> Tensor:
        vocab = logits.shape[-1]
        start = group_rank(group) * vocab
        z = logits - _all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX).unsqueeze(-1)
        exp = z.exp()
        total = _all_reduce(exp.sum(dim=-1), group)
        local = target - start
        inside = (local >= 0) & (local < vocab)
        idx = local.clamp(0, vocab - 1).unsqueeze(-1)
        picked = _all_reduce(z.gather(-1, idx).squeeze(-1) * inside, group)
        ctx.save_for_backward(exp / total.unsqueeze(-1), idx, inside)
        return total.log() - picked

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        softmax, idx, inside = ctx.saved_tensors
        g = softmax.scatter_add(-1, idx, -inside.to(softmax.dtype).unsqueeze(-1))
        return g * grad.unsqueeze(-1), None, None


class VocabParallelCrossEntropy(nn.Module):
    """Mean cross-entropy over all tokens; logits split over the group's vocabulary slices."""

    def __init__(self, group: Group | None) -> None:
        super().__init__()
        self.group = group

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        if group_size(self.group) == 1:
            return F.cross_entropy(logits.flatten(0, -2), target.flatten())
        return _VocabParallelCE.apply(logits, target, self.group).mean()


STYLES = {
    "colwise": lambda m, g: ColumnParallelLinear(m, g),
    "colwise_gather": lambda m, g: ColumnParallelLinear(m, g, gather_output=True),
    "rowwise": lambda m, g: RowParallelLinear(m, g),
    "vocab_embedding": lambda m, g: VocabParallelEmbedding(m, g),
    "vocab_loss": lambda m, g: VocabParallelCrossEntropy(g),
}


def parallelize(module: nn.Module, plan: dict[str, str], group: Group | None) -> nn.Module:
    """Replace the submodules named in `plan` (dotted path -> style in STYLES) by their parallel form.

    Parameter names stay those of the full module, so a reference model's gradients line up.
    """
    for path, style in plan.items():
        if style not in STYLES:
            raise PipelineError(f"parallel plan: style {style!r} for {path} is not one of {', '.join(STYLES)}")
        parent_path, _, name = path.rpartition(".")
        parent = module.get_submodule(parent_path) if parent_path else module
        setattr(parent, name, STYLES[style](getattr(parent, name), group))
    return module
