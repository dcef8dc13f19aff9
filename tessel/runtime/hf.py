"""A Hugging Face GPT-2 on the M shape: vocabulary-parallel embedding and LM head on every rank,
the transformer layers pipelined between them (the placement `mllm`: fA0, f0 .. f(p-1), fA1).

The model is built from a `GPT2Config` with random weights (never downloaded) the same way on
every rank (a seed), then cut: the embedding block holds `transformer.wte` (its vocabulary rows
split over the ranks, tessel.runtime.tp) and `transformer.wpe`; each pipeline block a run of
`transformer.h`; the head block `transformer.ln_f`, the LM head (column-parallel over the
vocabulary, no gather) and the vocabulary-parallel cross-entropy. GPT-2 ties the LM head to the
token embedding: on each rank the head block uses the embedding block's shard of it, the same
parameter, so its gradient sums both uses as in the whole model.

Needs `transformers` (the `hf` extra).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ..placement import PlacementError
from .dataflow import Dataflow
from .tp import ColumnParallelLinear, Group, VocabParallelCrossEntropy, VocabParallelEmbedding

TOKENS, LABELS = "input_ids", "labels"


def gpt2_config(layers: int = 4, dim: int = 32, heads: int = 4, vocab: int = 64, seq: int = 16) -> Any:
    """A small GPT-2 configuration without dropout (so a pipeline and one process agree exactly)."""
    from transformers import GPT2Config
    return GPT2Config(n_layer=layers, n_embd=dim, n_head=heads, vocab_size=vocab, n_positions=seq,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def gpt2_model(config: Any, seed: int = 0) -> nn.Module:
    """`GPT2LMHeadModel` with random weights fixed by the seed."""
    from transformers import GPT2LMHeadModel
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return GPT2LMHeadModel(config)


def gpt2_batch(config: Any, size: int, seq: int, seed: int) -> dict[str, Tensor]:
    """Random token sequences: the inputs and the next tokens as labels."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, config.vocab_size, (size, seq + 1), generator=g)
    return {TOKENS: tokens[:, :-1].contiguous(), LABELS: tokens[:, 1:].contiguous()}


def gpt2_loss(model: nn.Module, batch: Mapping[str, Tensor]) -> Tensor:
    """The whole model's mean next-token loss on one process (the reference)."""
    logits = model(input_ids=batch[TOKENS], use_cache=False).logits
    return nn.functional.cross_entropy(logits.flatten(0, -2), batch[LABELS].flatten())


class Embedding(nn.Module):
    def __init__(self, wte: nn.Module, wpe: nn.Module) -> None:
        super().__init__()
        self.wte, self.wpe = wte, wpe

    def forward(self, ids: Tensor) -> Tensor:
        out: Tensor = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        return out


class Layers(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.h = nn.ModuleList(layers)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.h:
            out = layer(x)
            x = out[0] if isinstance(out, tuple) else out
        return x


class Head(nn.Module):
    def __init__(self, ln_f: nn.Module, lm_head: nn.Module, group: Group | None) -> None:
        super().__init__()
        self.ln_f, self.lm_head, self.loss = ln_f, lm_head, VocabParallelCrossEntropy(group)

    def forward(self, x: Tensor, labels: Tensor) -> Tensor:
        out: Tensor = self.loss(self.lm_head(self.ln_f(x)), labels)
        return out


@dataclass
class GPT2Blocks:
    """Builds this rank's blocks of a GPT-2 on an M-shape placement: `blocks(block id, group)`."""
    flow: Dataflow
    config: Any
    seed: int = 0
    names: dict[str, str] = field(default_factory=dict)  # "<block>.<param>" -> the whole model's name
    _model: Any = None  # the whole GPT2LMHeadModel, built on first use
    _wte: Any = None

    @property
    def chain(self) -> tuple[str, ...]:
        fw = self.flow.forwards
        if len(fw) < 3 or any(len(self.flow.out_edges[b]) > 1 for b in fw) or len(self.flow.sinks) != 1:
            raise PlacementError(f"GPT-2 needs a chain: embedding, pipeline blocks, head; placement "
                                 f"{self.flow.placement.name} is not one")
        return fw

    def layers_of(self, block: str) -> range:
        """The transformer layers a pipeline block holds: consecutive, as even as they go."""
        mid = self.chain[1:-1]
        n, k = self.config.n_layer, len(mid)
        if n < k:
            raise PlacementError(f"GPT-2 with {n} layers cannot fill {k} pipeline blocks")
        i = mid.index(block)
        start = i * (n // k) + min(i, n % k)
        return range(start, start + n // k + (i < n % k))

    def __call__(self, block: str, group: Group | None) -> nn.Module:
        if self._model is None:
            self._model = gpt2_model(self.config, self.seed)
        t = self._model.transformer
        chain = self.chain
        if block == chain[0]:
            wte = VocabParallelEmbedding(t.wte, group) if group is not None else t.wte
            self._wte = wte
            self._name(block, {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight"})
            return Embedding(wte, t.wpe)
        if block == chain[-1]:
            head = ColumnParallelLinear(self._model.lm_head, group) if group is not None else self._model.lm_head
            if self._wte is not None:  # tied: the embedding block's (shard of the) weight
                head.weight = self._wte.weight
            self._name(block, {"ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias",
                               "lm_head.weight": "transformer.wte.weight"})
            return Head(t.ln_f, head, group)
        if len(self.flow.devices(block)) > 1:
            raise PlacementError(f"GPT-2 pipeline block {block} spans several devices: only the embedding and "
                                 "the head are sharded here")
        layers = self.layers_of(block)
        mod = Layers([t.h[i] for i in layers])
        for name, _ in mod.named_parameters():
            _, k, rest = name.split(".", 2)
            self.names[f"{block}.{name}"] = f"transformer.h.{layers[int(k)]}.{rest}"
        return mod

    def _name(self, block: str, names: Mapping[str, str]) -> None:
        self.names.update({f"{block}.{k}": v for k, v in names.items()})

    @property
    def feeds(self) -> dict[str, tuple[str, ...]]:
        return {self.chain[0]: (TOKENS,), self.chain[-1]: (LABELS,)}
