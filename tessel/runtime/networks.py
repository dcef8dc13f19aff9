"""Example networks (the `--model` of `tessel run`) whose blocks are bound to a placement's forward
blocks; small enough for CPU tests. ("Model" elsewhere: the CP-SAT model in search/solver.py, the
cost model in costmodel/.)

- `gpt`: GPT-style decoder on a chain placement. The first forward block embeds the tokens, the
  last one holds the LM head and the loss, the others are transformer layers. A block on several
  devices is tensor-parallel: the embedding and the head vocabulary-parallel (`mllm`: both on all
  ranks, the M shape with its head), a middle one a Megatron-style layer (`nnshape`).
- `kshape`: two-branch encoder (text tokens, image patches) joined by a fusion block (`kshape`: the
  fusion block on all ranks, a tensor-parallel MLP and a classifier).
- `mlp`: MLP blocks on any placement (chains such as `vshape`, `interleaved`, `zb`, or graphs):
  sources read features, a block reads the concatenation of its inputs, sinks classify.
- `emulated`: elementwise blocks on any placement, activations of `features` floats per sample,
  replicated on a block's devices: the stand-ins of emulated devices (emulate.py), whose time
  comes from the placement, not from their compute.

Every block is built whole and deterministically from the seed (so every rank and a single-process
reference agree on the weights), then parallelised when its placement block spans several devices.
A block module takes its input activations then its batch fields (`feeds`); a sink returns the
mean loss of its micro-batch, any other block one activation tensor.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property, partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import UsageError
from ..placement import Placement, PlacementError, make_placement
from .dataflow import Dataflow, dataflow
from .memory import GraphMemory, unit_bytes
from .tp import Group, ShapeGroup, VocabParallelCrossEntropy, parallelize


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    dim: int = 32
    heads: int = 4
    ffn: int = 64
    seq: int = 8
    classes: int = 8
    features: int = 16
    patch: int = 12
    layers: int = 1  # transformer layers per pipeline block


# ---- layers ------------------------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self, cfg: Config, causal: bool) -> None:
        super().__init__()
        self.head_dim, self.causal = cfg.dim // cfg.heads, causal
        self.q, self.k, self.v = (nn.Linear(cfg.dim, cfg.dim) for _ in range(3))
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        # local heads: all of them, or this rank's slice when q/k/v are column-parallel
        q, k, v = (f(x).view(b, s, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, d_in: int, hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Layer(nn.Module):
    """Pre-norm transformer layer."""

    def __init__(self, cfg: Config, causal: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(cfg.dim), nn.LayerNorm(cfg.dim)
        self.attn, self.mlp = Attention(cfg, causal), MLP(cfg.dim, cfg.ffn, cfg.dim)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def layer_plan(prefix: str) -> dict[str, str]:
    """Megatron layer: heads split (q/k/v column-parallel, projection row-parallel), MLP split."""
    return {f"{prefix}attn.q": "colwise", f"{prefix}attn.k": "colwise", f"{prefix}attn.v": "colwise",
            f"{prefix}attn.proj": "rowwise", f"{prefix}mlp.fc1": "colwise", f"{prefix}mlp.fc2": "rowwise"}


class ClassLoss(nn.Module):
    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits, target)


class ExampleBlock(nn.Module):
    """`body` maps inputs to an activation (or, in a sink, logits); a sink adds `loss`.

    `plan` says how the block parallelises over a group (see tp.parallelize).
    """

    def __init__(self) -> None:
        super().__init__()
        self.loss: nn.Module | None = None
        self.plan: dict[str, str] = {}

    def body(self, *inputs: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, *args: Tensor) -> Tensor:
        if self.loss is None:
            return self.body(*args)
        *inputs, target = args
        return self.loss(self.body(*inputs), target)


# ---- GPT ---------------------------------------------------------------------------------------
class GPTBlock(ExampleBlock):
    def __init__(self, cfg: Config, embed: bool, layers: int, head: bool) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim) if embed else None
        self.pos = nn.Embedding(cfg.seq, cfg.dim) if embed else None
        self.layers = nn.ModuleList(Layer(cfg, causal=True) for _ in range(layers))
        if head:
            self.norm, self.out = nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.vocab, bias=False)
            self.loss = VocabParallelCrossEntropy(None)
        plan = {"tok": "vocab_embedding"} if embed else {}
        for i in range(layers):
            plan.update(layer_plan(f"layers.{i}."))
        self.plan = plan | ({"out": "colwise", "loss": "vocab_loss"} if head else {})

    def body(self, *inputs: Tensor) -> Tensor:
        (x,) = inputs
        if self.tok is not None and self.pos is not None:
            x = self.tok(x) + self.pos(torch.arange(x.shape[1], device=x.device))
        for layer in self.layers:
            x = layer(x)
        return self.out(self.norm(x)) if self.loss is not None else x


def _gpt(flow: Dataflow, cfg: Config) -> dict[str, BlockSpec]:
    chain = _chain(flow, "gpt")
    specs = {}
    for i, b in enumerate(chain):
        first, last, wide = i == 0, i == len(chain) - 1, len(flow.devices(b)) > 1
        # a block on several devices is the embedding or the head alone; a one-device end block
        # adds a layer so every pipeline stage has transformer work
        layers = 0 if wide and (first or last) else cfg.layers
        feeds = (("tokens",) if first else ()) + (("targets",) if last else ())
        specs[b] = BlockSpec(partial(GPTBlock, cfg, first, layers, last), feeds)
    return specs


def _gpt_batch(cfg: Config, size: int, g: torch.Generator) -> dict[str, Tensor]:
    tokens = torch.randint(0, cfg.vocab, (size, cfg.seq + 1), generator=g)
    return {"tokens": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}


# ---- two-branch model (K shape) --------------------------------------------------------------
class BranchBlock(ExampleBlock):
    """An encoder branch stage; the first one embeds text tokens or image patches."""

    def __init__(self, cfg: Config, start: str | None) -> None:
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.dim) if start == "text" else None
        self.patch = nn.Linear(cfg.patch, cfg.dim) if start == "image" else None
        self.pos = nn.Parameter(torch.randn(cfg.seq, cfg.dim) * 0.02) if start else None
        self.layers = nn.ModuleList(Layer(cfg, causal=False) for _ in range(cfg.layers))
        self.plan = {k: v for i in range(cfg.layers) for k, v in layer_plan(f"layers.{i}.").items()}

    def body(self, *inputs: Tensor) -> Tensor:
        (x,) = inputs
        if self.tok is not None:
            x = self.tok(x)
        elif self.patch is not None:
            x = self.patch(x)
        if self.pos is not None:
            x = x + self.pos
        for layer in self.layers:
            x = layer(x)
        return x


class FusionBlock(ExampleBlock):
    """Pools each branch, fuses them with an MLP (tensor-parallel on several ranks), classifies."""

    def __init__(self, cfg: Config, branches: int) -> None:
        super().__init__()
        self.mlp = MLP(branches * cfg.dim, cfg.ffn, cfg.dim)
        self.norm, self.head = nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.classes)
        self.loss = ClassLoss()
        self.plan = {"mlp.fc1": "colwise", "mlp.fc2": "rowwise"}

    def body(self, *branches: Tensor) -> Tensor:
        return self.head(self.norm(self.mlp(torch.cat([x.mean(dim=1) for x in branches], dim=-1))))


def _kshape(flow: Dataflow, cfg: Config) -> dict[str, BlockSpec]:
    sources = [b for b in flow.forwards if not flow.in_edges[b]]
    if len(sources) != 2 or len(flow.sinks) != 1 or len(flow.in_edges[flow.sinks[0]]) != 2:
        raise PlacementError(f"model kshape needs two branches joined by one final block; placement "
                             f"{flow.placement.name} has sources {sources} and final blocks {list(flow.sinks)}")
    sink = flow.sinks[0]
    specs = {sink: BlockSpec(lambda: FusionBlock(cfg, 2), ("label",))}
    for start, field_name in zip(sources, ("text", "image")):
        b = start
        while b != sink:
            specs[b] = BlockSpec(partial(BranchBlock, cfg, field_name if b == start else None),
                                 (field_name,) if b == start else ())
            nxt = flow.out_edges[b]
            if len(nxt) != 1:
                raise PlacementError(f"model kshape: branch block {b} must feed exactly one block")
            b = nxt[0][1]
    return specs


def _kshape_batch(cfg: Config, size: int, g: torch.Generator) -> dict[str, Tensor]:
    return {"text": torch.randint(0, cfg.vocab, (size, cfg.seq), generator=g),
            "image": torch.randn(size, cfg.seq, cfg.patch, generator=g),
            "label": torch.randint(0, cfg.classes, (size,), generator=g)}


# ---- MLP on any placement --------------------------------------------------------------------
class MLPBlock(ExampleBlock):
    def __init__(self, cfg: Config, inputs: int, sink: bool) -> None:
        super().__init__()
        d_in = cfg.features if inputs == 0 else inputs * cfg.dim
        self.residual = inputs == 1
        self.mlp, self.norm = MLP(d_in, cfg.ffn, cfg.dim), nn.LayerNorm(cfg.dim)
        if sink:
            self.head, self.loss = nn.Linear(cfg.dim, cfg.classes), ClassLoss()
        self.plan = {"mlp.fc1": "colwise", "mlp.fc2": "rowwise"}

    def body(self, *inputs: Tensor) -> Tensor:
        x = torch.cat(inputs, dim=-1)
        h = self.mlp(x)
        h = self.norm(h + x if self.residual else h)
        return self.head(h) if self.loss is not None else h


def _mlp(flow: Dataflow, cfg: Config) -> dict[str, BlockSpec]:
    specs = {}
    for b in flow.forwards:
        n_in, sink = len(flow.in_edges[b]), b in flow.sinks
        feeds = (("x",) if n_in == 0 else ()) + (("y",) if sink else ())
        specs[b] = BlockSpec(partial(MLPBlock, cfg, n_in, sink), feeds)
    return specs


def _mlp_batch(cfg: Config, size: int, g: torch.Generator) -> dict[str, Tensor]:
    return {"x": torch.randn(size, cfg.features, generator=g),
            "y": torch.randint(0, cfg.classes, (size,), generator=g)}


# ---- emulated devices' blocks ---------------------------------------------------------------
class EmulatedBlock(ExampleBlock):
    """tanh(sum of inputs * w + b), elementwise: real tensors and autograd at almost no compute."""

    def __init__(self, cfg: Config, sink: bool) -> None:
        super().__init__()
        self.w = nn.Parameter(1 + 0.1 * torch.randn(cfg.features))
        self.b = nn.Parameter(0.1 * torch.randn(cfg.features))
        if sink:
            self.loss = nn.MSELoss()

    def body(self, *inputs: Tensor) -> Tensor:
        return torch.tanh(torch.stack(inputs).sum(0) * self.w + self.b)


def _emulated(flow: Dataflow, cfg: Config) -> dict[str, BlockSpec]:
    specs = {}
    for b in flow.forwards:
        sink = b in flow.sinks
        feeds = (("x",) if not flow.in_edges[b] else ()) + (("y",) if sink else ())
        specs[b] = BlockSpec(partial(EmulatedBlock, cfg, sink), feeds)
    return specs


def _emulated_batch(cfg: Config, size: int, g: torch.Generator) -> dict[str, Tensor]:
    return {"x": torch.randn(size, cfg.features, generator=g), "y": torch.randn(size, cfg.features, generator=g)}


# ---- binding -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockSpec:
    make: Callable[[], ExampleBlock]
    feeds: tuple[str, ...]


@dataclass(frozen=True)
class ModelKind:
    bind: Callable[[Dataflow, Config], dict[str, BlockSpec]]
    batch: Callable[[Config, int, torch.Generator], dict[str, Tensor]]
    placement: str  # the library placement it is made for


MODELS: dict[str, ModelKind] = {
    "gpt": ModelKind(_gpt, _gpt_batch, "mllm"),
    "kshape": ModelKind(_kshape, _kshape_batch, "kshape"),
    "mlp": ModelKind(_mlp, _mlp_batch, "vshape"),
    "emulated": ModelKind(_emulated, _emulated_batch, "vshape"),
}


@dataclass(frozen=True)
class Example:
    """A model bound to a placement: block modules (whole or parallel), batch fields, batches."""
    kind: str
    placement: Placement
    config: Config = field(default_factory=Config)
    seed: int = 0

    @cached_property
    def flow(self) -> Dataflow:
        return dataflow(self.placement)

    @cached_property
    def specs(self) -> dict[str, BlockSpec]:
        return MODELS[self.kind].bind(self.flow, self.config)

    @property
    def feeds(self) -> dict[str, tuple[str, ...]]:
        return {b: s.feeds for b, s in self.specs.items()}

    def whole(self, block: str) -> ExampleBlock:
        """The block on one process, its weights fixed by the seed and the block's position."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed * 1009 + self.flow.forwards.index(block))
            return self.specs[block].make()

    def build(self, block: str, group: Group | None) -> ExampleBlock:
        """The block as this rank runs it: parallel over `group` when it spans several devices."""
        m = self.whole(block)
        if group is not None and len(self.flow.devices(block)) > 1:
            parallelize(m, dict(m.plan), group)
        return m

    def batch(self, size: int, seed: int = 0) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(seed)
        return MODELS[self.kind].batch(self.config, size, g)


