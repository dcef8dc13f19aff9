"""Baselines on a looped pipeline (stage k on device k mod p, v >= 2 chunks per device):
Megatron's interleaved 1F1B and its zero-bubble variant (ZB-H1's warm-up and held-back W passes),
built from the placement."""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ..key import Key
from ..placement import Number, Placement
from ..timing import earliest_starts
from .shapes import BaselineError, Chain, one_f_one_b, single_chain

Limit = Number | Sequence[Number] | None
Starts = dict[Key, Number]


def looped(p: Placement) -> tuple[Chain, int]:
    c = single_chain(p, "interleaved")
    devs = c.devices(p)
    first = devs[:p.devices]
    if not c.backward or (c.weight and len(c.weight) != len(c.backward)):
        raise BaselineError("interleaved needs a looped pipeline with every backward whole or every one split")
    if sorted(first) != list(range(p.devices)) or any(d != first[k % p.devices] for k, d in enumerate(devs)):
        raise BaselineError("interleaved needs a looped pipeline: stage k on the (k mod p)-th device")
    chunks = len(devs) // p.devices
    if chunks < 2 or len(devs) % p.devices:
        raise BaselineError(f"interleaved needs >= 2 model chunks per device; placement {p.name} has "
                            f"{len(devs)} stages on {p.devices} devices (use 1f1b)")
    return c, chunks


_looped = looped  # the old private name (branches written against it)


def interleaved_fits(p: Placement) -> None:
    looped(p)


def interleaved(p: Placement, n: int, limit: Limit) -> Starts:
    """Megatron's warm-up of 2(p - r - 1) + (v - 1)p forwards on device r; each W right after its B."""
    return earliest_starts(p, n, interleaved_orders(p, n, lambda r, k, v: (k - r - 1) * 2 + (v - 1) * k,
                                                    lambda r: 0))


def interleaved_zb_fits(p: Placement) -> None:
    c, _ = looped(p)
    if len(c.weight) != len(c.backward):
        raise BaselineError("interleaved-zb-h1 needs every backward split into B and W (placement interleaved-zb)")


def interleaved_zb(p: Placement, n: int, limit: Limit) -> Starts:
    """ZB-H1's two ideas on the looped pipeline: a warm-up of (v - 1)p + p - r - 1 forwards on
    device r (Megatron's less the p - r - 1 second-round ones, so v p activations at most) and
    device r keeping r weight passes back, which fill its cool-down's bubbles."""
    return earliest_starts(p, n, interleaved_orders(p, n, lambda r, k, v: (v - 1) * k + k - r - 1,
                                                    lambda r: r))


def interleaved_orders(p: Placement, n: int, warm_of: Callable[[int, int, int], int],
                       lag_of: Callable[[int], int]) -> list[list[Key]]:
    """Interleaved 1F1B orders: device r runs warm_of(r, p, v) forwards first; a split backward's
    W runs once lag_of(r) later B passes are queued behind it (0: right after its B)."""
    c, v = looped(p)
    k_dev = p.devices
    if n % k_dev:
        raise BaselineError(f"interleaved needs micro-batches a multiple of the {k_dev} devices, got {n}")
    s = len(c.forward)

    def micro(k: int) -> int:
        return (k // (k_dev * v)) * k_dev + k % k_dev

    orders: list[list[Key]] = [[] for _ in range(k_dev)]
    total = n * v
    for r, dev in enumerate(c.devices(p)[:k_dev]):
        fwd = [(c.forward[((k // k_dev) % v) * k_dev + r], micro(k)) for k in range(total)]
        bwd = [(c.backward[s - 1 - ((v - 1 - (k // k_dev) % v) * k_dev + r)], micro(k)) for k in range(total)]
        order: list[Key] = []
        held: list[Key] = []
        for key in one_f_one_b(fwd, bwd, min(warm_of(r, k_dev, v), total)):
            order.append(key)
            if key[0] in c.weight:
                held.append((c.weight[key[0]], key[1]))
                if len(held) > lag_of(r):
                    order.append(held.pop(0))
        orders[dev] = order + held
    return orders


_interleaved_orders = interleaved_orders  # the old private name (branches written against it)
