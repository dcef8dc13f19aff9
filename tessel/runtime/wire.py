"""JSON for values that cross processes: what a worker returns to its launcher.

Plain JSON values pass as they are; tuples and the frozen dataclasses registered here (by name,
in an allowlist) are tagged so that they come back as what they were. Decoding never runs code
named by the input: an unknown tag or a field a class does not have is an error.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, TypeVar

from ..errors import WireError as WireError

T = TypeVar("T")
_TYPES: dict[str, type] = {}
_TAG = "__tessel__"


def register(cls: type[T]) -> type[T]:
    """Allow a dataclass to cross processes (a class decorator)."""
    if not dataclasses.is_dataclass(cls):
        raise WireError(f"{cls.__name__} is not a dataclass: register frozen dataclasses only")
    _TYPES[cls.__name__] = cls
    return cls


def encode(value: Any) -> str:
    return json.dumps(_to(value), allow_nan=True, separators=(",", ":"))


def decode(text: str) -> Any:
    try:
        return _from(json.loads(text))
    except (ValueError, TypeError, KeyError) as e:
        raise WireError(f"not a value this job sent: {e} (ranks running different tessel versions?)") from None


def _to(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {_TAG: "float", "v": repr(v)}
    if isinstance(v, list):
        return [_to(x) for x in v]
    if isinstance(v, tuple):
        return {_TAG: "tuple", "v": [_to(x) for x in v]}
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise WireError(f"dictionary keys must be strings, got {sorted(map(repr, v))[:3]}: convert them")
        if _TAG in v:
            raise WireError(f"a dictionary may not use the key {_TAG!r}: rename it")
        return {k: _to(x) for k, x in v.items()}
    name = type(v).__name__
    if _TYPES.get(name) is type(v) and dataclasses.is_dataclass(v):
        return {_TAG: name, "v": {f.name: _to(getattr(v, f.name)) for f in dataclasses.fields(v)}}
    raise WireError(f"cannot send a {name} between processes (JSON values, tuples and "
                    f"{sorted(_TYPES)} only): convert it, or register its dataclass with wire.register")


def _from(v: Any) -> Any:
    if isinstance(v, list):
        return [_from(x) for x in v]
    if not isinstance(v, dict):
        return v
    if _TAG not in v:
        return {k: _from(x) for k, x in v.items()}
    tag, body = v[_TAG], v["v"]
    if tag == "float":
        if body not in ("inf", "-inf", "nan"):
            raise WireError(f"bad float {body!r}")
        return float(body)
    if tag == "tuple":
        return tuple(_from(x) for x in body)
    cls = _TYPES.get(tag)
    if cls is None or not isinstance(body, dict):
        raise WireError(f"unknown type {tag!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    if not set(body) <= names:
        raise WireError(f"{tag} has no fields {sorted(set(body) - names)}")
    return cls(**{k: _from(x) for k, x in body.items()})
