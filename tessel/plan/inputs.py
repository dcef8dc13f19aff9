"""What `tessel plan` accepts as a model: a cost-model builder by name (`gpt`, `mt5`, `flava`,
`alphafold`, `swin`, with their keyword options), a placement file (what `tessel profile`
writes, in ms and MiB), or a placement-family file (`{"family": "kshape", "forward": 2, ...}`,
a library placement built for the cluster's device count)."""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import library
from ..baselines import why_not
from ..costmodel import MIB, SPECS, BlockCost, Cost, ModelSpec, Segment, Unit
from ..errors import TesselError
from ..io import read_document
from ..placement import Number, Placement, PlacementError, placement_from_dict
from .candidates import Candidate, Cluster


@dataclass(frozen=True)
class ModelInput:
    """The model to plan, and the placement the user gave (a candidate as it stands), if any."""
    spec: ModelSpec
    given: Candidate | None = None
    description: str = ""  # what was planned, in words (the plan table's title)


def load_model(source: str, cluster: Cluster, options: Mapping[str, Number | bool] | None = None) -> ModelInput:
    """The model named or stored at `source`; `options` go to a zoo builder (layers=, hidden=, ...)."""
    opts = dict(options or {})
    if source in SPECS:
        build = SPECS[source]
        takes = [k for k in inspect.signature(build).parameters if k not in ("devices", "hw")]
        unknown = [k for k in opts if k not in takes]
        if unknown:
            raise TesselError(f"model {source} takes {', '.join(takes)}; not {', '.join(unknown)}")
        params = inspect.signature(build).parameters
        for k, v in opts.items():
            _check_option(source, k, str(params[k].annotation), v)
        spec = build(cluster.devices, cluster.hardware, **opts)
        return ModelInput(spec, None, describe(source, spec, {**_defaults(build), **opts}))
    if not Path(source).exists():
        raise TesselError(f"model {source!r} is neither a known model ({', '.join(SPECS)}) nor a file")
    if opts:
        raise TesselError(f"options {', '.join(opts)} apply to the named models only, not to {source}")
    doc = read_document(source)
    if isinstance(doc, dict) and "family" in doc:
        costs = {k: v for k, v in doc.items() if k != "family"}
        placement = library.build(str(doc["family"]), cluster.devices, **costs)
    else:
        placement = placement_from_dict(doc, source)
    got = from_placement(placement, cluster)
    blocks = sum(len(s.layers) for s in got.spec.segments)
    return ModelInput(got.spec, got.given, f"{got.spec.name} from {source}: {blocks} blocks as measured, "
                                           f"{'training' if got.spec.training else 'inference'}")


SHOWN = ("hidden", "heads", "seq", "image_seq", "text_seq", "enc_seq", "dec_seq", "vocab", "micro_batch")


def _defaults(build: Any) -> dict[str, Any]:
    return {k: v.default for k, v in inspect.signature(build).parameters.items()
            if v.default is not inspect.Parameter.empty}


def describe(source: str, spec: ModelSpec, options: Mapping[str, Any]) -> str:
    """`gpt: 16 layers, hidden 8192, seq 2048, ... (training)`: the model a plan is for."""
    layers = sum(1 for s in spec.segments for u in s.layers if u.layer)
    dims = ", ".join(f"{k.replace('_', ' ')} {options[k]:,}" if isinstance(options[k], int) else f"{k} {options[k]}"
                     for k in SHOWN if k in options and not isinstance(options[k], bool))
    return f"{source}: {layers} layers, {dims} ({'training' if spec.training else 'inference'})"


# a model option is a size (hidden, heads, seq, ...) or a count of repeated layers; beyond these
# the cost model's numbers leave the placement format's range, or building a billion layers takes
# minutes before the first solve
MAX_SIZE = 2**20
MAX_REPEATS = 10_000
REPEAT_OPTIONS = ("layers", "blocks", "fusion_layers", "recycles")


def _check_option(model: str, key: str, annotation: str, value: Number | bool) -> None:
    """A `--set` value the builder's parameter can take: a bool for a bool, an integer in range
    for an int (never NaN, 1e300 or a fraction), checked before any model is built."""
    where = f"--set {key} (model {model})"
    if annotation == "bool":
        if not isinstance(value, bool):
            raise TesselError(f"{where}: expected true or false, got {value!r}")
        return
    if annotation.startswith("int"):
        most = MAX_REPEATS if key in REPEAT_OPTIONS else MAX_SIZE
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise TesselError(f"{where}: expected an integer in 1..{most:,}, got {value!r}")
        return
    raise TesselError(f"{where}: this option cannot be set from the command line")


def from_placement(p: Placement, cluster: Cluster) -> ModelInput:
    """A measured placement as a chain of its forward blocks in dependency order (each with the
    backward that is its gradient), re-cut by the planner; the placement itself is a candidate
    too when it has the cluster's device count. Costs do not change with the device set (a
    profile measures one device), so only plain pipelines (tp 1) are worth cutting."""
    backward: dict[str, float] = {}
    for b in p.blocks:
        if b.grad_of is not None:
            backward[b.grad_of] = backward.get(b.grad_of, 0.0) + float(b.duration)
    units = []
    for bid in p.topo_order:
        b = p.by_id[bid]
        if b.kind in ("forward", "other"):
            cost = BlockCost(float(b.duration) / 1e3, backward.get(bid, 0.0) / 1e3, float(b.memory) * MIB, 0.0, 0.0)
            units.append(Unit(bid, _fixed(cost)))
    if not units:
        raise PlacementError(f"placement {p.name!r} has no forward blocks to plan")
    spec = ModelSpec(p.name, (Segment("blocks", tuple(units)),), cluster.hardware, p.is_training)
    given = None
    if p.devices == cluster.devices:
        budget = (int(cluster.hardware.usable() // MIB),) * p.devices
        fwd = "1f1b" if p.is_training else "gpipe"
        same = tuple((u.name, (u.name,)) for u in units)  # the user's own blocks, unchanged
        given = Candidate("given", 1, "as given", p, budget, 1, fwd if why_not(fwd, p) is None else None, same)
    return ModelInput(spec, given)


def _fixed(cost: BlockCost) -> Cost:
    return lambda devices: cost
