"""Analytic cost model of transformer-style blocks on a given GPU: time, memory, messages.

Placements at paper scale (GPT with hidden 8192 and a huge vocabulary, mT5, a FLAVA-like
multimodal model, AlphaFold-like recycling, Swin) are built from these formulas, so a schedule
can be searched and simulated without the hardware. Every formula is written out where it is
computed; the symbols are:

    b  micro-batch size (sequences)          s  sequence length (tokens)
    h  hidden size                           f  feed-forward (MLP) inner size, 4h by default
    a  attention heads                       V  vocabulary size
    t  tensor-parallel degree (devices a block is split over)
    F  sustained dense FLOP/s of one device  B  bandwidth of the link a message crosses (bytes/s)

Time of a block = its FLOPs / (t * F) + the collectives it issues (ring all-reduce) + the
memory-bound work it does (bytes / HBM bandwidth). A backward costs twice its forward in FLOPs
(one GEMM for the input gradient and one for the weight gradient per forward GEMM; Narayanan et
al., SC'21). Mixed-precision training keeps 16 bytes per parameter (fp16 weight and gradient,
fp32 master weight and two Adam moments; Rajbhandari et al., ZeRO, SC'20); inference keeps 2.
Activation memory follows Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (MLSys'23), eq. 1-2, without sequence parallelism or recomputation.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .errors import TesselError
from .placement import Placement

GIB = 1024 ** 3
MIB = 1024 ** 2
BACKWARD_FACTOR = 2.0        # backward FLOPs / forward FLOPs
TRAIN_BYTES_PER_PARAM = 16   # 2 weight + 2 grad + 4 master + 4 + 4 Adam moments
INFER_BYTES_PER_PARAM = 2


@dataclass(frozen=True)
class Hardware:
    """One device type and its links. Bandwidths are per device, in bytes/s, as seen by a ring."""
    name: str
    flops: float              # sustained dense FLOP/s (the training precision's GEMMs)
    memory: float             # bytes of device memory
    hbm: float                # effective device-memory bandwidth, for memory-bound kernels
    intra_bandwidth: float    # inside a node (NVLink)
    inter_bandwidth: float    # across nodes (InfiniBand)
    devices_per_node: int = 8
    link_latency: float = 10e-6   # start-up time of one message (the alpha of alpha-beta)
    reserved: float = 3 * GIB     # CUDA context, allocator slack, GEMM workspaces

    def bandwidth(self, devices: tuple[int, ...]) -> float:
        """A group inside one node talks over NVLink; a group spanning nodes at the IB rate."""
        nodes = {d // self.devices_per_node for d in devices}
        return self.intra_bandwidth if len(nodes) <= 1 else self.inter_bandwidth

    def usable(self) -> float:
        return self.memory - self.reserved


# Sustained figures are ~50% of the dense fp16/bf16 peak, what large-model training reaches
# (Megatron-LM reports 44-52% on A100); links are bus bandwidths of NCCL all-reduce tests.
HARDWARE = {
    "a100-80g": Hardware("A100-80GB", flops=150e12, memory=80 * GIB, hbm=1.6e12,
                         intra_bandwidth=200e9, inter_bandwidth=25e9),
    "v100-32g": Hardware("V100-32GB", flops=60e12, memory=32 * GIB, hbm=0.8e12,
                         intra_bandwidth=120e9, inter_bandwidth=12.5e9),
    "h100-80g": Hardware("H100-80GB", flops=400e12, memory=80 * GIB, hbm=2.8e12,
                         intra_bandwidth=370e9, inter_bandwidth=50e9),
}


def hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise TesselError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}") from None


# ---- communication -----------------------------------------------------------------------------
def allreduce_seconds(nbytes: float, devices: tuple[int, ...], hw: Hardware) -> float:
    """Ring all-reduce: each device sends and receives 2 (t-1)/t * bytes in 2 (t-1) steps."""
    t = len(devices)
    if t <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (t - 1) / t * nbytes / hw.bandwidth(devices) + 2 * (t - 1) * hw.link_latency


def p2p_seconds(nbytes: float, src: tuple[int, ...], dst: tuple[int, ...], hw: Hardware) -> float:
    """One message between device sets: bytes / bandwidth of the slower link + start-up."""
    if set(src) == set(dst) or nbytes <= 0:
        return 0.0
    return nbytes / hw.bandwidth(tuple(src) + tuple(dst)) + hw.link_latency


# ---- transformer shapes and FLOPs -----------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """The dimensions one transformer layer sees for one micro-batch."""
    hidden: int
    heads: int
    seq: int
    micro_batch: int = 1
    ffn: int = 0              # 0 means 4 * hidden
    gated: bool = False       # gated-GELU MLP (T5 v1.1 / mT5): three f x h matrices, not two
    vocab: int = 0
    dtype_bytes: int = 2      # activations and messages in fp16/bf16
    flash: bool = True        # fused attention (FlashAttention): no s x s probabilities kept

    @property
    def f(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def tokens(self) -> int:
        return self.micro_batch * self.seq

    @property
    def hidden_bytes(self) -> float:
        """One b x s x h activation: what a layer passes on and what TP all-reduces."""
        return self.tokens * self.hidden * self.dtype_bytes


def attention_flops(x: Shape, kv_seq: int | None = None) -> float:
    """Self-attention, forward: QKV projections 6bsh^2, output projection 2bsh^2,
    scores Q K^T 2b s s_kv h, weighted sum of V 2b s s_kv h  ->  8bsh^2 + 4b s s_kv h."""
    b, s, h = x.micro_batch, x.seq, x.hidden
    skv = s if kv_seq is None else kv_seq
    return 8 * b * s * h * h + 4 * b * s * skv * h


def cross_attention_flops(x: Shape, kv_seq: int) -> float:
    """Encoder-decoder attention, forward: Q 2bsh^2 and output 2bsh^2 on the decoder's s tokens,
    K and V 4b s_kv h^2 on the encoder's s_kv tokens, scores and sum 4b s s_kv h."""
    b, s, h = x.micro_batch, x.seq, x.hidden
    return 4 * b * s * h * h + 4 * b * kv_seq * h * h + 4 * b * s * kv_seq * h


