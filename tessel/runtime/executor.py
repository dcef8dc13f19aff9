"""Executor: one rank's program of a schedule, run with torch.distributed point-to-point messages.

Each block runs on detached inputs, so every block has its own autograd graph: the forward keeps
(inputs, output) for its backward; the backward receives the output gradient, runs autograd,
hands the input gradients on and drops the graph (with a split backward, the weight block drops
it). Sink blocks return their micro-batch's mean loss; its backward starts from 1/N, so gradients
accumulated over the N micro-batches are those of the whole batch's mean loss.

Messages: `recv` posts an irecv into a fresh buffer, the reading task waits for it; `send` posts
an isend and the tensor is kept until delivered. Tags come from the lowering (unique per step).
Buffers need shapes: the first step (and any step whose batch fields change shape) starts with a
shape pass that runs the forward blocks of micro-batch 0 on zeros and sends each activation's
shape ahead, in program order, as torch.distributed.pipelining does with its shape inference.
"""
from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from .comm import Context
from .program import TAG_LIMIT, Instruction, Programs, tag_of

log = logging.getLogger(__name__)

HEADER_TAG = TAG_LIMIT  # shape messages use tags above every data tag of a step
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32)
MAX_DIMS = 6

LocalKey = tuple[Any, ...]  # ("act", block, mb) or ("grad", edge, mb)
InboxKey = tuple[int, int]  # (src, tag)
Read = tuple[LocalKey | None, InboxKey | None]  # one input of a compute task: local, or received


class ExecutionError(RuntimeError):
    """An instruction failed; the message names the rank, the instruction, its block and micro-batch."""


@dataclass(frozen=True)
class StepResult:
    losses: dict[str, float]  # loss of each sink block on this rank, mean over the micro-batches
    seconds: float
    peak_graphs: int  # most forward graphs alive at once on this rank

    @property
    def loss(self) -> float | None:
        """This rank's sinks' losses summed; None where no sink runs."""
        return sum(self.losses.values()) if self.losses else None


@dataclass
class _Saved:
    inputs: list[Tensor]
    output: Tensor
    grad: Tensor | None = None  # the output gradient, kept for a split weight pass


@dataclass
class _Step:
    mbs: list[dict[str, Tensor]]
    local: dict[LocalKey, list[Any]] = field(default_factory=dict)  # key -> [tensor, uses left]
    inbox: dict[InboxKey, tuple[Tensor, Any]] = field(default_factory=dict)
    saved: dict[tuple[str, int], _Saved] = field(default_factory=dict)
    sends: list[tuple[Any, Tensor]] = field(default_factory=list)
    graphs: list[weakref.ref] = field(default_factory=list)
    peak: int = 0
    losses: dict[str, Tensor] = field(default_factory=dict)


