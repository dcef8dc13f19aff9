"""Formulas: what a transformer-style or Evoformer block costs on a device set (time, memory).

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

from dataclasses import dataclass, replace

from .hardware import Hardware, allreduce_seconds

BACKWARD_FACTOR = 2.0        # backward FLOPs / forward FLOPs
TRAIN_BYTES_PER_PARAM = 16   # 2 weight + 2 grad + 4 master + 4 + 4 Adam moments
FP16_ADAM_BYTES_PER_PARAM = 8   # model.half() with torch Adam: weight, grad, two moments, 2 each
INFER_BYTES_PER_PARAM = 2
EMBEDDING_GRAD_BYTES = 12    # bytes moved per element of an embedding's dense weight gradient
EVOFORMER_PASSES = 10        # elementwise passes (norm, gate, dropout, residual) over a module's tensor
SCORE_PASSES = 5             # passes over attention logits: write, bias/mask, softmax read+write, read


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
    dropout: bool = True      # dropout after attention and MLP (and on the probabilities): 1-byte masks

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
    """Bytes one layer keeps for its backward, per device (Korthikanti et al. eq. 2, at fp16):

        s b h (10 + 24/t) + 5 a s^2 b / t

    Counted in tensors of d = `x.dtype_bytes` bytes an element (2 in the paper) and 1-byte dropout
    masks. Outside the tensor-parallel region 4sbh elements (two layer-norm inputs, the QKV input,
    the MLP input) and two masks of sbh; inside it, divided over t: Q, K, V and the projection
    input 4sbh elements, the MLP's GELU input and second-GEMM input 2sbf (gated: the GELU input,
    its output, the linear branch and their product, 4sbf), and per head the softmax output and
    the dropped-out probabilities 2 a s^2 b elements and their mask a s^2 b (without dropout the
    softmax output alone, a s^2 b elements). Cross-attention adds a
    norm input, a Q input and a mask outside (2sbh elements + sbh), and Q, projection input 2sbh,
    K and V 2 s_kv b h, 2 a s s_kv b elements and a mask inside. A query that sees only
    `attn_span` keys (a window) keeps a s span b instead of a s^2 b. With `x.flash` (FlashAttention,
    Dao et al. 2022) the probabilities are recomputed in the backward and only the fp32
    log-sum-exp of each query row is kept: 4 a s b bytes. Without `x.dropout` no masks are kept.
    A torch layer measured as autograd saves it (tensor parallel over 1, 2 and 4 devices, bf16
    and fp32, with and without dropout) keeps these bytes within 10% (tests/test_costmodel.py).
    """
    b, s, h, d = x.micro_batch, x.seq, x.hidden, x.dtype_bytes
    mask = 1 if x.dropout else 0
    span = s if attn_span is None else attn_span
    inner = (4 * s * b * h + (4 if x.gated else 2) * s * b * x.f) * d + _score_bytes(x, span)
    outer = 4 * s * b * h * d + 2 * mask * s * b * h
    if cross_seq is not None:
        outer += 2 * s * b * h * d + mask * s * b * h
        inner += (2 * s * b * h + 2 * cross_seq * b * h) * d + _score_bytes(x, cross_seq)
    return outer + inner / t


def _score_bytes(x: Shape, kv_seq: int) -> float:
    """Attention probabilities kept for the backward: the softmax output, and with dropout its mask
    (a s s_kv b bytes) and the dropped-out copy, each a s s_kv b elements; with FlashAttention the
    fp32 log-sum-exp, 4 a s b."""
    a, s, b = x.heads, x.seq, x.micro_batch
    if x.flash:
        return 4 * a * s * b
    return ((2 * x.dtype_bytes + 1) if x.dropout else x.dtype_bytes) * a * s * kv_seq * b


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
    checkpoint: float = 0.0      # bytes kept under full recomputation: every layer's input


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
    flops = layers * (attention_flops(x, span) + mlp_flops(x))
    again = layers * recompute_flops(x, span)
    if cross_seq is not None:
        flops += layers * cross_attention_flops(x, cross_seq)
        again += layers * recompute_flops(x, cross_seq)
    collectives = layers * (2 + cross) * allreduce_seconds(x.hidden_bytes, devices, hw)
    compute = flops / (t * hw.flops)
    backward = (BACKWARD_FACTOR * flops + again) / (t * hw.flops) + collectives
    act = layer_activation_bytes(x, t, cross_seq, attn_span)
    return BlockCost(compute + collectives, backward, layers * act,
                     layers * layer_params(x, cross) / t, x.hidden_bytes, checkpoint=layers * x.hidden_bytes)


def embedding_block(x: Shape, devices: tuple[int, ...], hw: Hardware, weights: str = "embedding") -> BlockCost:
    """Token (+ position) embedding, vocabulary-parallel over `devices`.

    Forward: a gather of b s rows of h (memory-bound: read and write 2 b s h bytes) where each
    device fills the rows of its V/t vocabulary slice, then an all-reduce of b s h assembles them.
    Backward: a scatter-add of the b s h output gradient into the weight gradient, no collective
    (token ids have no gradient), and the weight-gradient pass: the dense V/t x h gradient is
    written (2 bytes an element) and accumulated into the fp32 main gradient (read 2, read and
    write 4 + 4): EMBEDDING_GRAD_BYTES per element of the slice. Keeps the dropout mask of its
    output, b s h bytes. Parameters V h / t, plus s h positions, replicated.
    """
    t = len(devices)
    gather = 2 * x.hidden_bytes / hw.hbm
    forward = gather + allreduce_seconds(x.hidden_bytes, devices, hw)
    weight_grad = EMBEDDING_GRAD_BYTES * x.vocab * x.hidden / t / hw.hbm
    return BlockCost(forward, gather + weight_grad, x.tokens * x.hidden,
                     x.vocab * x.hidden / t + x.seq * x.hidden, x.hidden_bytes, weights)


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
                     weights, sum(c.checkpoint for c in costs))



def no_grad(cost: BlockCost) -> BlockCost:
    """A forward without autograd (a recycling pass): nothing kept, no backward."""
    return BlockCost(cost.forward, 0.0, 0.0, cost.params, cost.output, cost.weights)



def recomputed(cost: BlockCost) -> BlockCost:
    """Full activation recomputation (Megatron's `full` checkpointing) of a layer or a stack of
    layers: the forward keeps only each layer's input (`checkpoint`), and the backward runs the
    forward again first: backward + forward. A cost that keeps no more than that is unchanged."""
    if cost.backward == 0 or cost.activation <= cost.checkpoint or cost.checkpoint <= 0:
        return cost
    return BlockCost(cost.forward, cost.backward + cost.forward, cost.checkpoint,
                     cost.params, cost.output, cost.weights, cost.checkpoint)


def replace_weights(cost: BlockCost, key: str) -> BlockCost:
    return replace(cost, weights=key)



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


def evoformer_memory_bytes(e: Evoformer) -> float:
    """Bytes the memory-bound kernels of one block move, forward (most of an Evoformer's time:
    its GEMMs are thin, c = 32 per head, and its tensors large):

    attention logits, SCORE_PASSES over each (2 bytes): MSA row H s r^2, MSA column H r s^2,
      triangle attention starting and ending node 2 H' r^3;
    elementwise work (layer norm, gates, dropout, residual), EVOFORMER_PASSES over the tensor each
      module reads: three MSA modules (row, column, transition) and six pair modules (outer
      product mean, two triangle multiplications, two triangle attentions, transition).
    """
    s, r = e.msa, e.residues
    logits = e.msa_heads * s * r * r + e.msa_heads * r * s * s + 2 * e.pair_heads * r ** 3
    return SCORE_PASSES * logits * e.dtype_bytes + EVOFORMER_PASSES * (3 * e.msa_bytes + 6 * e.pair_bytes)


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

    Time = GEMM FLOPs / F + memory-bound bytes / HBM bandwidth (evoformer_memory_bytes).
    On several devices, dynamic axial parallelism (FastFold's DAP) splits the MSA rows or the
    residues: both / t, and per block two all-to-alls of the MSA and four of the pair
    representation (transposing the split axis), each moving (t-1)/t of the tensor per device;
    the backward repeats them.
    """
    t = len(devices)
    compute = blocks * (evoformer_flops(e) / hw.flops + evoformer_memory_bytes(e) / hw.hbm) / t
    comm = 0.0
    if t > 1:
        moved = (t - 1) / t * (2 * e.msa_bytes + 4 * e.pair_bytes) / t
        comm = blocks * (moved / hw.ring_bandwidth(devices) + 6 * hw.link_latency)
    return BlockCost(compute + comm, (1 + BACKWARD_FACTOR) * compute + comm,
                     blocks * (e.msa_bytes + e.pair_bytes) / t, blocks * evoformer_params(e) / t,
                     e.msa_bytes + e.pair_bytes)