def mlp_flops(x: Shape) -> float:
    """MLP, forward: two GEMMs h->f->h, 4bshf (= 16bsh^2 at f = 4h); gated adds a third, 6bshf."""
    return (6 if x.gated else 4) * x.tokens * x.hidden * x.f


def layer_flops(x: Shape, cross_seq: int | None = None) -> float:
    """One layer, forward. At f = 4h and no cross-attention: 24bsh^2 + 4bs^2h (Narayanan et al.)."""
    total = attention_flops(x) + mlp_flops(x)
    if cross_seq is not None:
        total += cross_attention_flops(x, cross_seq)
    return total


def lm_head_flops(x: Shape) -> float:
    """Logits of every token over the vocabulary, forward: one GEMM, 2bshV."""
    return 2 * x.tokens * x.hidden * x.vocab


# ---- parameters and activation memory -------------------------------------------------------------
def layer_params(x: Shape, cross: bool = False) -> float:
    """Attention 4h^2 + 4h (QKV and output with biases), MLP 2hf + f + h (gated 3hf), two
    layer norms 4h: 12h^2 + 13h at f = 4h. Cross-attention adds 4h^2 + 4h and a norm 2h."""
    h, f = x.hidden, x.f
    mlp = (3 if x.gated else 2) * h * f + f + h
    total = 4 * h * h + 4 * h + mlp + 4 * h
    if cross:
        total += 4 * h * h + 6 * h
    return total


def layer_activation_bytes(x: Shape, t: int = 1, cross_seq: int | None = None,
                           attn_span: int | None = None) -> float:
    """Bytes one layer keeps for its backward, per device, fp16 (Korthikanti et al. eq. 2):

        s b h (10 + 24/t) + 5 a s^2 b / t

    10sbh outside the tensor-parallel region (two layer-norm inputs 4, QKV input 2, MLP input 2,
    two dropout masks 2); inside it, divided over t: Q, K, V and the projection input 8sbh, the
    MLP's GELU input and second-GEMM input 4sbf (16sbh at f = 4h; gated: two GEMM outputs and
    their product, 6sbf), and per head the softmax output 2s^2b, its dropout mask s^2b and the
    dropped-out probabilities 2s^2b (5as^2b). Cross-attention adds a norm input, Q input and
    mask 5sbh outside, and Q, projection input 4sbh, K and V 4 s_kv b h, 5 a s s_kv b inside.
    A query that sees only `attn_span` keys (a window) keeps 5 a s span b instead of 5 a s^2 b.
    With `x.flash` (FlashAttention, Dao et al. 2022) the probabilities are recomputed in the
    backward and only the fp32 log-sum-exp of each query row is kept: 4 a s b instead of 5as^2b.
    """
    b, s, h = x.micro_batch, x.seq, x.hidden
    span = s if attn_span is None else attn_span
    inner = 8 * s * b * h + (6 if x.gated else 4) * s * b * x.f + _score_bytes(x, span)
    outer = 10 * s * b * h
    if cross_seq is not None:
        outer += 5 * s * b * h
        inner += 4 * s * b * h + 4 * cross_seq * b * h + _score_bytes(x, cross_seq)
    return outer + inner / t


def _score_bytes(x: Shape, kv_seq: int) -> float:
    """Attention probabilities kept for the backward: 5 a s s_kv b, or 4 a s b with FlashAttention."""
    a, s, b = x.heads, x.seq, x.micro_batch
    return 4 * a * s * b if x.flash else 5 * a * s * kv_seq * b