def example(kind: str, placement: Placement, config: Config | None = None, seed: int = 0) -> Example:
    if kind not in MODELS:
        raise UsageError(f"unknown model {kind!r}; known: {', '.join(MODELS)}")
    ex = Example(kind, placement, config or Config(), seed)
    _ = ex.specs  # bind now: a placement the model cannot use fails here, naming the reason
    return ex


def declare_kept(ex: Example, size: int = 2) -> Placement:
    """The example's placement with each sharded block's memory set to what it keeps.

    The library's sharded blocks (a block on several devices: an embedding, a head, a fusion or a
    tensor-parallel layer) declare a fixed memory, mostly 0, though their graphs live until their
    backward. Here each trained forward block saves its activations for one micro-batch of `size`
    samples; a block on k devices is measured as one of its ranks runs it (`_kept_bytes`), in the
    placement's units: bytes per unit is the median, over the one-device trained blocks, of kept
    bytes / declared memory. One-device blocks keep their
    declared memory; a placement without one (no unit) is returned as it is.
    """
    p = ex.placement
    kept = _kept_bytes(ex, size)
    single = {b.id: float(b.memory) for b in p.blocks if b.kind == "forward" and len(b.devices) == 1}
    unit = unit_bytes(kept, single)
    if unit is None:
        return p
    memory = {b.id: round(kept.get(b.id, 0) / unit, 3) for b in p.blocks
              if b.kind == "forward" and len(b.devices) > 1 and b.id in ex.flow.backward}
    return with_forward_memory(p, memory)


