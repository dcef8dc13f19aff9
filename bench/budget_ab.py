"""Budget variants side by side on the open rows of a peers grid: which share of the clock wins.

Rows come from a bench/vpeers.py cache (--rows FILE.jsonl): every row whose tessel makespan was
above its bound (the rows a budget can change), all those more than --far times the bound, and a
seeded sample of --sample others. Each row is searched once per variant (default mode, the row's
memory, --time-limit seconds), the variants one after the other on the same row so that they see
the same load; --jobs rows run at once. Each variant is a name and the Budget fields it sets, as
JSON (NAME='{"cuts_floor": 15}'); the first is the one the others are compared with. Results are
kept in --store (resumable, as vpeers' --cache) and the table is rendered from it.

    .venv/bin/python bench/budget_ab.py --rows bench/results/peers-v-p4-8.jsonl \\
        floor15='{"cuts_floor": 15}' floor4='{"cuts_floor": 4}' floor0='{"cuts_floor": 0}' \\
        --jobs 2 --store bench/results/cuts-share.jsonl -o bench/results/cuts-share.md
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vpeers import Cache, Config, fmt  # noqa: E402

from tessel.io import atomic_write  # noqa: E402
from tessel.schedule import EPS  # noqa: E402
from tessel.search import Budget, search  # noqa: E402

Variant = tuple[str, dict[str, Any]]


def open_rows(path: str, far: float, sample: int, seed: int) -> list[dict[str, Any]]:
    """The row keys of `path` whose tessel makespan is above the bound: the far ones, then a sample."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if rec["key"]["kind"] == "row" and rec["value"]["tessel"] > rec["value"]["bound"] + EPS:
                rows.append(rec)
    far_rows = [r for r in rows if r["value"]["tessel"] > far * r["value"]["bound"]]
    rest = [r for r in rows if r not in far_rows]
    random.Random(seed).shuffle(rest)
    return [r["key"] for r in far_rows + rest[:sample]]


def ab_key(row: dict[str, Any], name: str, fields: dict[str, Any], limit: float) -> dict[str, Any]:
    """The store's key of one variant's search of one row."""
    return dict(row, kind="ab", variant=name, fields=fields, time_limit=limit)


def stored_rows(path: str | None) -> list[dict[str, Any]]:
    """The row keys of a --store file, each once, in their order there."""
    keys: list[dict[str, Any]] = []
    with open(path or "", encoding="utf-8") as f:
        for line in f:
            k = json.loads(line)["key"]
            row = {x: v for x, v in k.items() if x not in ("variant", "fields")}
            row.update(kind="row")
            if row not in keys:
                keys.append(row)
    return keys


def run_row(args: tuple[dict[str, Any], Sequence[Variant], float]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Every variant on one row, one after the other: (store key, result) each."""
    key, variants, limit = args
    cfg = Config(key["p"], key["m"], key["costs"], key["latency"])
    p = cfg.placement(key["shape"])
    out = []
    for name, fields in variants:
        t0 = time.perf_counter()
        s = search(p, key["m"], memory=list(key["limit"]), time_limit=limit, budget=Budget(**fields))
        out.append((ab_key(key, name, fields, limit),
                    dict(makespan=s.makespan, base=str(s.meta.get("base")), bound=s.meta.get("lower_bound"),
                         seconds=time.perf_counter() - t0)))
    return out


def table(keys: Sequence[dict[str, Any]], variants: Sequence[Variant], store: Cache, limit: float) -> list[str]:
    names = [n for n, _ in variants]
    lines = ["| placement | p | m | costs | latency | memory | bound | " + " | ".join(names) + " |",
             "|" + "---|" * (7 + len(names))]
    for k in keys:
        got = [store.get(ab_key(k, n, f, limit)) for n, f in variants]
        if any(g is None for g in got):
            continue
        bound = got[0]["bound"]
        lines.append("| " + " | ".join([k["shape"], str(k["p"]), str(k["m"]), k["costs"], "yes" if k["latency"] else "0",
                                        k["memory"], fmt(bound)] +
                                       [f"{fmt(g['makespan'])} ({g['makespan'] / bound:.4f})" for g in got]) + " |")
    return lines


def summary(keys: Sequence[dict[str, Any]], variants: Sequence[Variant], store: Cache, limit: float) -> list[str]:
    """Per variant after the first: rows shorter, longer, and the geometric mean of the ratios to the first."""
    out = []
    first = variants[0]
    for name, fields in variants[1:]:
        ratios = []
        for k in keys:
            a = store.get(ab_key(k, *first, limit))
            b = store.get(ab_key(k, name, fields, limit))
            if a and b:
                ratios.append(b["makespan"] / a["makespan"])
        if ratios:
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            out.append(f"- `{name}` against `{first[0]}`: {len(ratios)} rows, shorter on "
                       f"{sum(r < 1 - 1e-9 for r in ratios)}, longer on {sum(r > 1 + 1e-9 for r in ratios)}, "
                       f"geometric mean {geo:.4f}, least {min(ratios):.4f}, most {max(ratios):.4f}")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("variants", nargs="+", help="NAME=JSON of Budget fields; the first is the reference")
    ap.add_argument("--rows", required=True, help="a bench/vpeers.py cache (.jsonl) to take the rows from")
    ap.add_argument("--far", type=float, default=1.05, help="every row above this many times its bound")
    ap.add_argument("--sample", type=int, default=21, help="and this many other rows above their bound")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=1, help="rows at once (one core each)")
    ap.add_argument("--store", default=None, metavar="FILE.jsonl", help="resumable results")
    ap.add_argument("--render", action="store_true",
                    help="no search: the table of the rows already in --store, in their order there")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args(argv)
    variants: list[Variant] = []
    for v in args.variants:
        name, _, text = v.partition("=")
        fields = json.loads(text or "{}")
        Budget(**fields)  # an unknown field fails here, before any search
        variants.append((name, fields))
    store = Cache(args.store)
    keys = stored_rows(args.store) if args.render else open_rows(args.rows, args.far, args.sample, args.seed)
    todo = [] if args.render else [k for k in keys if any(store.get(ab_key(k, n, f, args.time_limit)) is None
                                                          for n, f in variants)]
    t0 = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with multiprocessing.Pool(args.jobs) as pool:
        for results in pool.imap_unordered(run_row, [(k, variants, args.time_limit) for k in todo]):
            for key, value in results:
                store.put(key, value)
            print(f"{results[0][0]['shape']} p={results[0][0]['p']} m={results[0][0]['m']} {results[0][0]['memory']}: "
                  + " ".join(f"{k['variant']}={fmt(v['makespan'])}" for k, v in results), flush=True)
    text = "\n".join([
        "# Budget variants side by side on the open rows of a peers grid", "",
        f"Rows: the open rows of {args.rows} (tessel above its bound), every one above {args.far} x the bound and "
        f"{args.sample} others (seed {args.seed}); each searched once per variant, one after the other, "
        f"{args.time_limit:g} s, default mode, the row's memory; {args.jobs} rows at once. Variants (Budget fields): "
        + "; ".join(f"`{n}` {json.dumps(f)}" for n, f in variants) + ". Cells: makespan (makespan / the search's bound). "
        f"Machine: {platform.machine()}, python {platform.python_version()}, 2 cores shared. "
        f"Rendered {t0} (results kept in {args.store}: a rerun renders them).", "",
        *summary(keys, variants, store, args.time_limit), "",
        *table(keys, variants, store, args.time_limit), ""])
    atomic_write(args.output, text)
    print(text)


if __name__ == "__main__":
    main()
