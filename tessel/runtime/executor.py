"""Executor: one rank's program of a schedule, run with torch.distributed point-to-point messages.

Each block runs on detached inputs, so every block has its own autograd graph: the forward keeps
(inputs, output) for its backward; the backward receives the output gradient, runs autograd,
hands the input gradients on and drops the graph (with a split backward, the weight block drops
it). Sink blocks return their micro-batch's mean loss; its backward starts from 1/N, so gradients
accumulated over the N micro-batches are those of the whole batch's mean loss. A block may return
any pytree of tensors: it travels packed into one tensor (pack.py).

Messages: `recv` posts an irecv into a fresh buffer, the reading task waits for it; `send` posts
an isend and the tensor is kept until delivered. Tags come from the lowering (unique per step).
Buffers need shapes: the first step (and any step whose batch fields change shape) starts with a
shape pass that runs the forward blocks of micro-batch 0 on zeros and sends each activation's
packing (shapes, types, structure; JSON) ahead, in program order, as torch.distributed.pipelining
does with its shape inference.

Ranks are those of `group` (the pipeline's process group; default the whole job): program rank r
is group rank r.
"""
from __future__ import annotations

import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.autograd.graph import _engine_run_backward

from ..errors import ExecutionError as ExecutionError
from ..errors import PipelineError
from .comm import Context
from .pack import PackError, Packing, pack, packing_of, unpack
from .program import TAG_LIMIT, Instruction, Programs, tag_of

log = logging.getLogger(__name__)

HEADER_TAG = TAG_LIMIT  # shape messages use tags above every data tag of a step
HEADER_BYTES = 4096  # a packing's JSON, padded

LocalKey = tuple[Any, ...]  # ("act", block, mb) or ("grad", edge, mb)
InboxKey = tuple[int, int]  # (src, tag)
Read = tuple[LocalKey | None, InboxKey | None]  # one input of a compute task: local, or received


def autograd_backward(output: Tensor, grad: Tensor, inputs: Sequence[Tensor] = ()) -> None:
    """`torch.autograd.backward(output, grad, inputs=inputs or None)`, gradients accumulated into the leaves.

    Straight to autograd's engine, as torch's own function ends: torch's gradient check first
    imports torch.fx's symbolic shapes (sympy), about a second of start-up per process; the one
    check that matters here, shape and type, is made before."""
    _check_grad(output, grad)
    _engine_run_backward((output,), (grad,), False, False, tuple(inputs), allow_unreachable=True,
                         accumulate_grad=True)


def autograd_grad(output: Tensor, grad: Tensor, inputs: Sequence[Tensor]) -> tuple[Tensor | None, ...]:
    """`torch.autograd.grad(output, inputs, grad, retain_graph=True, allow_unused=True)` (see
    autograd_backward): the inputs' gradients, None for one the output does not depend on."""
    _check_grad(output, grad)
    return tuple(_engine_run_backward((output,), (grad,), True, False, tuple(inputs), True,
                                      accumulate_grad=False))


def _check_grad(output: Tensor, grad: Tensor) -> None:
    if grad.shape != output.shape or grad.dtype != output.dtype or grad.device != output.device:
        raise ExecutionError(f"a gradient of shape {tuple(grad.shape)} ({grad.dtype}, {grad.device}) for an output of "
                             f"shape {tuple(output.shape)} ({output.dtype}, {output.device}): a block's backward "
                             "must give gradients shaped like its forward's outputs")


class Pacer(Protocol):
    """A device model (emulate.py): how long each compute task takes, when each send leaves.

    `begin_step` is called as a step's program starts; `start` before a compute task reads its
    received inputs (`inputs`: their (src, tag), `waits`: their receives' works, which it awaits),
    `finish` after its block ran; `receive` after a receive is posted; `send` gets a function that
    posts one send; `drain`, at the end of a step, awaits whatever it still holds.
    """

    def begin_step(self) -> None: ...

    def start(self, ins: Instruction, inputs: Sequence[tuple[int, int]], waits: Sequence[Any]) -> None: ...

    def finish(self, ins: Instruction) -> None: ...

    def receive(self, src: int, tag: int) -> None: ...

    def send(self, post: Callable[[], Any], tensor: Tensor, dst: int, tag: int) -> None: ...

    def drain(self) -> None: ...



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
    graphs: list[weakref.ref[Tensor]] = field(default_factory=list)
    peak: int = 0
    losses: dict[str, Tensor] = field(default_factory=dict)


