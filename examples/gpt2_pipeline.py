"""Train a Hugging Face GPT-2 (random weights from a config, nothing downloaded) on the M shape:
vocabulary-parallel embedding and LM head on every rank, the transformer layers pipelined, by a
schedule tessel searched; optionally check every step against the whole model on one process.

    python examples/gpt2_pipeline.py --devices 4 --steps 2 --check          # 4 local processes
    torchrun --nproc-per-node 4 examples/gpt2_pipeline.py --steps 2 --check
    python examples/gpt2_pipeline.py --steps 2 --save ckpt      # then: --resume ckpt --steps 2

--check prints, per step, the loss, the single-process loss and the largest relative gradient
error over all parameters (|g - g_ref| / |g_ref| per tensor, on each rank's shard), and exits 1
when one exceeds --rtol.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from tessel import library
from tessel.runtime import checkpoint, wire
from tessel.runtime.dataflow import dataflow
from tessel.runtime.hf import GPT2Blocks, gpt2_batch, gpt2_config, gpt2_loss, gpt2_model
from tessel.runtime.pipeline import Pipeline
from tessel.runtime.tp import shard_of


@dataclass(frozen=True)
class Args:
    devices: int = 4
    layers: int = 4
    dim: int = 32
    heads: int = 4
    vocab: int = 64
    seq: int = 16
    schedule: str = "tessel"
    micro_batches: int = 8
    micro_batch_size: int = 2
    steps: int = 2
    lr: float = 1e-3
    check: bool = False
    save: str | None = None
    resume: str | None = None


@wire.register  # results cross processes as JSON: a dataclass must be on the allowlist
@dataclass(frozen=True)
class Step:
    step: int
    loss: float
    seconds: float
    reference_loss: float | None = None
    grad_error: float | None = None  # the largest per-tensor relative gradient error on this rank


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def train(ctx: Any, a: Args) -> list[Step]:
    torch.manual_seed(0)
    config = gpt2_config(a.layers, a.dim, a.heads, a.vocab, a.seq)
    placement = library.build("mllm", devices=a.devices)
    gpt2 = GPT2Blocks(dataflow(placement), config, seed=0)
    pipe = Pipeline(gpt2, a.schedule, placement=placement, micro_batches=a.micro_batches,
                    feeds=gpt2.feeds, ctx=ctx)
    opt = torch.optim.Adam(pipe.parameters(), lr=a.lr)
    if a.save:
        checkpoint.check_new(a.save)  # before the steps: a taken name must not cost a run
    first = 0
    if a.resume:
        first = int(checkpoint.load(a.resume, pipe, opt)["step"])
    ref = gpt2_model(config, seed=0) if a.check else None
    ref_opt = torch.optim.Adam(ref.parameters(), lr=a.lr) if ref is not None else None
    out = []
    for step in range(first, first + a.steps):
        batch = gpt2_batch(config, a.micro_batches * a.micro_batch_size, a.seq, seed=step)
        opt.zero_grad()
        t0 = time.perf_counter()
        loss = pipe.step(**batch)
        seconds = time.perf_counter() - t0
        record = Step(step, loss, seconds)
        if ref is not None and ref_opt is not None:
            ref_opt.zero_grad()
            ref_loss = gpt2_loss(ref, batch)
            ref_loss.backward()  # type: ignore[no-untyped-call]
            full = dict(ref.named_parameters())
            err = max(rel(p.grad, shard_of(p, full[gpt2.names[n]].grad)) for n, p in pipe.named_parameters()  # type: ignore[arg-type]
                      if p.grad is not None)
            record = Step(step, loss, seconds, float(ref_loss.detach()), err)
            ref_opt.step()
        opt.step()
        out.append(record)
    if a.save:
        checkpoint.save(a.save, pipe, opt, {"step": torch.tensor(first + a.steps)})
    return out


class LogitsOf(torch.nn.Module):
    """The Hugging Face model as a function of token ids to logits (what the tracer can split)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.model(input_ids=ids, use_cache=False).logits
        return logits


def profile_target(layers: int = 4, micro_batch_size: int = 2) -> tuple[dict[str, torch.nn.Module], tuple[Any, ...]]:
    """For `tessel profile --module gpt2_pipeline:profile_target`: the GPT-2 cut before each
    transformer layer by module names, and one micro-batch of token ids."""
    from tessel.runtime.split import split_at
    config = gpt2_config(layers=layers)
    ids = gpt2_batch(config, micro_batch_size, 16, seed=0)["input_ids"]
    names = [f"model.transformer.h.{i}" for i in range(1, layers)]
    return split_at(LogitsOf(gpt2_model(config)), names, (ids,)), (ids,)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in Args.__dataclass_fields__.values():
        name = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            ap.add_argument(name, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            ap.add_argument(name, type=kind, default=f.default)
    ap.add_argument("--rtol", type=float, default=1e-4, help="largest relative error accepted by --check")
    ns = vars(ap.parse_args(argv))
    rtol = ns.pop("rtol")
    a = Args(**ns)
    quiet = False
    if "RANK" in os.environ:  # under torchrun: this rank's steps; rank 0 prints
        steps, quiet = [train(None, a)], int(os.environ["RANK"]) != 0
    else:
        from tessel.runtime.launch import Options, launch
        steps = launch(train, a.devices, (a,), Options(timeout=600))
    worst = 0.0
    for i, s in enumerate(steps[0]):
        line = f"step {s.step}: loss {s.loss:.6f}  {max(r[i].seconds for r in steps):.3f} s"
        if s.reference_loss is not None:
            g = max(r[i].grad_error or 0.0 for r in steps)
            lerr = abs(s.loss - s.reference_loss) / abs(s.reference_loss)
            worst = max(worst, g, lerr)
            line += f"  reference {s.reference_loss:.6f}  loss rel err {lerr:.2e}  max grad rel err {g:.2e}"
        if not quiet:
            print(line, flush=True)
    if a.check and not quiet:
        print(f"check {'ok' if worst <= rtol else 'FAILED'}: largest relative error {worst:.2e} (rtol {rtol:g})")
        return 0 if worst <= rtol else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