def recompute_flops(x: Shape, kv_seq: int) -> float:
    """FlashAttention's backward recomputes the scores Q K^T: 2 b s s_kv h more FLOPs (0 without)."""
    return 2 * x.micro_batch * x.seq * kv_seq * x.hidden if x.flash else 0


# ---- blocks ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockCost:
    """What one block of a placement costs on each of its devices, for one micro-batch."""
    forward: float        # seconds
    backward: float       # seconds (0 for inference-only or frozen blocks)
    activation: float     # bytes kept from the forward until the backward ends, per device
    params: float         # parameters held per device
    output: float         # bytes of the tensor it passes on (the gradient back is as large)
    weights: str | None = None   # blocks sharing a key on one device share their weights (tied)


def transformer_block(x: Shape, layers: int, devices: tuple[int, ...], hw: Hardware,
                      cross_seq: int | None = None, attn_span: int | None = None) -> BlockCost:
    """`layers` consecutive transformer layers split tensor-parallel over `devices` (Megatron).

    Time = layers * FLOPs / (t F) + the TP all-reduces of b s h: one after attention, one after
    the MLP (and one after cross-attention), in the forward; as many in the backward, on the
    input gradients. The backward adds FlashAttention's recomputation of the scores.
    `attn_span`: keys each query attends to (window M^2 for Swin), default s.
    """
    t = len(devices)
    span = x.seq if attn_span is None else attn_span
    cross = cross_seq is not None
    flops = layers * (attention_flops(x, span) + mlp_flops(x) + (cross_attention_flops(x, cross_seq) if cross else 0))
    again = layers * (recompute_flops(x, span) + (recompute_flops(x, cross_seq) if cross else 0))
    collectives = layers * (2 + cross) * allreduce_seconds(x.hidden_bytes, devices, hw)
    compute = flops / (t * hw.flops)
    backward = (BACKWARD_FACTOR * flops + again) / (t * hw.flops) + collectives
    act = layer_activation_bytes(x, t, cross_seq, attn_span)
    return BlockCost(compute + collectives, backward, layers * act,
                     layers * layer_params(x, cross) / t, x.hidden_bytes)


def embedding_block(x: Shape, devices: tuple[int, ...], hw: Hardware, weights: str = "embedding") -> BlockCost:
    """Token (+ position) embedding, vocabulary-parallel over `devices`.

    Forward: a gather of b s rows of h (memory-bound: read and write 2 b s h bytes) where each
    device fills the rows of its V/t vocabulary slice, then an all-reduce of b s h assembles them.
    Backward: a scatter-add of the b s h output gradient into the weight gradient, no collective
    (token ids have no gradient). Keeps the dropout mask of its output, b s h bytes.
    Parameters V h / t, plus s h positions, replicated.
    """
    t = len(devices)
    gather = 2 * x.hidden_bytes / hw.hbm
    forward = gather + allreduce_seconds(x.hidden_bytes, devices, hw)
    return BlockCost(forward, gather, x.tokens * x.hidden, x.vocab * x.hidden / t + x.seq * x.hidden,
                     x.hidden_bytes, weights)


def lm_head_block(x: Shape, devices: tuple[int, ...], hw: Hardware, weights: str = "embedding") -> BlockCost:
    """Logits and cross-entropy, vocabulary-parallel over `devices` (Megatron's parallel CE).

    Forward: the logits GEMM 2bshV/t; softmax cross-entropy over the local logits in fp32,
    memory-bound, about four passes over 4 b s V/t bytes (write, max, exp-sum, normalise); three
    all-reduces of b s fp32 values (max, sum, target logit).
    Backward: 4bshV/t for input and weight gradients, one pass of 2 x 4 b s V/t for the softmax
    gradient, and an all-reduce of the b s h input gradient (each device holds a partial sum).
    Keeps the fp32 probabilities 4 b s V/t and its input 2 b s h. With `weights` equal to the
    embedding's key, the weights are the embedding's (tied) and are not counted twice.
    """
    t = len(devices)
    logits = x.tokens * x.vocab / t * 4
    gemm = lm_head_flops(x) / (t * hw.flops)
    scalars = 3 * allreduce_seconds(x.tokens * 4, devices, hw)
    forward = gemm + 4 * logits / hw.hbm + scalars
    backward = BACKWARD_FACTOR * gemm + 2 * logits / hw.hbm + allreduce_seconds(x.hidden_bytes, devices, hw)
    return BlockCost(forward, backward, logits + x.hidden_bytes, x.vocab * x.hidden / t,
                     x.tokens * 4, weights)


def combine(*costs: BlockCost, weights: str | None = None) -> BlockCost:
    """Several blocks run back to back as one (e.g. the embedding folded into the first stage)."""
    return BlockCost(sum(c.forward for c in costs), sum(c.backward for c in costs),
                     sum(c.activation for c in costs), sum(c.params for c in costs), costs[-1].output,
                     weights)