class Executor:
    """Runs rank `ctx.rank`'s program; `blocks` are the modules of the forward blocks on this rank."""

    def __init__(self, programs: Programs, ctx: Context, blocks: Mapping[str, nn.Module],
                 feeds: Mapping[str, Sequence[str]], group: Any = None, pacer: Pacer | None = None) -> None:
        self.flow, self.ctx, self.group, self.pacer = programs.flow, ctx, group, pacer
        self.rank = ctx.rank if group is None else dist.get_rank(group)
        self.program = programs.ranks[self.rank]
        self.n = programs.micro_batches
        self.blocks, self.feeds = dict(blocks), {b: tuple(f) for b, f in feeds.items()}
        mine = {i.block for i in self.program if i.op == "forward"}
        if set(self.blocks) != mine:
            missing, extra = sorted(mine - set(self.blocks)), sorted(set(self.blocks) - mine)
            raise PipelineError(f"rank {self.rank} runs forward blocks {sorted(mine)}: give a module for each, "
                             + (f"no module for block {missing[0]!r}" if missing else
                                f"got a module for block {extra[0]!r}, which runs on other ranks"))
        for b in mine:
            if b not in self.feeds:
                raise PipelineError(f"rank {self.rank}: no batch fields (feeds) given for block {b!r}: name the "
                                    "fields it reads in feeds={block: [field, ...]}")
        for b, m in self.blocks.items():
            m.requires_grad_(b in self.flow.backward)
        # where each compute task's inputs come from, worked out once
        self.reads = {i: self._reads(ins) for i, ins in enumerate(self.program) if ins.is_compute}
        self.uses = self._count_uses()
        self.shapes: dict[str, Packing] = {}  # each forward block's output, as this rank learned it
        self.shape_key: tuple[Any, ...] | None = None

    def parameters(self) -> list[nn.Parameter]:
        """The trained parameters of this rank, for its optimizer."""
        return [p for b in self.blocks if b in self.flow.backward for p in self.blocks[b].parameters()]

    # ---- reads ----------------------------------------------------------------------------------
    def _reads(self, ins: Instruction) -> list[Read]:
        """Where each input of a compute task comes from: a local tensor or a posted receive."""
        out: list[Read] = []
        for x in self.flow.inputs(ins.block):
            src = self.flow.source(x, self.rank)
            if src is None:
                key: LocalKey = ("grad", x.edge, ins.micro_batch) if x.grad else ("act", x.edge[0], ins.micro_batch)
                out.append((key, None))
            else:
                out.append((None, (src, tag_of(self.flow, x.edge, x.grad, ins.micro_batch))))
        return out

    @staticmethod
    def _sent(ins: Instruction) -> LocalKey:
        t = ins.transfer
        assert t is not None
        return ("grad", t.edge, t.micro_batch) if t.grad else ("act", t.edge[0], t.micro_batch)

    def _count_uses(self) -> Counter[LocalKey]:
        uses: Counter[LocalKey] = Counter(k for reads in self.reads.values() for k, _ in reads if k is not None)
        uses.update(self._sent(ins) for ins in self.program if ins.op == "send")
        return uses

    # ---- one step -------------------------------------------------------------------------------
    def run(self, batch: Mapping[str, Tensor], accumulate: bool = False) -> StepResult:
        """Forward and backward of every micro-batch; gradients accumulate into `.grad`, which is
        cleared first unless `accumulate` (then the caller zeroes it, as with plain autograd)."""
        mbs = split_batch(batch, self.n, self.ctx.device)
        key = tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(mbs[0].items()))
        if key != self.shape_key:
            self._infer_shapes(mbs[0])
            self.shape_key = key
        if not accumulate:
            for p in self.parameters():
                p.grad = None
        st = _Step(mbs)
        start = time.perf_counter()
        if self.pacer is not None:
            self.pacer.begin_step()
        for i, ins in enumerate(self.program):
            with self._at(i, ins):
                self._execute(i, ins, st)
        self.ctx.where = "the end of the step (waiting for sends)"
        if self.pacer is not None:
            self.pacer.drain()
        for work, _ in st.sends:
            work.wait()
        leftover = list(st.saved) + list(st.local) + list(st.inbox)
        if leftover:
            raise ExecutionError(f"rank {self.rank}: step ended with state left over: {leftover[:3]} (a program "
                                 "that does not match the schedule: please report it)")
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
            packing = self.shapes[t.edge[0]]
            buf = torch.empty(packing.buffer_shape, dtype=packing.carrier, device=self.ctx.device)
            st.inbox[(t.src, t.tag)] = (buf, self._irecv(buf, t.src, t.tag))
            if self.pacer is not None:
                self.pacer.receive(t.src, t.tag)
        elif ins.op == "send":
            t = ins.transfer
            assert t is not None
            x = self._take(st, self._sent(ins), None)
            if self.pacer is not None:
                self.pacer.send(lambda: self._isend(x, t.dst, t.tag), x, t.dst, t.tag)
            else:
                st.sends.append((self._isend(x, t.dst, t.tag), x))
        else:
            if self.pacer is not None:
                keys = [r for _, r in self.reads[i] if r is not None]
                self.pacer.start(ins, keys, [st.inbox[k][1] for k in keys])
                for k in keys:  # awaited: a gloo receive's work must not be awaited twice (it hangs)
                    st.inbox[k] = (st.inbox[k][0], None)
            getattr(self, f"_{ins.op}")(ins, st, self.reads[i])
            if self.pacer is not None:
                self.pacer.finish(ins)
            st.sends = [(w, x) for w, x in st.sends if not w.is_completed()]
            st.graphs = [r for r in st.graphs if r() is not None]
            st.peak = max(st.peak, len(st.graphs))

    def _isend(self, x: Tensor, dst: int, tag: int) -> Any:
        if self.group is None:
            return dist.isend(x, dst, tag=tag)
        return dist.isend(x, group=self.group, group_dst=dst, tag=tag)

    def _irecv(self, x: Tensor, src: int, tag: int) -> Any:
        if self.group is None:
            return dist.irecv(x, src, tag=tag)
        return dist.irecv(x, group=self.group, group_src=src, tag=tag)

    def _call(self, b: str, xs: Sequence[Tensor], mb: Mapping[str, Tensor]) -> Any:
        """Block b on its input activations (unpacked) and its batch fields."""
        args = [unpack(x, self.shapes[e[0]]) for x, e in zip(xs, self.flow.in_edges[b])]
        return self.blocks[b](*args, *(mb[f] for f in self.feeds[b]))

    def _take(self, st: _Step, local: LocalKey | None, inbox: InboxKey | None) -> Tensor:
        if inbox is not None:
            buf, work = st.inbox.pop(inbox)
            if work is not None:
                work.wait()
            return buf
        assert local is not None
        entry = st.local[local]
        entry[1] -= 1
        if entry[1] == 0:
            del st.local[local]
        x: Tensor = entry[0]
        return x

    def _keep(self, st: _Step, key: LocalKey, x: Tensor) -> None:
        if self.uses[key]:
            st.local[key] = [x, self.uses[key]]

    def _forward(self, ins: Instruction, st: _Step, reads: list[Read]) -> None:
        b, m, flow = ins.block, ins.micro_batch, self.flow
        trained = b in flow.backward
        xs = [self._take(st, *r) for r in reads]
        leaves = [x.detach().requires_grad_(trained and flow.trains_input(e) and x.is_floating_point())
                  for x, e in zip(xs, flow.in_edges[b])]
        with torch.set_grad_enabled(trained):
            out = pack(self._call(b, leaves, st.mbs[m]), self.shapes[b], f"block {b!r}")
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
        differentiable = saved.output.requires_grad  # not when only integer tensors come out
        if y in flow.weight:
            wanted = [x for x in leaves if x.requires_grad]
            found = autograd_grad(saved.output, grad, wanted) if wanted and differentiable else ()
            by_leaf = {id(x): g for x, g in zip(wanted, found)}
            gin = [by_leaf.get(id(x)) for x in leaves]
            saved.grad = grad
        else:
            if differentiable:
                autograd_backward(saved.output, grad)
            gin = [x.grad for x in leaves]
            del st.saved[(y, m)]
        for e, g, x in zip(edges, gin, leaves):
            self._keep(st, ("grad", e, m), (g if g is not None else torch.zeros_like(x)).contiguous())

    def _weight(self, ins: Instruction, st: _Step, reads: list[Read]) -> None:
        y = self.flow.forward_of[ins.block]
        saved = st.saved.pop((y, ins.micro_batch))
        params = [p for p in self.blocks[y].parameters() if p.requires_grad]
        if params and saved.output.requires_grad:
            assert saved.grad is not None
            autograd_backward(saved.output, saved.grad, params)

    # ---- shapes ---------------------------------------------------------------------------------
    def _infer_shapes(self, mb: Mapping[str, Tensor]) -> None:
        """Learn every received activation's shape: forward blocks of micro-batch 0, on zeros."""
        heads: dict[InboxKey, tuple[Tensor, Any]] = {}
        sends = []
        for i, ins in enumerate(self.program):
            t = ins.transfer
            # program.shape_pass keeps the same instructions: the lowering's check replays them
            if ins.micro_batch != 0 or (t is not None and t.grad) or ins.op in ("backward", "weight"):
                continue
            if t is None:
                with self._at(i, ins, "shape pass, "):
                    self._shape_forward(ins, self.reads[i], mb, heads)
                continue
            with self._at(i, ins, "shape pass, "):
                if ins.op == "recv":
                    buf = torch.zeros(HEADER_BYTES, dtype=torch.uint8, device=self.ctx.device)
                    heads[(t.src, t.tag)] = (buf, self._irecv(buf, t.src, HEADER_TAG + t.tag))
                else:
                    head = _header(self.shapes[ins.block], ins.block).to(self.ctx.device)
                    sends.append((self._isend(head, t.dst, HEADER_TAG + t.tag), head))
        for work, _ in sends:
            work.wait()

    def _shape_forward(self, ins: Instruction, reads: list[Read], mb: Mapping[str, Tensor],
                       heads: dict[InboxKey, tuple[Tensor, Any]]) -> None:
        xs = []
        for x, (_, inbox) in zip(self.flow.inputs(ins.block), reads):
            if inbox is not None:
                buf, work = heads.pop(inbox)
                work.wait()
                self.shapes[x.edge[0]] = _parse_header(buf, x.edge[0])
            p = self.shapes[x.edge[0]]
            xs.append(torch.zeros(p.buffer_shape, dtype=p.carrier, device=self.ctx.device))
        b = ins.block
        with torch.no_grad():
            out = self._call(b, xs, mb)
        self.shapes[b] = packing_of(out, f"block {b!r}")
        if b in self.flow.sinks and (not self.shapes[b].single or out.dim() != 0 or not out.is_floating_point()):
            raise PackError(f"block {b!r} is a last block: it must return its micro-batch's mean loss, a "
                            f"floating scalar, but returned {self.shapes[b].describe()}")