class Executor:
    """Runs rank `ctx.rank`'s program; `blocks` are the modules of the forward blocks on this rank."""

    def __init__(self, programs: Programs, ctx: Context, blocks: Mapping[str, nn.Module],
                 feeds: Mapping[str, Sequence[str]]) -> None:
        self.flow, self.ctx, self.rank = programs.flow, ctx, ctx.rank
        self.program = programs.ranks[ctx.rank]
        self.n = programs.micro_batches
        self.blocks, self.feeds = dict(blocks), {b: tuple(f) for b, f in feeds.items()}
        mine = {i.block for i in self.program if i.op == "forward"}
        if set(self.blocks) != mine:
            raise ValueError(f"rank {self.rank} runs blocks {sorted(mine)} but got modules for {sorted(self.blocks)}")
        for b, m in self.blocks.items():
            m.requires_grad_(b in self.flow.backward)
        # where each compute task's inputs come from, worked out once
        self.reads = {i: self._reads(ins) for i, ins in enumerate(self.program) if ins.is_compute}
        self.uses = self._count_uses()
        self.shapes: dict[str, tuple[torch.Size, torch.dtype]] = {}
        self.shape_key: tuple | None = None

    def parameters(self) -> list[nn.Parameter]:
        """The trained parameters of this rank, for its optimizer."""
        return [p for b in self.blocks if b in self.flow.backward for p in self.blocks[b].parameters()]

    # ---- reads ----------------------------------------------------------------------------------
    def _reads(self, ins: Instruction) -> list[Read]:
        """Where each input of a compute task comes from: a local tensor or a posted receive."""
        out = []
        for x in self.flow.inputs(ins.block):
            src = self.flow.source(x, self.rank)
            if src is None:
                key = ("grad", x.edge, ins.micro_batch) if x.grad else ("act", x.edge[0], ins.micro_batch)
                out.append((key, None))
            else:
                out.append((None, (src, tag_of(self.flow, x.edge, x.grad, ins.micro_batch))))
        return out

    @staticmethod
    def _sent(ins: Instruction) -> LocalKey:
        t = ins.transfer
        assert t is not None
        return ("grad", t.edge, t.micro_batch) if t.grad else ("act", t.edge[0], t.micro_batch)

    def _count_uses(self) -> Counter:
        uses: Counter = Counter(k for reads in self.reads.values() for k, _ in reads if k is not None)
        uses.update(self._sent(ins) for ins in self.program if ins.op == "send")
        return uses

    # ---- one step -------------------------------------------------------------------------------
    def run(self, batch: Mapping[str, Tensor]) -> StepResult:
        """Forward and backward of every micro-batch; gradients accumulate into `.grad`."""
        mbs = split_batch(batch, self.n, self.ctx.device)
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(mbs[0].items()))
        if key != self.shape_key:
            self._infer_shapes(mbs[0])
            self.shape_key = key
        for p in self.parameters():
            p.grad = None
        st = _Step(mbs)
        start = time.perf_counter()
        for i, ins in enumerate(self.program):
            with self._at(i, ins):
                self._execute(i, ins, st)
        self.ctx.where = "the end of the step (waiting for sends)"
        for work, _ in st.sends:
            work.wait()
        leftover = list(st.saved) + list(st.local) + list(st.inbox)
        if leftover:
            raise ExecutionError(f"rank {self.rank}: step ended with state left over: {leftover[:3]}")
        self.ctx.where = "between steps"
        losses = {b: float(x) for b, x in st.losses.items()}
        return StepResult(losses, time.perf_counter() - start, st.peak)

    @contextmanager
    def _at(self, i: int, ins: Instruction, phase: str = "") -> Iterator[None]:
        """Say where this rank is (for the abort watcher) and name it in any failure."""
        self.ctx.where = f"{phase}instruction {i} ({ins})"
        try:
            yield
        except Exception as e:
            raise ExecutionError(f"rank {self.rank}: {self.ctx.where} failed: {type(e).__name__}: {e}") from e

    def _execute(self, i: int, ins: Instruction, st: _Step) -> None:
        if ins.op == "recv":
            t = ins.transfer
            assert t is not None
            shape, dtype = self.shapes[t.edge[0]]
            buf = torch.empty(shape, dtype=dtype, device=self.ctx.device)
            st.inbox[(t.src, t.tag)] = (buf, dist.irecv(buf, t.src, tag=t.tag))
        elif ins.op == "send":
            t = ins.transfer
            assert t is not None
            x = self._take(st, self._sent(ins), None)
            st.sends.append((dist.isend(x, t.dst, tag=t.tag), x))
        else:
            getattr(self, f"_{ins.op}")(ins, st, self.reads[i])
            st.sends = [(w, x) for w, x in st.sends if not w.is_completed()]
            st.graphs = [r for r in st.graphs if r() is not None]
            st.peak = max(st.peak, len(st.graphs))

    def _take(self, st: _Step, local: LocalKey | None, inbox: InboxKey | None) -> Tensor:
        if inbox is not None:
            buf, work = st.inbox.pop(inbox)
            work.wait()
            return buf
        entry = st.local[local]
        entry[1] -= 1
        if entry[1] == 0:
            del st.local[local]
        return entry[0]

    def _keep(self, st: _Step, key: LocalKey, x: Tensor) -> None:
        if self.uses[key]:
            st.local[key] = [x, self.uses[key]]

    def _forward(self, ins: Instruction, st: _Step, reads: list[Read]) -> None:
        b, m, flow = ins.block, ins.micro_batch, self.flow
        trained = b in flow.backward
        xs = [self._take(st, *r) for r in reads]
        leaves = [x.detach().requires_grad_(trained and flow.trains_input(e))
                  for x, e in zip(xs, flow.in_edges[b])]
        with torch.set_grad_enabled(trained):
            out = self.blocks[b](*leaves, *(st.mbs[m][f] for f in self.feeds[b]))
        if b in flow.sinks:
            st.losses[b] = out.detach() / self.n + st.losses.get(b, 0)
        if trained:
            st.saved[(b, m)] = _Saved(leaves, out)
            st.graphs.append(weakref.ref(out))
        self._keep(st, ("act", b, m), out.detach().contiguous())

    def _backward(self, ins: Instruction, st: _Step, reads: list[Read]) -> None:
        flow, m = self.flow, ins.micro_batch
        y = flow.forward_of[ins.block]
        saved = st.saved[(y, m)]
        grads = [self._take(st, *r) for r in reads]
        if y in flow.sinks:
            grad = torch.full_like(saved.output, 1.0 / self.n)
        else:
            grad = grads[0] if len(grads) == 1 else torch.stack(grads).sum(0)
        edges = [e for e in flow.in_edges[y] if flow.trains_input(e)]
        leaves = [x for x, e in zip(saved.inputs, flow.in_edges[y]) if flow.trains_input(e)]
        if y in flow.weight:
            gin = list(torch.autograd.grad(saved.output, leaves, grad, retain_graph=True)) if leaves else []
            saved.grad = grad
        else:
            torch.autograd.backward(saved.output, grad)
            gin = [x.grad if x.grad is not None else torch.zeros_like(x) for x in leaves]
            del st.saved[(y, m)]
        for e, g in zip(edges, gin):
            self._keep(st, ("grad", e, m), g.contiguous())

    def _weight(self, ins: Instruction, st: _Step, reads: list[Read]) -> None:
        y = self.flow.forward_of[ins.block]
        saved = st.saved.pop((y, ins.micro_batch))
        params = [p for p in self.blocks[y].parameters() if p.requires_grad]
        torch.autograd.backward(saved.output, saved.grad, inputs=params)

    # ---- shapes ---------------------------------------------------------------------------------
    def _infer_shapes(self, mb: Mapping[str, Tensor]) -> None:
        """Learn every received activation's shape: forward blocks of micro-batch 0, on zeros."""
        heads: dict[InboxKey, tuple[Tensor, Any]] = {}
        sends = []
        for i, ins in enumerate(self.program):
            t = ins.transfer
            if ins.micro_batch != 0 or (t is not None and t.grad) or ins.op in ("backward", "weight"):
                continue
            with self._at(i, ins, "shape pass, "):
                if ins.op == "recv":
                    buf = torch.zeros(2 + MAX_DIMS, dtype=torch.int64, device=self.ctx.device)
                    heads[(t.src, t.tag)] = (buf, dist.irecv(buf, t.src, tag=HEADER_TAG + t.tag))
                elif ins.op == "send":
                    head = _header(*self.shapes[ins.block]).to(self.ctx.device)
                    sends.append((dist.isend(head, t.dst, tag=HEADER_TAG + t.tag), head))
                else:
                    self._shape_forward(ins, self.reads[i], mb, heads)
        for work, _ in sends:
            work.wait()

    def _shape_forward(self, ins: Instruction, reads: list[Read], mb: Mapping[str, Tensor],
                       heads: dict[InboxKey, tuple[Tensor, Any]]) -> None:
        xs = []
        for x, (_, inbox) in zip(self.flow.inputs(ins.block), reads):
            if inbox is not None:
                buf, work = heads.pop(inbox)
                work.wait()
                self.shapes[x.edge[0]] = _parse_header(buf)
            shape, dtype = self.shapes[x.edge[0]]
            xs.append(torch.zeros(shape, dtype=dtype, device=self.ctx.device))
        with torch.no_grad():
            out = self.blocks[ins.block](*xs, *(mb[f] for f in self.feeds[ins.block]))
        self.shapes[ins.block] = (out.shape, out.dtype)