def with_forward_memory(p: Placement, memory: Mapping[str, float]) -> Placement:
    """`p` with forward blocks' memory replaced; the block that frees each graph (its weight block,
    else its backward) releases it."""
    release = {}
    for f in memory:
        consumers = [b for b in p.blocks if b.grad_of == f]
        if consumers:
            release[next((b.id for b in consumers if b.kind == "weight"), consumers[0].id)] = -memory[f]
    blocks = [replace(b, memory=memory[b.id]) if b.id in memory else
              replace(b, memory=release[b.id]) if b.id in release else
              replace(b, memory=0) if b.grad_of in memory else b for b in p.blocks]
    return make_placement(p.name, p.devices, blocks, p.edges, p.latency)


def _kept_bytes(ex: Example, size: int) -> dict[str, int]:
    """Bytes each trained forward block saves for its backward on one of its devices, one micro-batch.

    A block on k devices is built as rank 0 of k shards it (tp.ShapeGroup: sharded parameters,
    collectives that keep their shapes) and measured as it runs there: its saved inputs whole, its
    sharded intermediates, and the replicated ones (a layer norm's output feeding column-parallel
    layers, a row-parallel layer's reduced output) whole, as every rank keeps them."""
    blocks = {b: (ex.build(b, ShapeGroup(0, len(ex.flow.devices(b)))) if len(ex.flow.devices(b)) > 1
                  else ex.whole(b)).requires_grad_(b in ex.flow.backward) for b in ex.flow.forwards}
    meter = GraphMemory(q for m in blocks.values() for q in m.parameters())
    meter.watch(blocks)
    batch = ex.batch(size)
    out: dict[str, Tensor] = {}
    kept: dict[str, int] = {}
    with meter.measuring(), torch.enable_grad():
        for b in ex.flow.forwards:  # each block on copies of its inputs, as a rank receives them
            inputs = [out[x].detach().clone().requires_grad_(out[x].is_floating_point())
                      for x, _ in ex.flow.in_edges[b]] + [batch[f].clone() for f in ex.feeds[b]]
            out[b] = blocks[b](*inputs)
            if b in ex.flow.backward:
                kept[b] = meter.block_bytes.get(b, 0)
    return kept


def reference_losses(ex: Example, blocks: Mapping[str, nn.Module], batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The whole model on one process: every forward block in dependency order; each sink's loss."""
    out: dict[str, Tensor] = {}
    for b in ex.flow.forwards:
        out[b] = blocks[b](*[out[x] for x, _ in ex.flow.in_edges[b]], *[batch[f] for f in ex.feeds[b]])
    return {b: out[b] for b in ex.flow.sinks}


def _chain(flow: Dataflow, model: str) -> list[str]:
    fw = flow.forwards
    if any(len(flow.in_edges[b]) > 1 or len(flow.out_edges[b]) > 1 for b in fw) or len(flow.sinks) != 1:
        raise PlacementError(f"model {model} needs a chain of forward blocks; placement "
                             f"{flow.placement.name} is not one")
    return list(fw)