def _header(p: Packing, block: str) -> Tensor:
    data = p.to_json().encode()
    if len(data) > HEADER_BYTES:
        raise PackError(f"block {block!r} returns {len(p.leaves)} tensors: their description takes "
                        f"{len(data)} bytes, more than {HEADER_BYTES}; return fewer tensors")
    return torch.frombuffer(bytearray(data.ljust(HEADER_BYTES)), dtype=torch.uint8).clone()


def _parse_header(h: Tensor, block: str) -> Packing:
    try:
        return Packing.from_json(bytes(h.cpu().tolist()).decode().strip())
    except (ValueError, KeyError, TypeError) as e:
        raise ExecutionError(f"the description of block {block!r}'s output arrived unreadable: {e} (ranks running "
                             "different tessel versions?)") from e


def split_batch(batch: Mapping[str, Tensor], n: int, device: torch.device) -> list[dict[str, Tensor]]:
    """N equal micro-batches along the first dimension of every field."""
    out: list[dict[str, Tensor]] = [{} for _ in range(n)]
    for k, v in batch.items():
        if v.shape[0] % n:
            raise PipelineError(f"batch field {k!r} has {v.shape[0]} rows, not a multiple of {n} micro-batches: "
                                f"give a multiple of {n} rows")
        for i, part in enumerate(v.to(device).chunk(n)):
            out[i][k] = part
    return out