def _header(shape: torch.Size, dtype: torch.dtype) -> Tensor:
    if len(shape) > MAX_DIMS or dtype not in DTYPES:
        raise ValueError(f"cannot send a tensor of shape {tuple(shape)} and type {dtype} "
                         f"(at most {MAX_DIMS} dimensions, types {DTYPES})")
    h = torch.zeros(2 + MAX_DIMS, dtype=torch.int64)
    h[0], h[1] = len(shape), DTYPES.index(dtype)
    h[2:2 + len(shape)] = torch.tensor(shape, dtype=torch.int64)
    return h


def _parse_header(h: Tensor) -> tuple[torch.Size, torch.dtype]:
    v = h.tolist()
    return torch.Size(v[2:2 + v[0]]), DTYPES[v[1]]


def split_batch(batch: Mapping[str, Tensor], n: int, device: torch.device) -> list[dict[str, Tensor]]:
    """N equal micro-batches along the first dimension of every field."""
    out: list[dict[str, Tensor]] = [{} for _ in range(n)]
    for k, v in batch.items():
        if v.shape[0] % n:
            raise ValueError(f"batch field {k!r} has {v.shape[0]} rows, not a multiple of {n} micro-batches")
        for i, part in enumerate(v.to(device).chunk(n)):
            out[i][k] = part
    return out
