"""Checkpoints of a pipeline's sharded model and optimizer with torch.distributed.checkpoint.

Each rank writes the parameters of its blocks and their optimizer state under
`model.<block>.<parameter>`; a shard of a tensor-parallel parameter (tp.py's `tessel_shard`) adds
`@<index>of<count>`, so the shards of one tensor are distinct entries while a replicated
parameter (the same key on several ranks) is written once. Only tensors are stored (optimizer
state such as Adam's `step` is a tensor); hyperparameters come from the code that builds the
optimizer again. A fresh optimizer's empty state is allocated from the checkpoint's metadata
before loading, so `load` restores a run stopped at any step.

`save` and `load` are collective over the pipeline's process group.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from ..errors import CheckpointError as CheckpointError
from .pipeline import Pipeline

MODEL, OPTIM, EXTRA = "model", "optim", "extra"


def _key(name: str, p: Tensor) -> str:
    spec = getattr(p, "tessel_shard", None)
    return name if spec is None else f"{name}@{spec[1]}of{spec[2]}"


def _params(pipe: Pipeline) -> dict[str, nn.Parameter]:
    """This rank's parameters by checkpoint key, each once (a tied parameter under its first name)."""
    out: dict[str, nn.Parameter] = {}
    seen: set[int] = set()
    for name, p in pipe.named_parameters():
        if id(p) not in seen:
            seen.add(id(p))
            out[_key(name, p)] = p
    return out


def _state(pipe: Pipeline, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    params = _params(pipe)
    doc: dict[str, Any] = {MODEL: {k: p.detach() for k, p in params.items()}}
    if optimizer is not None:
        optim: dict[str, Tensor] = {}
        for k, p in params.items():
            for field, v in optimizer.state.get(p, {}).items():
                if not isinstance(v, Tensor):
                    raise CheckpointError(f"optimizer state {field!r} of {k} is a {type(v).__name__}: only "
                                          "tensor state is saved: use an optimizer with tensor state, or save it yourself")
                optim[f"{k}.{field}"] = v
        doc[OPTIM] = optim
    return doc


def check_new(path: str | Path) -> Path:
    """`path` as a place `save` can write: refused (CheckpointError) when something is there
    already. Call it before training, so a run is not lost to a name taken."""
    p = Path(path)
    if p.exists() and (not p.is_dir() or any(p.iterdir())):
        raise CheckpointError(f"checkpoint {p} already exists: give a new directory")
    if not p.parent.is_dir():
        raise CheckpointError(f"checkpoint {p}: its parent directory {p.parent} does not exist")
    return p


def save(path: str | Path, pipe: Pipeline, optimizer: torch.optim.Optimizer | None = None,
         extra: Mapping[str, Tensor] | None = None) -> None:
    """Write the pipeline's parameters (and optimizer state, and `extra` tensors such as a step
    counter, the same on every rank) into the new directory `path` (see `check_new`)."""
    p = check_new(path)
    doc = _state(pipe, optimizer)
    doc[EXTRA] = {k: v.detach().clone() for k, v in (extra or {}).items()}
    dcp_save(doc, checkpoint_id=str(p), process_group=pipe.group)


def load(path: str | Path, pipe: Pipeline, optimizer: torch.optim.Optimizer | None = None) -> dict[str, Tensor]:
    """Read the checkpoint at `path` into the pipeline's parameters (and optimizer); its extras."""
    p = Path(path)
    if not (p / ".metadata").is_file():
        raise CheckpointError(f"no checkpoint at {p} (no .metadata file: missing or not finished); give the "
                              "directory checkpoint.save wrote")
    meta = FileSystemReader(str(p)).read_metadata().state_dict_metadata
    params = _params(pipe)
    for k in params:
        if f"{MODEL}.{k}" not in meta:
            raise CheckpointError(f"checkpoint {p} has no entry for parameter {k} (saved from another model "
                                  "or placement?)")
    doc = _state(pipe, None)
    if optimizer is not None:
        doc[OPTIM] = {}
        for k, param in params.items():
            prefix = f"{OPTIM}.{k}."
            for name, m in meta.items():
                if name.startswith(prefix):
                    field = name[len(prefix):]
                    state = optimizer.state[param]
                    if field not in state:
                        state[field] = torch.zeros(tuple(m.size), dtype=m.properties.dtype,  # type: ignore[union-attr]
                                                   device=param.device)
                    doc[OPTIM][f"{k}.{field}"] = state[field]
    doc[EXTRA] = {name[len(EXTRA) + 1:]: torch.zeros(tuple(m.size), dtype=m.properties.dtype)  # type: ignore[union-attr]
                  for name, m in meta.items() if name.startswith(f"{EXTRA}.")}
    with torch.no_grad():
        model = {k: torch.empty_like(v) for k, v in doc[MODEL].items()}
        doc[MODEL] = model
        dcp_load(doc, checkpoint_id=str(p), process_group=pipe.group)
        for k, v in model.items():
            params[k].copy_(v)
    extra: dict[str, Tensor] = doc[EXTRA]
    return extra