# ---- models: parts on device sets -> placements ------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One block of a model on its device set, with its cost."""
    name: str
    devices: tuple[int, ...]
    cost: BlockCost


@dataclass(frozen=True)
class Model:
    """A model cut into parts placed on devices; becomes a placement in ms and MiB.

    `replicas` counts model copies per micro-batch unit (Chimera's two pipelines carry two
    micro-batches per unit of its placement), so iteration times compare per real micro-batch.
    """
    name: str
    devices: int
    parts: tuple[Part, ...]
    edges: tuple[tuple[str, str], ...]
    hardware: Hardware
    training: bool = True
    replicas: int = 1

    def placement(self) -> Placement:
        """Durations in milliseconds (to the microsecond), activation memory in MiB (rounded up),
        latency: the slowest message an edge between different device sets carries."""
        from .builder import Stage, build_stages
        stages = [Stage(p.name, p.devices, _ms(p.cost.forward), _ms(p.cost.backward) if self.training else 0,
                        memory=math.ceil(p.cost.activation / MIB) if self.training else 0)
                  for p in self.parts]
        return build_stages(self.name, self.devices, stages, self.edges, latency=self.latency_ms())

    def latency_ms(self) -> float:
        by = {p.name: p for p in self.parts}
        worst = max((p2p_seconds(by[a].cost.output, by[a].devices, by[b].devices, self.hardware)
                     for a, b in self.edges), default=0.0)
        return _ms(worst)

    def static_bytes(self) -> tuple[float, ...]:
        """Per device: parameters (with gradients and optimizer states when training) of every part
        on it; parts sharing a weights key on a device hold that tensor once."""
        per_param = TRAIN_BYTES_PER_PARAM if self.training else INFER_BYTES_PER_PARAM
        out = []
        for d in range(self.devices):
            seen: set[str] = set()
            total = 0.0
            for p in self.parts:
                if d not in p.devices or (p.cost.weights is not None and p.cost.weights in seen):
                    continue
                if p.cost.weights is not None:
                    seen.add(p.cost.weights)
                total += p.cost.params * per_param
            out.append(total)
        return tuple(out)

    def memory_budget(self) -> tuple[int, ...]:
        """MiB per device left for activations: device memory - reserved - static. Negative: the
        weights alone do not fit (out of memory whatever the schedule)."""
        return tuple(math.floor((self.hardware.usable() - s) / MIB) for s in self.static_bytes())


def _ms(seconds: float) -> float:
    """Milliseconds to the microsecond; a positive time never rounds to 0."""
    return max(round(seconds * 1e3, 3), 0.001) if seconds > 0 else 0.0


# ---- layouts: how a chain of units becomes parts on devices ------------------------------------------
Cost = Callable[[tuple[int, ...]], BlockCost]


@dataclass(frozen=True)
class Unit:
    """One piece of a model's forward chain and its cost on any device set. Layers are what a
    pipeline splits evenly over stages; other units (embedding, head) ride with the next layer."""
    name: str
    cost: Cost
    layer: bool = True


def stage_ranges(chain: Sequence[Unit], stages: int, balance: str = "even") -> list[range]:
    """Contiguous groups of the chain, one per stage.

    `even`: Megatron's rule -- the same number of layers per stage (the first stages take the
    remainder); embeddings and heads go with the layer after them (the last stage when none).
    `cost`: the contiguous split minimising the slowest stage's forward + backward time.
    """
    if balance == "cost":
        return _cost_ranges(chain, stages)
    if balance != "even":
        raise TesselError(f"balance must be 'even' or 'cost', got {balance!r}")
    layers = [i for i, u in enumerate(chain) if u.layer]
    if len(layers) < stages:
        raise TesselError(f"{len(layers)} layers cannot fill {stages} pipeline stages")
    cuts = [layers[sum(split_even(len(layers), stages)[:k])] for k in range(1, stages)]
    bounds_ = [0, *cuts, len(chain)]
    return [range(bounds_[k], bounds_[k + 1]) for k in range(stages)]


