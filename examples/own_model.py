"""Your own model on a pipeline: an MLP cut into 4 blocks, trained by a 1F1B schedule on 4 processes.

    torchrun --nproc-per-node 4 examples/own_model.py    # under torchrun
    python examples/own_model.py                         # or 4 local processes (tessel's launcher)
"""
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tessel.runtime.pipeline import Pipeline
from tessel.runtime.split import split_sequential


def train(ctx: Any = None, steps: int = 3) -> list[float]:
    torch.manual_seed(0)  # the same model on every rank
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    blocks = split_sequential(model, 4)  # {"s0": layers 0-1, ..., "s3": the last layer}
    pipe = Pipeline(blocks, "1f1b", loss_fn=F.cross_entropy, micro_batches=8, ctx=ctx)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    x, y = torch.randn(32, 16), torch.randint(0, 10, (32,))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        losses.append(pipe.step(x, target=y))  # forward + backward of 8 micro-batches
        opt.step()
    return losses


if __name__ == "__main__":
    import os

    from tessel.runtime.launch import launch
    losses = train() if "RANK" in os.environ else launch(train, 4)[0]
    print("losses:", " ".join(f"{v:.6f}" for v in losses))
