"""tessel's v-mem baseline against the zero-bubble repository's V-Half and V-Min, each under the
peer's own per-device peak, with and without squeezed blocks (tessel.baselines.squeeze), in one run.

The baseline alone, no search: what the search races on V placements where memory is tight. Rows:
`zbv`, p in --p, m in {2p, 3p, 4p}, unit and profiled costs (bench/vpeers.py's), latency 0 or
0.032 / 0.5. Each row: the peer's makespan (its orders timed by tessel.timing), v-mem with its
blocks' own warm-ups only (SQUEEZED emptied) and v-mem as it is, each build's seconds, and the
ratios. Held-out device counts (--p 10 12 14) check what was not tuned on.

    .venv/bin/python bench/vmem.py --zb-repo PATH --p 4 6 8 16 -o bench/results/vmem.md
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vpeers import Config, load, v_greedy  # noqa: E402

from tessel.baselines import BaselineError, run_baseline, vmem  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.placement import Number, Placement  # noqa: E402
from tessel.timing import earliest_starts, order_peak, span  # noqa: E402

log = logging.getLogger("vmem")
PEERS = {"half": "V-Half", "min": "V-Min"}


def build(p: Placement, n: int, limit: list[Number], squeezed: bool) -> tuple[float, float]:
    """v-mem's makespan under `limit` (inf when no block fits) and the build's seconds."""
    keep = vmem.SQUEEZED
    vmem.SQUEEZED = keep if squeezed else ()
    t0 = time.perf_counter()
    try:
        return run_baseline("v-mem", p, n, limit, repetend=False).makespan, time.perf_counter() - t0
    except BaselineError as e:
        log.info("v-mem on %s: %s", p.name, e)
        return math.inf, time.perf_counter() - t0
    finally:
        vmem.SQUEEZED = keep


def rows(mods: dict[str, Any], ps: Sequence[int]) -> list[dict[str, Any]]:
    out = []
    for k in ps:
        for mult in (2, 3, 4):
            for costs in ("unit", "profiled"):
                for lat in (False, True):
                    cfg = Config(k, mult * k, costs, lat)
                    p = cfg.placement("zbv")
                    for kind, name in PEERS.items():
                        o = v_greedy(mods, cfg, kind)
                        limit = [order_peak(p, x) for x in o]
                        plain, plain_s = build(p, cfg.m, limit, squeezed=False)
                        now, now_s = build(p, cfg.m, limit, squeezed=True)
                        out.append(dict(cfg=cfg, peer=name, limit=max(limit), peer_ms=span(p, earliest_starts(p, cfg.m, o)),
                                        plain=plain, now=now, plain_s=plain_s, now_s=now_s))
                        log.info("%s %s: peer %.3f, v-mem %.3f -> %.3f", cfg, name, out[-1]["peer_ms"], plain, now)
    return out


def table(rs: Sequence[dict[str, Any]]) -> list[str]:
    head = ("| p | m | costs | latency | memory of | limit (max) | peer | v-mem, blocks' warm-ups | v-mem | v-mem / peer "
            "| squeezed / not | s before | s |")
    lines = [head, "|" + "---|" * 13]
    for r in rs:
        c = r["cfg"]
        lines.append(f"| {c.p} | {c.m} | {c.costs} | {c.fbwc()[3]:g} | {r['peer']} | {r['limit']:g} | {r['peer_ms']:.3f} "
                     f"| {r['plain']:.3f} | {r['now']:.3f} | {r['now'] / r['peer_ms']:.4f} | {r['now'] / r['plain']:.4f} "
                     f"| {r['plain_s']:.2f} | {r['now_s']:.2f} |")
    return lines


def summary(rs: Sequence[dict[str, Any]]) -> list[str]:
    longer = [r for r in rs if r["now"] > r["peer_ms"] + 1e-9]
    before = [r for r in rs if r["plain"] > r["peer_ms"] + 1e-9]
    worse = [r for r in rs if r["now"] > r["plain"] + 1e-9]
    geo = math.exp(statistics.fmean(math.log(r["now"] / r["plain"]) for r in rs))
    which = ", ".join(f"p = {r['cfg'].p} m = {r['cfg'].m} {r['cfg'].costs} latency {r['cfg'].fbwc()[3]:g} {r['peer']} "
                      f"+{r['now'] / r['peer_ms'] - 1:.2%}" for r in longer) or "none"
    return [f"Rows: {len(rs)}. v-mem longer than the peer: {len(before)} with the blocks' warm-ups only, {len(longer)} "
            f"now ({which}); "
            f"longer than without squeezed blocks: {len(worse)}. Geometric mean now / before: {geo:.4f}. "
            f"Median build seconds {statistics.median(r['plain_s'] for r in rs):.2f} before, "
            f"{statistics.median(r['now_s'] for r in rs):.2f} now (largest {max(r['plain_s'] for r in rs):.2f}, "
            f"{max(r['now_s'] for r in rs):.2f})."]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zb-repo", required=True, help="checkout of the zero-bubble repository")
    ap.add_argument("--p", type=int, nargs="+", default=[4, 6, 8])
    ap.add_argument("-o", "--output", default=str(Path(__file__).resolve().parent / "results" / "vmem.md"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mods = load(args.zb_repo)
    assert mods is not None
    rs = rows(mods, args.p)
    lines = ["# v-mem against V-Half and V-Min under their own memory, squeezed blocks or not", "",
             "The baseline alone (no search), each row built twice in one run: with its blocks' own warm-ups only, "
             "and as it is (squeezed blocks raced too). The peer's own per-device peak is the limit. 2 shared cores.", "",
             *summary(rs), "", *table(rs), "",
             "Reproduce: `.venv/bin/python bench/vmem.py " + " ".join(argv if argv is not None else sys.argv[1:]) + "`"]
    print("\n".join(lines))
    atomic_write(args.output, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