def split_even(n: int, k: int) -> list[int]:
    """n items in k groups whose sizes differ by at most one, larger groups first."""
    return [n // k + (i < n % k) for i in range(k)]


def _cost_ranges(chain: Sequence[Unit], stages: int) -> list[range]:
    w = [u.cost((0,)).forward + u.cost((0,)).backward for u in chain]
    if len(w) < stages:
        raise TesselError(f"{len(w)} units cannot fill {stages} pipeline stages")

    def cuts_for(cap: float) -> list[int] | None:
        cuts, acc = [0], 0.0
        for i, x in enumerate(w):
            if acc + x > cap and acc > 0:
                cuts.append(i)
                acc = 0.0
            acc += x
        return cuts if len(cuts) <= stages and acc <= cap else None

    lo, hi = max(w), sum(w)
    for _ in range(60):  # bisection on the slowest stage's time
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if cuts_for(mid) else (mid, hi)
    cuts = cuts_for(hi) or [0]
    while len(cuts) < stages:  # fewer groups than stages: split the largest group
        sizes = [(b - a, k) for k, (a, b) in enumerate(zip(cuts, cuts[1:] + [len(w)]))]
        size, k = max(sizes)
        if size < 2:
            raise TesselError(f"{len(w)} units cannot fill {stages} pipeline stages")
        cuts.insert(k + 1, cuts[k] + size // 2)
    ends = cuts[1:] + [len(w)]
    return [range(a, b) for a, b in zip(cuts, ends)]


def pipeline_parts(chain: Sequence[Unit], devices: Sequence[int], prefix: str = "s",
                   balance: str = "even", weights: str | None = None) -> list[Part]:
    """One stage per device in `devices` order, each the sum of its group of units.
    `weights`: a key prefix when stages of several passes share their weights (recycling)."""
    parts = []
    for k, (d, r) in enumerate(zip(devices, stage_ranges(chain, len(devices), balance))):
        cost = combine(*(chain[i].cost((d,)) for i in r), weights=None if weights is None else f"{weights}{k}")
        parts.append(Part(f"{prefix}{k}", (d,), cost))
    return parts


def tp_parts(chain: Sequence[Unit], devices: tuple[int, ...], prefix: str = "") -> list[Part]:
    """Every unit on all `devices`, tensor-parallel; consecutive units of one name become one part."""
    parts: list[Part] = []
    runs: list[list[Unit]] = []
    for u in chain:
        if runs and runs[-1][0].name == u.name:
            runs[-1].append(u)
        else:
            runs.append([u])
    for k, run in enumerate(runs):
        costs = [u.cost(devices) for u in run]
        parts.append(Part(f"{prefix}{run[0].name}{k}", devices, combine(*costs, weights=costs[0].weights)))
    return parts


def share_devices(devices: int, first: BlockCost, second: BlockCost) -> int:
    """Devices for the first of two equally deep segments, in proportion to their layer costs
    (forward + backward), at least one each: the model-aware split a K or NN shape makes."""
    a, b = first.forward + first.backward, second.forward + second.backward
    return min(devices - 1, max(1, round(devices * a / (a + b))))


def chain_edges(parts: Sequence[Part]) -> list[tuple[str, str]]:
    return [(a.name, b.name) for a, b in zip(parts, parts[1:])]


def no_grad(cost: BlockCost) -> BlockCost:
    """A forward without autograd (a recycling pass): nothing kept, no backward."""
    return BlockCost(cost.forward, 0.0, 0.0, cost.params, cost.output, cost.weights)


LAYOUTS = ("tessel", "pipeline", "balanced", "chimera", "tp")


def chain_model(name: str, chain: Sequence[Unit], devices: int, layout: str, hw: Hardware,
                training: bool = True) -> Model:
    """The layouts every model shares: `pipeline` (1F1B's: one stage per device, even layers),
    `balanced` (the same with a cost-balanced split), `chimera` (two pipelines in opposite
    directions, a model replica each; one placement unit carries two micro-batches) and `tp`
    (every unit tensor-parallel over all devices)."""
    all_devices = tuple(range(devices))
    if layout in ("pipeline", "balanced"):
        parts = pipeline_parts(chain, all_devices, balance="cost" if layout == "balanced" else "even")
        return Model(f"{name}-{layout}", devices, tuple(parts), tuple(chain_edges(parts)), hw, training)
    if layout == "chimera":
        up = pipeline_parts(chain, all_devices, prefix="u")
        down = pipeline_parts(chain, all_devices[::-1], prefix="d")
        return Model(f"{name}-chimera", devices, tuple(up + down),
                     tuple(chain_edges(up) + chain_edges(down)), hw, training, replicas=2)
    if layout == "tp":
        parts = tp_parts(chain, all_devices)
        return Model(f"{name}-tp", devices, tuple(parts), tuple(chain_edges(parts)), hw, training)
    raise TesselError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")


# ---- paper-scale models ---------------------------------------------------------------------------
A100 = HARDWARE["a100-80g"]


def _layers(x: Shape, n: int, hw: Hardware, cross_seq: int | None = None, name: str = "layer",
            attn_span: int | None = None) -> list[Unit]:
    return [Unit(name, lambda d: transformer_block(x, 1, d, hw, cross_seq, attn_span)) for _ in range(n)]


def gpt(devices: int, layout: str = "tessel", hw: Hardware = A100, hidden: int = 8192, heads: int = 64,
        seq: int = 2048, vocab: int = 256_000, layers: int | None = None, micro_batch: int = 1) -> Model:
    """GPT decoder with a large vocabulary; `layers` defaults to 2 per device.

    `tessel` is the M shape: the embedding and the tied LM head vocabulary-parallel over all
    devices (one copy of V h in total), the layers pipelined one stage per device. The plain
    pipeline puts the embedding on the first stage and an untied copy of it as the head on the
    last (Megatron ties them by an all-reduce of their gradients, so both hold V h).
    """
    x = Shape(hidden, heads, seq, micro_batch, vocab=vocab)
    n = layers or 2 * devices
    emb = Unit("emb", lambda d: embedding_block(x, d, hw), layer=False)
    head = Unit("head", lambda d: lm_head_block(x, d, hw), layer=False)
    chain = [emb, *_layers(x, n, hw), head]
    if layout != "tessel":
        return chain_model("gpt", chain, devices, layout, hw)
    every = tuple(range(devices))
    parts = [Part("emb", every, emb.cost(every)), *pipeline_parts(chain[1:-1], every),
             Part("head", every, head.cost(every))]
    return Model("gpt-mshape", devices, tuple(parts), tuple(chain_edges(parts)), hw)


def mt5(devices: int, layout: str = "tessel", hw: Hardware = A100, hidden: int = 4096, heads: int = 64,
        ffn: int = 10240, vocab: int = 250_112, enc_seq: int = 1024, dec_seq: int = 1024,
        layers: int | None = None, micro_batch: int = 2) -> Model:
    """mT5-style encoder-decoder (gated-GELU MLP, untied LM head); `layers` encoder and as many
    decoder layers, default one of each per device.

    `tessel` is the NN shape: the shared token embedding vocabulary-parallel on all devices
    before the encoder and again before the decoder, the encoder pipelined over the first
    devices and the decoder over the others (split by their costs), the LM head on all devices. Decoder
    messages carry the encoder's output along for cross-attention.
    """
    if devices < 2:
        raise TesselError("the NN shape needs at least 2 devices")
    enc = Shape(hidden, heads, enc_seq, micro_batch, ffn, gated=True, vocab=vocab)
    dec = Shape(hidden, heads, dec_seq, micro_batch, ffn, gated=True, vocab=vocab)
    n = layers or devices
    carry = enc.hidden_bytes + dec.hidden_bytes

    def dec_layer(d: tuple[int, ...]) -> BlockCost:
        c = transformer_block(dec, 1, d, hw, cross_seq=enc_seq)
        return BlockCost(c.forward, c.backward, c.activation, c.params, carry, c.weights)

    emb = Unit("emb", lambda d: embedding_block(enc, d, hw, weights="shared"), layer=False)
    demb = Unit("demb", lambda d: embedding_block(dec, d, hw, weights="shared"), layer=False)
    head = Unit("head", lambda d: lm_head_block(dec, d, hw, weights="lm_head"), layer=False)
    encoder = _layers(enc, n, hw, name="enc")
    decoder = [Unit("dec", dec_layer) for _ in range(n)]
    if layout != "tessel":
        return chain_model("mt5", [emb, *encoder, demb, *decoder, head], devices, layout, hw)
    every = tuple(range(devices))
    half = share_devices(devices, encoder[0].cost((0,)), decoder[0].cost((0,)))
    enc_parts = pipeline_parts(encoder, every[:half], prefix="e")
    dec_parts = pipeline_parts(decoder, every[half:], prefix="d")
    parts = [Part("emb", every, emb.cost(every)), *enc_parts, Part("demb", every, demb.cost(every)),
             *dec_parts, Part("head", every, head.cost(every))]
    return Model("mt5-nnshape", devices, tuple(parts), tuple(chain_edges(parts)), hw)


def flava(devices: int, layout: str = "tessel", hw: Hardware = A100, hidden: int = 4096, heads: int = 32,
          image_seq: int = 576, text_seq: int = 512, layers: int | None = None,
          fusion_layers: int | None = None, micro_batch: int = 8) -> Model:
    """FLAVA-like multimodal model for inference: an image encoder and a text encoder (`layers`
    each, default one per device) joined by a multimodal fusion encoder (`fusion_layers`,
    default half as many) over the concatenated sequence.

    `tessel` is the K shape: the two encoders pipelined side by side on disjoint device groups
    (sized by their cost), the fusion encoder tensor-parallel on all devices.
    """
    if devices < 2:
        raise TesselError("the K shape needs at least 2 devices")
    img = Shape(hidden, heads, image_seq, micro_batch)
    txt = Shape(hidden, heads, text_seq, micro_batch)
    fus = Shape(hidden, heads, image_seq + text_seq, micro_batch)
    n = layers or devices
    nf = fusion_layers or max(1, n // 2)
    image, text = _layers(img, n, hw, name="img"), _layers(txt, n, hw, name="txt")
    fusion = _layers(fus, nf, hw, name="fusion")
    if layout != "tessel":
        return chain_model("flava", [*image, *text, *fusion], devices, layout, hw, training=False)
    n_img = share_devices(devices, image[0].cost((0,)), text[0].cost((0,)))
    every = tuple(range(devices))
    img_parts = pipeline_parts(image, every[:n_img], prefix="i")
    txt_parts = pipeline_parts(text, every[n_img:], prefix="t")
    fusion_part = Part("fusion", every, combine(*(u.cost(every) for u in fusion)))
    edges = chain_edges(img_parts) + chain_edges(txt_parts) + [
        (img_parts[-1].name, "fusion"), (txt_parts[-1].name, "fusion")]
    return Model("flava-kshape", devices, (*img_parts, *txt_parts, fusion_part), tuple(edges), hw,
                 training=False)


# ---- AlphaFold-like Evoformer -------------------------------------------------------------------
@dataclass(frozen=True)
class Evoformer:
    """Dimensions of an Evoformer block (Jumper et al. 2021, suppl. 1.6): MSA of `msa` rows by
    `residues` columns with `c_m` channels; pair representation residues^2 x `c_z`."""
    msa: int = 512
    residues: int = 384
    c_m: int = 256
    c_z: int = 128
    head_dim: int = 32
    msa_heads: int = 8
    pair_heads: int = 4
    opm: int = 32          # outer-product-mean channels
    tri: int = 128         # triangle-multiplication channels
    dtype_bytes: int = 2

    @property
    def msa_bytes(self) -> float:
        return self.msa * self.residues * self.c_m * self.dtype_bytes

    @property
    def pair_bytes(self) -> float:
        return self.residues ** 2 * self.c_z * self.dtype_bytes


def evoformer_flops(e: Evoformer) -> float:
    """Forward FLOPs of one block, summed over its modules (s = msa, r = residues, H c = heads x
    head_dim; a linear of n rows from p to q channels is 2npq):

    MSA row attention with pair bias: q, k, v, gate and output projections 10 s r c_m Hc, bias
      2 r^2 c_z H, scores and weighted sum 4 s r^2 Hc;
    MSA column attention: 10 s r c_m Hc + 4 r s^2 Hc;
    MSA transition (4x): 16 s r c_m^2;
    outer product mean: projections 4 s r c_m c_o, outer products 2 s r^2 c_o^2, output 2 r^2 c_o^2 c_z;
    triangle multiplication, outgoing and incoming: each 6 r^2-row linears c_z -> c_t (2 r^2 c_z c_t
      each: a, b and their gates, output gate and output) and the product 2 r^3 c_t;
    triangle attention, starting and ending node: each 10 r^2 c_z Hc' + bias 2 r^2 c_z H' + 4 r^3 Hc';
    pair transition (4x): 16 r^2 c_z^2.
    """
    s, r, cm, cz = e.msa, e.residues, e.c_m, e.c_z
    hc_m, hc_z = e.msa_heads * e.head_dim, e.pair_heads * e.head_dim
    row = 10 * s * r * cm * hc_m + 2 * r * r * cz * e.msa_heads + 4 * s * r * r * hc_m
    col = 10 * s * r * cm * hc_m + 4 * r * s * s * hc_m
    msa_transition = 16 * s * r * cm * cm
    opm = 4 * s * r * cm * e.opm + 2 * s * r * r * e.opm ** 2 + 2 * r * r * e.opm ** 2 * cz
    tri_mul = 2 * (6 * 2 * r * r * cz * e.tri + 2 * r ** 3 * e.tri)
    tri_att = 2 * (10 * r * r * cz * hc_z + 2 * r * r * cz * e.pair_heads + 4 * r ** 3 * hc_z)
    pair_transition = 16 * r * r * cz * cz
    return row + col + msa_transition + opm + tri_mul + tri_att + pair_transition


def evoformer_params(e: Evoformer) -> float:
    """Weights of one block: the matrices of the modules above (biases and norms neglected)."""
    cm, cz = e.c_m, e.c_z
    hc_m, hc_z = e.msa_heads * e.head_dim, e.pair_heads * e.head_dim
    msa = 2 * 5 * cm * hc_m + cz * e.msa_heads + 8 * cm * cm
    opm = 2 * cm * e.opm + e.opm ** 2 * cz
    pair = 2 * 6 * cz * e.tri + 2 * (5 * cz * hc_z + cz * e.pair_heads) + 8 * cz * cz
    return msa + opm + pair


def evoformer_block(e: Evoformer, blocks: int, devices: tuple[int, ...], hw: Hardware) -> BlockCost:
    """`blocks` Evoformer blocks, trained with per-block activation checkpointing (as AlphaFold
    is): each keeps only its inputs (MSA and pair, s r c_m + r^2 c_z values) and its backward
    recomputes the forward, so backward = (1 + BACKWARD_FACTOR) x forward FLOPs.

    On several devices, dynamic axial parallelism (FastFold's DAP) splits the MSA rows or the
    residues: FLOPs / t, and per block two all-to-alls of the MSA and four of the pair
    representation (transposing the split axis), each moving (t-1)/t of the tensor per device;
    the backward repeats them.
    """
    t = len(devices)
    compute = blocks * evoformer_flops(e) / (t * hw.flops)
    comm = 0.0
    if t > 1:
        moved = (t - 1) / t * (2 * e.msa_bytes + 4 * e.pair_bytes) / t
        comm = blocks * (moved / hw.bandwidth(devices) + 6 * hw.link_latency)
    return BlockCost(compute + comm, (1 + BACKWARD_FACTOR) * compute + comm,
                     blocks * (e.msa_bytes + e.pair_bytes) / t, blocks * evoformer_params(e) / t,
                     e.msa_bytes + e.pair_bytes)


def alphafold(devices: int, layout: str = "tessel", hw: Hardware = A100, evo: Evoformer = Evoformer(),
              blocks: int | None = None, recycles: int = 3) -> Model:
    """AlphaFold-like training step: `recycles` forward passes without gradients through the
    Evoformer stack, each feeding the next, then one pass with gradients and its backward.
    `blocks` defaults to AlphaFold's 48, rounded up to a multiple of the device count.

    `tessel` (and `pipeline`) pipelines the stack one stage per device; every pass runs on the
    same stages (shared weights). `chimera` runs two such pipelines in opposite directions and
    `tp` runs every block on all devices with DAP.
    """
    n = blocks or math.ceil(48 / devices) * devices
    chain = [Unit("evo", lambda d: evoformer_block(evo, 1, d, hw)) for _ in range(n)]
    every = tuple(range(devices))
    if layout in ("tessel", "pipeline", "balanced"):
        parts = _recycle(chain, every, recycles, "")
        return Model("alphafold-recycle", devices, tuple(parts), tuple(chain_edges(parts)), hw)
    if layout == "chimera":
        up, down = _recycle(chain, every, recycles, "u"), _recycle(chain, every[::-1], recycles, "d")
        return Model("alphafold-chimera", devices, tuple(up + down),
                     tuple(chain_edges(up) + chain_edges(down)), hw, replicas=2)
    if layout == "tp":
        one = evoformer_block(evo, n, every, hw)
        parts = [Part(f"p{r}", every, no_grad(replace_weights(one, "evo"))) for r in range(recycles)]
        parts.append(Part("grad", every, replace_weights(one, "evo")))
        return Model("alphafold-tp", devices, tuple(parts), tuple(chain_edges(parts)), hw)
    raise TesselError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")


def replace_weights(cost: BlockCost, key: str) -> BlockCost:
    return BlockCost(cost.forward, cost.backward, cost.activation, cost.params, cost.output, key)


def _recycle(chain: Sequence[Unit], devices: Sequence[int], recycles: int, prefix: str) -> list[Part]:
    """The passes of one pipeline: stage k of every pass on devices[k], sharing its weights."""
    parts: list[Part] = []
    for r in range(recycles + 1):
        stages = pipeline_parts(chain, devices, prefix=f"{prefix}p{r}s", weights=f"{prefix}stage")
        parts += [Part(p.name, p.devices, no_grad(p.cost)) if r < recycles else p for p in stages]
    return parts


# ---- Swin -----------------------------------------------------------------------------------------
def swin(devices: int, layout: str = "pipeline", hw: Hardware = A100, embed: int = 512,
         depths: Sequence[int] = (2, 2, 42, 4), heads: Sequence[int] = (16, 32, 64, 128),
         image: int = 640, patch: int = 4, window: int = 20, micro_batch: int = 4) -> Model:
    """Swin-style hierarchical vision transformer (SwinV2-G-like widths and depths by default).

    Stage k works on (image / patch / 2^k)^2 tokens of width embed 2^k with attention inside
    windows of window^2 tokens: a layer costs 8 b T C^2 + 4 b T window^2 C for attention and
    16 b T C^2 for its MLP (Liu et al. 2021, eq. 2, in FLOPs). Patch merging between stages
    (4 b T C^2, under 1% of a stage) is neglected. `tessel` is the plain pipeline with a
    cost-balanced split (the stages differ 4x in width), as no sharded block helps here.
    """
    chain: list[Unit] = []
    for k, (depth, h) in enumerate(zip(depths, heads)):
        side = image // patch // 2 ** k
        x = Shape(embed * 2 ** k, h, side * side, micro_batch)
        chain += _layers(x, depth, hw, name=f"stage{k}", attn_span=window * window)
    return chain_model("swin", chain, devices, "balanced" if layout == "tessel" else layout, hw)
