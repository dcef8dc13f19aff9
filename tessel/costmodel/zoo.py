"""Model zoo: the paper's models at paper scale, as segments of units (`*_spec`, what `tessel
plan` places) and in the layouts the study compares (`gpt`, `mt5`, `flava`, `alphafold_like`,
`swin`: `tessel` is the paper's own placement, the others are `LAYOUTS`' baselines)."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from ..errors import TesselError
from .formulas import (
    BlockCost,
    Evoformer,
    Shape,
    combine,
    embedding_block,
    evoformer_block,
    lm_head_block,
    no_grad,
    replace_weights,
    transformer_block,
)
from .hardware import HARDWARE, Hardware
from .partition import (
    LAYOUTS,
    ModelSpec,
    Part,
    PlacedModel,
    Segment,
    Unit,
    chain_edges,
    chain_model,
    pipeline_parts,
    share_devices,
    stage_parts,
    with_recomputation,
)

A100 = HARDWARE["a100-80g"]
EVOFORMER = Evoformer()


def _layers(x: Shape, n: int, hw: Hardware, cross_seq: int | None = None, name: str = "layer",
            attn_span: int | None = None) -> list[Unit]:
    # a layer's cost depends on its device group only through the group's size and ring bandwidth
    # (allreduce_seconds): remembered per (size, bandwidth), the cost model of 4,096 devices'
    # candidates asks once per distinct group shape instead of once per layer and candidate
    memo: dict[tuple[int, float], BlockCost] = {}

    def cost(d: tuple[int, ...]) -> BlockCost:
        key = (len(d), hw.ring_bandwidth(d) if len(d) > 1 else 0.0)
        c = memo.get(key)
        if c is None:
            c = memo[key] = transformer_block(x, 1, d, hw, cross_seq, attn_span)
        return c
    return [Unit(name, cost) for _ in range(n)]


def _maybe_recompute(units: list[Unit], recompute: bool) -> tuple[Unit, ...]:
    return tuple(with_recomputation(units) if recompute else units)


# ---- GPT --------------------------------------------------------------------------------------------
def gpt_spec(devices: int, hw: Hardware = A100, hidden: int = 8192, heads: int = 64, seq: int = 2048,
             vocab: int = 256_000, layers: int | None = None, micro_batch: int = 1, lm_head: bool = True,
             recompute: bool = False) -> ModelSpec:
    """GPT decoder with a large vocabulary; `layers` defaults to 2 per device. Without `lm_head`
    (the paper's setup) the last layer's output is the end of the model."""
    x = Shape(hidden, heads, seq, micro_batch, vocab=vocab)
    emb = Unit("emb", lambda d: embedding_block(x, d, hw), layer=False)
    head = Unit("head", lambda d: lm_head_block(x, d, hw), layer=False) if lm_head else None
    body = _maybe_recompute(_layers(x, layers or 2 * devices, hw), recompute)
    return ModelSpec("gpt", (Segment("layers", body, pre=emb, post=head),), hw)


def gpt(devices: int, layout: str = "tessel", hw: Hardware = A100, **kw: object) -> PlacedModel:
    """`tessel` is the M shape: the embedding and the tied LM head vocabulary-parallel over all
    devices (one copy of V h in total), the layers pipelined one stage per device. The plain
    pipeline puts the embedding on the first stage and an untied copy of it as the head on the
    last (Megatron ties them by an all-reduce of their gradients, so both hold V h).
    Keywords: those of `gpt_spec`."""
    spec = gpt_spec(devices, hw, **kw)  # type: ignore[arg-type]
    seg = spec.segments[0]
    if layout != "tessel":
        return chain_model("gpt", seg.chain(), devices, layout, hw)
    every = tuple(range(devices))
    parts = [Part("emb", every, seg.pre.cost(every))] if seg.pre else []
    parts += pipeline_parts(seg.layers, every)
    parts += [Part("head", every, seg.post.cost(every))] if seg.post else []
    return PlacedModel("gpt-mshape", devices, tuple(parts), tuple(chain_edges(parts)), hw)


# ---- mT5 --------------------------------------------------------------------------------------------
def mt5_spec(devices: int, hw: Hardware = A100, hidden: int = 4096, heads: int = 64, ffn: int = 10240,
             vocab: int = 250_112, enc_seq: int = 1024, dec_seq: int = 1024, layers: int | None = None,
             micro_batch: int = 2, lm_head: bool = True, recompute: bool = False, gated: bool = True) -> ModelSpec:
    """mT5-style encoder-decoder (gated-GELU MLP unless `gated` is off, untied LM head); `layers`
    encoder and as many decoder layers, default one of each per device. Decoder messages carry
    the encoder's output along for cross-attention. `ffn` 0 means 4 x hidden."""
    enc = Shape(hidden, heads, enc_seq, micro_batch, ffn, gated=gated, vocab=vocab)
    dec = Shape(hidden, heads, dec_seq, micro_batch, ffn, gated=gated, vocab=vocab)
    n = layers or devices
    carry = enc.hidden_bytes + dec.hidden_bytes

    def dec_layer(d: tuple[int, ...]) -> BlockCost:
        c = transformer_block(dec, 1, d, hw, cross_seq=enc_seq)
        return replace(c, output=carry, checkpoint=carry)

    emb = Unit("emb", lambda d: embedding_block(enc, d, hw, weights="shared"), layer=False)
    demb = Unit("demb", lambda d: embedding_block(dec, d, hw, weights="shared"), layer=False)
    head = Unit("head", lambda d: lm_head_block(dec, d, hw, weights="lm_head"), layer=False) if lm_head else None
    encoder = _maybe_recompute(_layers(enc, n, hw, name="enc"), recompute)
    decoder = _maybe_recompute([Unit("dec", dec_layer) for _ in range(n)], recompute)
    return ModelSpec("mt5", (Segment("enc", encoder, pre=emb),
                             Segment("dec", decoder, pre=demb, post=head, after=("enc",))), hw)


def mt5(devices: int, layout: str = "tessel", hw: Hardware = A100, **kw: object) -> PlacedModel:
    """`tessel` is the NN shape: the shared token embedding vocabulary-parallel on all devices
    before the encoder and again before the decoder, the encoder pipelined over the first
    devices and the decoder over the others (split by their costs), the LM head on all devices.
    Keywords: those of `mt5_spec`."""
    if devices < 2:
        raise TesselError("the NN shape needs at least 2 devices")
    enc, dec = _two_segments(mt5_spec(devices, hw, **kw))  # type: ignore[arg-type]
    if layout != "tessel":
        return chain_model("mt5", enc.chain() + dec.chain(), devices, layout, hw)
    every = tuple(range(devices))
    half = share_devices(devices, enc.layers[0].cost((0,)), dec.layers[0].cost((0,)))
    parts = [Part("emb", every, enc.pre.cost(every))] if enc.pre else []
    parts += pipeline_parts(enc.layers, every[:half], prefix="e")
    parts += [Part("demb", every, dec.pre.cost(every))] if dec.pre else []
    parts += pipeline_parts(dec.layers, every[half:], prefix="d")
    parts += [Part("head", every, dec.post.cost(every))] if dec.post else []
    return PlacedModel("mt5-nnshape", devices, tuple(parts), tuple(chain_edges(parts)), hw)


def _two_segments(spec: ModelSpec) -> tuple[Segment, Segment]:
    """The two segments of an encoder-decoder spec."""
    first, second = spec.segments
    return first, second


# ---- FLAVA ------------------------------------------------------------------------------------------
def flava_spec(devices: int, hw: Hardware = A100, hidden: int = 4096, heads: int = 32, image_seq: int = 576,
               text_seq: int = 512, layers: int | None = None, fusion_layers: int | None = None,
               micro_batch: int = 8) -> ModelSpec:
    """FLAVA-like multimodal model for inference: an image encoder and a text encoder (`layers`
    each, default one per device) joined by a multimodal fusion encoder (`fusion_layers`,
    default half as many) over the concatenated sequence."""
    img = Shape(hidden, heads, image_seq, micro_batch)
    txt = Shape(hidden, heads, text_seq, micro_batch)
    fus = Shape(hidden, heads, image_seq + text_seq, micro_batch)
    n = layers or devices
    nf = fusion_layers or max(1, n // 2)
    return ModelSpec("flava", (Segment("img", tuple(_layers(img, n, hw, name="img"))),
                               Segment("txt", tuple(_layers(txt, n, hw, name="txt"))),
                               Segment("fusion", tuple(_layers(fus, nf, hw, name="fusion")),
                                       after=("img", "txt"))), hw, training=False)


def flava(devices: int, layout: str = "tessel", hw: Hardware = A100, **kw: object) -> PlacedModel:
    """`tessel` is the K shape: the two encoders pipelined side by side on disjoint device groups
    (sized by their cost), the fusion encoder tensor-parallel on all devices.
    Keywords: those of `flava_spec`."""
    if devices < 2:
        raise TesselError("the K shape needs at least 2 devices")
    image, text, fusion = flava_spec(devices, hw, **kw).segments  # type: ignore[arg-type]
    if layout != "tessel":
        return chain_model("flava", [*image.layers, *text.layers, *fusion.layers], devices, layout, hw,
                           training=False)
    n_img = share_devices(devices, image.layers[0].cost((0,)), text.layers[0].cost((0,)))
    every = tuple(range(devices))
    img_parts = pipeline_parts(image.layers, every[:n_img], prefix="i")
    txt_parts = pipeline_parts(text.layers, every[n_img:], prefix="t")
    fusion_part = Part("fusion", every, combine(*(u.cost(every) for u in fusion.layers)))
    edges = chain_edges(img_parts) + chain_edges(txt_parts) + [
        (img_parts[-1].name, "fusion"), (txt_parts[-1].name, "fusion")]
    return PlacedModel("flava-kshape", devices, (*img_parts, *txt_parts, fusion_part), tuple(edges), hw,
                       training=False)


# ---- AlphaFold-like ---------------------------------------------------------------------------------
def alphafold_spec(devices: int, hw: Hardware = A100, evo: Evoformer = EVOFORMER,
                   blocks: int | None = None, recycles: int = 3) -> ModelSpec:
    """The Evoformer stack, passed `recycles` times without gradients before the trained pass;
    `blocks` defaults to AlphaFold's 48, rounded up to a multiple of the device count."""
    n = blocks or math.ceil(48 / devices) * devices
    chain = tuple(Unit("evo", lambda d: evoformer_block(evo, 1, d, hw)) for _ in range(n))
    return ModelSpec("alphafold", (Segment("evo", chain),), hw, recycles=recycles)


def alphafold_like(devices: int, layout: str = "tessel", hw: Hardware = A100, evo: Evoformer = EVOFORMER,
                   blocks: int | None = None, recycles: int = 3) -> PlacedModel:
    """AlphaFold-like training step: `recycles` forward passes without gradients through the
    Evoformer stack, each feeding the next, then one pass with gradients and its backward.

    `tessel` (and `pipeline`) pipelines the stack one stage per device; every pass runs on the
    same stages (shared weights). `chimera` runs two such pipelines in opposite directions and
    `tp` runs every block on all devices with DAP.
    """
    chain = alphafold_spec(devices, hw, evo, blocks, recycles).segments[0].layers
    every = tuple(range(devices))
    if layout in ("tessel", "pipeline", "balanced"):
        parts = recycle_parts(chain, [(d,) for d in every], recycles, "")
        return PlacedModel("alphafold-recycle", devices, tuple(parts), tuple(chain_edges(parts)), hw)
    if layout == "chimera":
        up = recycle_parts(chain, [(d,) for d in every], recycles, "u")
        down = recycle_parts(chain, [(d,) for d in every[::-1]], recycles, "d")
        return PlacedModel("alphafold-chimera", devices, tuple(up + down),
                           tuple(chain_edges(up) + chain_edges(down)), hw, replicas=2)
    if layout == "tp":
        one = evoformer_block(evo, len(chain), every, hw)
        parts = [Part(f"p{r}", every, no_grad(replace_weights(one, "evo"))) for r in range(recycles)]
        parts.append(Part("grad", every, replace_weights(one, "evo")))
        return PlacedModel("alphafold-tp", devices, tuple(parts), tuple(chain_edges(parts)), hw)
    raise TesselError(f"layout {layout!r} is not one of {', '.join(LAYOUTS)}")


def recycle_parts(chain: Sequence[Unit], groups: Sequence[tuple[int, ...]], recycles: int,
                  prefix: str) -> list[Part]:
    """The passes of one pipeline: stage k of every pass on groups[k], sharing its weights."""
    parts: list[Part] = []
    for r in range(recycles + 1):
        stages = stage_parts(chain, groups, prefix=f"{prefix}p{r}s", weights=f"{prefix}stage")
        parts += [Part(p.name, p.devices, no_grad(p.cost)) if r < recycles else p for p in stages]
    return parts


# ---- Swin -------------------------------------------------------------------------------------------
def swin_spec(devices: int, hw: Hardware = A100, embed: int = 512, depths: Sequence[int] = (2, 2, 42, 4),
              heads: Sequence[int] = (16, 32, 64, 128), image: int = 640, patch: int = 4, window: int = 20,
              micro_batch: int = 4) -> ModelSpec:
    """Swin-style hierarchical vision transformer (SwinV2-G-like widths and depths by default).

    Stage k works on (image / patch / 2^k)^2 tokens of width embed 2^k with attention inside
    windows of window^2 tokens: a layer costs 8 b T C^2 + 4 b T window^2 C for attention and
    16 b T C^2 for its MLP (Liu et al. 2021, eq. 2, in FLOPs). Patch merging between stages
    (4 b T C^2, under 1% of a stage) is neglected."""
    chain: list[Unit] = []
    for k, (depth, h) in enumerate(zip(depths, heads)):
        side = image // patch // 2 ** k
        x = Shape(embed * 2 ** k, h, side * side, micro_batch)
        chain += _layers(x, depth, hw, name=f"stage{k}", attn_span=window * window)
    return ModelSpec("swin", (Segment("swin", tuple(chain)),), hw)


def swin(devices: int, layout: str = "pipeline", hw: Hardware = A100, **kw: object) -> PlacedModel:
    """`tessel` is the plain pipeline with a cost-balanced split (the stages differ 4x in width),
    as no sharded block helps here. Keywords: those of `swin_spec`."""
    chain = list(swin_spec(devices, hw, **kw).segments[0].layers)  # type: ignore[arg-type]
    return chain_model("swin", chain, devices, "balanced" if layout == "tessel" else layout, hw)


SPECS: dict[str, Callable[..., ModelSpec]] = {"gpt": gpt_spec, "mt5": mt5_spec, "flava": flava_spec, "alphafold": alphafold_spec, "swin": swin_spec}
