"""Numbers as Tessel shows and stores them: integers stay integers, the rest rounded once here.

Times and memory are ints on integral placements and floats otherwise; sums of floats leave
dust (2.9999999999), which `snap` removes so files, tables and messages print `3`.
"""
from __future__ import annotations

from typing import Any

from .placement import Number

EPS = 1e-9


def snap(x: float) -> Number:
    """`x` as an int when it is one up to float dust, else unchanged."""
    if type(x) is int:  # the common case on integral placements: nothing to round (and fast)
        return x
    return int(round(x)) if abs(x - round(x)) < EPS else x


def rounded(x: float, digits: int) -> Number:
    """`snap(x)`, or `x` rounded to `digits` decimals when it is not whole."""
    y = snap(x)
    return y if isinstance(y, int) else round(y, digits)


def integral(x: float) -> Number:
    """`x` as an int when it is exactly whole (a parsed `2.0` becomes `2`)."""
    return int(x) if float(x).is_integer() else x


def fmt(x: Any, digits: int = 4, kind: str = "g", none: str = "-") -> str:
    """One cell or value as text: whole floats without '.0', others with `digits` ('g':
    significant, 'f': decimals), lists comma-joined, None as `none`."""
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() else f"{x:.{digits}{kind}}"
    if isinstance(x, (list, tuple)):
        return ",".join(fmt(v, digits, kind, none) for v in x)
    return none if x is None else str(x)
