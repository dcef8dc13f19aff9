"""V and interleaved generators against tessel: issue 17's peers grid, side by side in one run.

Peers, each run from its own code and timed here by tessel.timing on the tessel placement of its
shape (orders mapped block for block, checked by the four validity rules):
- torch.distributed.pipelining: ScheduleZBVZeroBubble and ScheduleDualPipeV on `zbv`,
  ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble on `interleaved-zb` (2 chunks per
  device; Interleaved1F1B runs each W right after its B), via tessel.baselines.torch_orders;
- the zero-bubble repository (github.com/sail-sg/zero-bubble-pipeline-parallelism, --zb-repo):
  ZB-V (zbv.py), V-Half and V-Min (zbv_greedy.py), its automatic V scheduler (v_auto_schedule.py)
  on `zbv`; its automatic scheduler (zb.py) on `zb` under 1 M_B and 2 M_B, the memory of ZB-H1 and
  ZB-H2 (`zb-auto M_B` and `zb-auto 2M_B`).

Costs: unit (F = B = W = 1) or profiled (F/B/W = 1.0/0.976/0.504 per stage, the ZB repository's
profile); latency 0 or 0.032 (profiled) / 0.5 (unit). On `zbv` and `interleaved-zb` a chunk has half
a stage's costs. Memory rows: each peer's own per-device peak (the peers that fit it compete), and
1F1B's (M_B: p stage activations; 2p chunks). Each row: `tessel` (default mode, every raced
baseline: tessel's own dualpipev, interleaved-zb-h1 and zero-bubble family included, torch's orders
not; the best of them polished when it beats the search's own), `alone`
(Budget(race=False): the repetend, completion and polish only), the best peer under the row's
memory, and who won; with --starts, `started`: tessel given every peer's schedule that fits the row
as a start (`tessel search --start FILE`, tessel/search/warm.py: raced and polished like a baseline). The full grid of the issue (p in {4, 6, 8, 16}, m in {2p, 3p, 4p}, 20 s):

    .venv/bin/python bench/vpeers.py --zb-repo PATH --p 4 6 8 16 --time-limit 20 -o bench/results/peers-v-full.md

In pieces across sessions (--cache: each finished row is appended to the file with its inputs, a
rerun skips the rows already there and renders the table from them; same file, any subset of the grid):

    .venv/bin/python bench/vpeers.py --zb-repo PATH --p 16 --m 2 --time-limit 20 --cache p16.jsonl -o /tmp/p16.md
    .venv/bin/python bench/vpeers.py --zb-repo PATH --p 16 --time-limit 20 --cache p16.jsonl -o bench/results/peers-v-p16.md

A subset (what fits a shared machine):

    .venv/bin/python bench/vpeers.py --zb-repo PATH --p 4 --time-limit 5 -o bench/results/peers-v.md
    .venv/bin/python bench/vpeers.py --zb-repo PATH --p 6 --time-limit 5 -o bench/results/peers-v-p6.md
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import io
import itertools
import json
import logging
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import PROFILED, load_peer  # noqa: E402  (bench/peers.py: the ZB repository's loader)

from tessel import library  # noqa: E402
from tessel.baselines import BaselineError, run_baseline  # noqa: E402
from tessel.io import atomic_write  # noqa: E402
from tessel.key import Key  # noqa: E402
from tessel.placement import Number, Placement  # noqa: E402
from tessel.schedule import EPS, Schedule, ScheduleError  # noqa: E402
from tessel.search import Budget, search  # noqa: E402
from tessel.timing import earliest_starts, settled  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("vpeers")
Orders = list[list[Key]]


@dataclass(frozen=True)
class Config:
    p: int
    m: int
    costs: str  # unit or profiled
    latency: bool

    def fbwc(self) -> tuple[float, float, float, float]:
        if self.costs == "unit":
            f, b, w, c = 1.0, 1.0, 1.0, 0.5
        else:
            f, b, w, c = (round(x / PROFILED[0], 3) for x in PROFILED)
        return f, b, w, (c if self.latency else 0.0)

    def chunk(self) -> tuple[float, float, float, float]:
        """One chunk's F, B, W (half a stage's) and the latency."""
        f, b, w, c = self.fbwc()
        return f / 2, b / 2, w / 2, c

    def placement(self, shape: str) -> Placement:
        f, b, w, c = self.fbwc()
        if shape == "zb":
            return library.zb(self.p, forward=f, backward=b, weight=w, latency=c)
        build = library.zbv if shape == "zbv" else library.interleaved_zb
        return build(self.p, forward=f / 2, backward=b / 2, weight=w / 2, latency=c)


# ---- the zero-bubble repository's generators: per-device orders of tessel block ids -----------------
def _v_key(s: int, k: int, cat: int, chunk: int, m: int) -> Key:
    """Its V naming on device s: forward chunk 0/1, and B/W chunk 0 = chunk 1's gradient."""
    if cat == 0:
        return (f"f{s}" if chunk == 0 else f"f{2 * k - 1 - s}", m)
    grad = str(s) if chunk == 0 else str(2 * k - 1 - s)
    return ("bw"[cat - 1] + grad, m)


def zb_v(mods: dict[str, Any], cfg: Config, limit: int) -> Orders:
    f, b, w, c = cfg.chunk()
    k, n = cfg.p, cfg.m
    best = None
    for fill_b, fill_f in itertools.product((True, False), repeat=2):
        g = mods["zbv"].PipelineGraph(k, n, f, b, w, c, 1, 0, -1, max_mem=limit)
        sched, _, bubble = g.try_v_schedule(fill_b=fill_b, fill_f=fill_f)
        if best is None or bubble < best[1]:
            best = (sched, bubble)
    assert best is not None
    return [[_v_key(s, k, cat, chunk, mb) for cat, chunk, mb in best[0][s]] for s in range(k)]


def v_greedy(mods: dict[str, Any], cfg: Config, kind: str) -> Orders:
    f, b, w, c = cfg.chunk()
    k, n = cfg.p, cfg.m
    g = mods["zbv_greedy"].PipelineGraph(k, n, kind, f, b, w, c)
    pattern = g.stable_pattern_v_half(k) if kind == "half" else g.stable_pattern_v_min(k)
    _, _, order = g.schedule_from_pattern(pattern, n, [f, f, b, b, w, w], do_reorder=True)
    return [[_v_key(s, k, t // 2, t % 2, mb) for t, mb in order[s]] for s in range(k)]


def v_auto(mods: dict[str, Any], cfg: Config, limit: int) -> Orders:
    f, b, w, c = cfg.chunk()
    k = cfg.p
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its memory-bubble table
        res = mods["v_auto_schedule"].schedule(k, cfg.m, [f, b, w, c], limit)
    # F/b/w are chunk 0's (forward down, its gradient back up), f/B/W chunk 1's
    return [[_v_key(s, k, "FBW".index(node.type), int(node.chunk) if node.type == "F" else 1 - int(node.chunk),
                    node.minibatch) for node in res[s]] for s in range(k)]


def zb_auto(mods: dict[str, Any], cfg: Config, limit: int) -> Orders:
    f, b, w, c = cfg.fbwc()
    k, n = cfg.p, cfg.m
    gc = mods["graph"].GraphConfig(cost_f=[f] * k, cost_b=[b] * k, cost_w=[w] * k, cost_comm=float(c),
                                   mem_f=[1.0] * k, mem_b=[0.0] * k, mem_w=[-1.0] * k,
                                   max_mem=[float(limit)] * k, n_stages=k, n_micro=n)
    graph = mods["zb"].Graph.build_graph(k, n, gc)
    _, _, done = mods["zb"].initial_solution(graph, print_result=False)
    orders = []
    for s in range(k):
        ids = sorted(((kind, mb) for kind in range(3) for mb in range(n)),
                     key=lambda t: done[graph.get_id(t[0], s, t[1])])
        names = (f"f{s}", f"b{k - 1 - s}", f"w{k - 1 - s}")
        orders.append([(names[kind], mb) for kind, mb in ids])
    return orders


def load(repo: str | None) -> dict[str, Any] | None:
    mods = load_peer(repo) if repo else None
    if mods is not None:
        base = "megatron.core.pipeline_parallel.zerobubble.scheduler"
        for name in ("zbv_greedy", "v_auto_schedule"):
            mods[name] = importlib.import_module(f"{base}.{name}")
    return mods


@dataclass(frozen=True)
class Peer:
    name: str
    shape: str
    run: Callable[[dict[str, Any] | None, Config], Orders | Schedule]


def _torch(method: str) -> Callable[[dict[str, Any] | None, Config], Schedule]:
    def run(mods: dict[str, Any] | None, cfg: Config) -> Schedule:
        shape = "zbv" if method in ("torch-zbv", "torch-dualpipev") else "interleaved-zb"
        return run_baseline(method, cfg.placement(shape), cfg.m, None, repetend=False)
    return run


def _need(mods: dict[str, Any] | None) -> dict[str, Any]:
    if mods is None:
        raise BaselineError("the zero-bubble repository was not given (--zb-repo)")
    return mods


PEERS = [
    Peer("torch ZBVZeroBubble", "zbv", _torch("torch-zbv")),
    Peer("torch DualPipeV", "zbv", _torch("torch-dualpipev")),
    Peer("ZB-V", "zbv", lambda mods, cfg: zb_v(_need(mods), cfg, 2 * cfg.p)),
    Peer("V-Half", "zbv", lambda mods, cfg: v_greedy(_need(mods), cfg, "half")),
    Peer("V-Min", "zbv", lambda mods, cfg: v_greedy(_need(mods), cfg, "min")),
    Peer("ZB auto-V", "zbv", lambda mods, cfg: v_auto(_need(mods), cfg, 2 * cfg.p)),
    Peer("torch Interleaved1F1B", "interleaved-zb", _torch("torch-interleaved-1f1b")),
    Peer("torch InterleavedZeroBubble", "interleaved-zb", _torch("torch-interleaved-zb")),
    Peer("ZB auto (M_B, ZB-H1's memory)", "zb", lambda mods, cfg: zb_auto(_need(mods), cfg, cfg.p)),
    Peer("ZB auto (2 M_B, ZB-H2's memory)", "zb", lambda mods, cfg: zb_auto(_need(mods), cfg, 2 * cfg.p)),
]


def run_peer(peer: Peer, mods: dict[str, Any] | None, cfg: Config) -> Schedule | str:
    """The peer's schedule on the tessel placement, or why not (`x: reason`)."""
    try:
        out = peer.run(mods, cfg)
        if isinstance(out, Schedule):
            return out
        p = cfg.placement(peer.shape)
        # float dust from snapped starts settled as for tessel's baselines (tessel.dust): the
        # peer's peak is its order's, not one activation more
        return settled(p, cfg.m, earliest_starts(p, cfg.m, out))
    except (BaselineError, ScheduleError, AssertionError, KeyError, ValueError, IndexError, TypeError) as e:
        log.info("%s on %s: %s", peer.name, cfg, e)
        return f"x ({type(e).__name__})"


# ---- the cache: each finished row appended with its inputs key, reused by a rerun -----------------
class Cache:
    """Finished records by their inputs key: a peers record per configuration and placement, a row
    per memory row and time limit. With a path, each record is appended to a JSON-lines file as it
    finishes (one write of one line) and a rerun reads them back instead of running them again, so
    a grid too long for one session runs in pieces; a torn last line (a run killed mid-write) is
    skipped. Without one (the default), it only holds this run's records."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.records: dict[str, Any] = {}
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    try:
                        rec = json.loads(line)
                        self.records[_key(rec["key"])] = rec["value"]
                    except (ValueError, KeyError, TypeError):
                        log.warning("%s line %d: not a record, skipped (a run stopped mid-write?)", path, i)

    def get(self, key: dict[str, Any]) -> Any:
        return self.records.get(_key(key))

    def put(self, key: dict[str, Any], value: Any) -> Any:
        self.records[_key(key)] = value
        if self.path:
            line = json.dumps({"key": key, "value": value}, sort_keys=True) + "\n"
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:  # one write of the whole line: a reader never sees half a record but a torn last one
                os.write(fd, line.encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        return value


def _key(key: dict[str, Any]) -> str:
    return json.dumps(key, sort_keys=True)


# ---- one configuration: every peer, then tessel under each memory row -----------------------------
def one_f_one_b_memory(p: Placement, m: int) -> tuple[Number, ...]:
    # without its repetend: the same orders and peaks, ten times faster at p = 16 (6 builds spared)
    return run_baseline("1f1b", p, m, None, repetend=False).peak_memory


def peer_records(cfg: Config, shape: str, mods: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each peer of `shape`: its makespan and per-device peak, or why not (`error`)."""
    out = []
    for peer in PEERS:
        if peer.shape == shape:
            s = run_peer(peer, mods, cfg)
            out.append(dict(name=peer.name, makespan=s.makespan, peak=list(s.peak_memory)) if isinstance(s, Schedule)
                       else dict(name=peer.name, error=s))
    return out


def started_row(cfg: Config, shape: str, mem: Sequence[Number], limit: float, mods: dict[str, Any] | None) -> dict[str, Any]:
    """Tessel (default mode) given every peer's schedule that fits `mem` as a start (--start)."""
    p = cfg.placement(shape)
    starts = {}
    for peer in PEERS:
        if peer.shape == shape:
            s = run_peer(peer, mods, cfg)
            if isinstance(s, Schedule) and all(a <= b + EPS for a, b in zip(s.peak_memory, mem)):
                starts[peer.name] = s
    t0 = time.perf_counter()
    got = search(p, cfg.m, memory=list(mem), time_limit=limit, starts=starts)
    return dict(started=got.makespan, started_base=str(got.meta.get("base")), started_s=time.perf_counter() - t0)


def search_row(cfg: Config, shape: str, mem: Sequence[Number], limit: float) -> dict[str, Any]:
    """Tessel (default mode) and the search alone under `mem`."""
    p = cfg.placement(shape)
    t0 = time.perf_counter()
    s = search(p, cfg.m, memory=list(mem), time_limit=limit)
    row = dict(tessel=s.makespan, base=str(s.meta.get("base")), tessel_s=time.perf_counter() - t0)
    t0 = time.perf_counter()
    a = search(p, cfg.m, memory=list(mem), time_limit=limit, budget=Budget(race=False))
    return dict(row, alone=a.makespan, alone_s=time.perf_counter() - t0, bound=s.meta.get("lower_bound"))


def rows_of(cfg: Config, mods: dict[str, Any] | None, limit: float, shapes: Sequence[str],
            only: Sequence[str] | None = None, cache: Cache | None = None,
            zb_repo: str | None = None, starts: bool = False) -> list[dict[str, Any]]:
    """The rows of one configuration; with `only`, just the memory rows of those names (1F1B or a peer's);
    with `starts`, tessel given the peers' schedules as starts too (started_row). Records already in
    `cache` are reused, the others run and added to it."""
    cache = cache or Cache()
    out = []
    for shape in shapes:
        where = dict(p=cfg.p, m=cfg.m, costs=cfg.costs, latency=cfg.latency, shape=shape)
        peers_key = dict(where, kind="peers", zb_repo=zb_repo)
        peers = cache.get(peers_key)
        if peers is None:
            peers = cache.put(peers_key, peer_records(cfg, shape, mods))
        good = [r for r in peers if "error" not in r]
        memories: list[tuple[str, list[Number]]] = [("1F1B", list(one_f_one_b_memory(cfg.placement(shape), cfg.m)))]
        for r in good:  # each peer's own per-device peak, once
            if all(r["peak"] != x for _, x in memories):
                memories.append((r["name"], r["peak"]))
        for who, mem in memories:
            if only and who not in only:
                continue
            fit = [r for r in good if all(a <= b + EPS for a, b in zip(r["peak"], mem))]
            best = min(fit, key=lambda r: r["makespan"]) if fit else None
            row_key = dict(where, kind="row", memory=who, limit=mem, time_limit=limit)
            row = found = cache.get(row_key)
            if found is None:
                row = cache.put(row_key, search_row(cfg, shape, mem, limit))
            if starts:
                started = cache.get(dict(row_key, kind="started"))
                if started is None:
                    started = cache.put(dict(row_key, kind="started"), started_row(cfg, shape, mem, limit, mods))
                row = dict(row, **started)
            out.append(dict(row, cfg=cfg, shape=shape, memory=who, limit=mem, peers=peers,
                            best=(best["name"], best["makespan"]) if best else None))
            if found is None:
                print(f"{cfg} {shape} memory {who}: best peer {best['makespan'] if best else '-'} "
                      f"tessel {row['tessel']} alone {row['alone']} started {row.get('started', '-')}", flush=True)
    return out


def fmt(x: Any) -> str:
    if isinstance(x, float):
        return str(int(x)) if abs(x - round(x)) < 1e-9 else f"{x:.3f}"
    return str(x)


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    started = any("started" in r for r in rows)
    head = ["placement", "p", "m", "costs", "latency", "memory", "limit (max/device)", "best peer", "peer makespan",
            "tessel", "won by", "alone", "tessel / peer", "alone / peer", "winner", "bound", "tessel s", "alone s",
            *(["started", "started / peer"] if started else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c: Config = r["cfg"]
        best = r["best"]
        pm = best[1] if best else None
        t, a = r["tessel"], r["alone"]
        winner = "-" if pm is None else ("tessel" if t < pm - EPS else ("tie" if t <= pm + EPS else "**peer**"))
        lines.append("| " + " | ".join(str(x) for x in [
            r["shape"], c.p, c.m, c.costs, fmt(c.fbwc()[3]) if c.latency else "0",
            "1F1B's" if r["memory"] == "1F1B" else f"{r['memory']}'s", fmt(max(r["limit"])),
            best[0] if best else "-", fmt(pm) if pm is not None else "-", fmt(t), r["base"], fmt(a),
            f"{t / pm:.4f}" if pm else "-", f"{a / pm:.4f}" if pm else "-", winner, fmt(r["bound"]),
            f"{r['tessel_s']:.1f}", f"{r['alone_s']:.1f}",
            *([fmt(r.get("started", "-")), f"{r['started'] / pm:.4f}" if pm and "started" in r else "-"] if started else [])]) + " |")
    return lines


def peers_table(results: Sequence[dict[str, Any]]) -> list[str]:
    """Each peer's own makespan and per-device peak, once per configuration and placement."""
    lines = ["| placement | p | m | costs | latency | peer | makespan | peak (max/device) |", "|---|---|---|---|---|---|---|---|"]
    seen = set()
    for r in results:
        c: Config = r["cfg"]
        if (c, r["shape"]) in seen:
            continue
        seen.add((c, r["shape"]))
        for s in r["peers"]:
            ok = "error" not in s
            lines.append(f"| {r['shape']} | {c.p} | {c.m} | {c.costs} | {fmt(c.fbwc()[3]) if c.latency else 0} | "
                         f"{s['name']} | {fmt(s['makespan']) if ok else s['error']} | "
                         f"{fmt(max(s['peak'])) if ok else '-'} |")
    return lines


def write(path: str, args: argparse.Namespace, argv: Sequence[str], results: Sequence[dict[str, Any]], total: int,
          done: int) -> None:
    longer = [r for r in results if r["best"] and r["tessel"] > r["best"][1] + EPS]
    alone_far = [r for r in results if r["best"] and r["alone"] > r["best"][1] * 1.01 + EPS]
    started = [r for r in results if "started" in r]
    started_longer = [r for r in started if r["best"] and r["started"] > r["best"][1] + EPS]
    started_line = (f" Given the peers' schedules that fit as starts (`--starts`: tessel search --start), tessel is longer "
                    f"on {len(started_longer)} of {len(started)} rows." if started else "")
    part = "" if done == total else f" (partial: {done} of {total} configurations)"
    cached = f" Rows kept in {args.cache} (--cache): its seconds are those of the run that found them." if args.cache else ""
    lines = ["# V and interleaved generators against tessel (issue 17's peers grid)", "",
             f"p in {args.p}, m in {{{', '.join(f'{k}p' for k in args.m)}}}, costs {args.costs}, latency {args.latency}, memory rows "
             f"{' '.join(args.memories) if args.memories else 'all'}; tessel default mode and "
             f"the search alone (no baseline raced), {args.time_limit:g} s per search. Peers from their own code: torch "
             f"{_torch_version()}, the zero-bubble repository at {args.zb_repo or '(not given)'}. On `zbv` and "
             "`interleaved-zb` a chunk costs half a stage. Machine: "
             f"{platform.machine()}, python {platform.python_version()}, 2 cores shared with other jobs.{part}{cached}", "",
             f"Rows where tessel is longer than the best peer: {len(longer)} of {len(results)}; rows where the search "
             f"alone is more than 1% above the best peer: {len(alone_far)}.{started_line}", "", *table(results), "",
             "## Each peer on its own", "", *peers_table(results), "",
             "Reproduce: `.venv/bin/python bench/vpeers.py " + " ".join(argv) + "` (--zb-repo: a checkout of the ZB repository)"]
    atomic_write(path, "\n".join(lines) + "\n")


def _torch_version() -> str:
    """Without importing torch (seconds on a loaded machine, for a grid that may need none of it)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "(absent)"


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--zb-repo", default=None, help="checkout of the zero-bubble repository")
    ap.add_argument("--p", type=int, nargs="+", default=[4], help="device counts (the issue: 4 6 8 16)")
    ap.add_argument("--m", type=int, nargs="+", default=[2, 3, 4], help="micro-batches as multiples of p")
    ap.add_argument("--costs", nargs="+", default=["unit", "profiled"], choices=["unit", "profiled"])
    ap.add_argument("--latency", nargs="+", default=["0", "yes"], choices=["0", "yes"])
    ap.add_argument("--shapes", nargs="+", default=["zbv", "interleaved-zb", "zb"])
    ap.add_argument("--memories", nargs="+", default=None,
                    help="only these memory rows: 1F1B or a peer's name, e.g. V-Half V-Min (default: every row)")
    ap.add_argument("--time-limit", type=float, default=20.0, help="seconds per search (the issue: 20)")
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "peers-v.md"))
    ap.add_argument("--starts", action="store_true",
                    help="a third search per row: tessel given every peer's schedule that fits as a start (--start)")
    ap.add_argument("--cache", default=None, metavar="FILE.jsonl",
                    help="resumable: each finished row is appended to FILE, a rerun reuses the rows there "
                         "(the table is rendered from them), so the grid can run in pieces")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    mods = load(args.zb_repo)
    cfgs = [Config(p, k * p, c, lat == "yes") for p in args.p for k in args.m for c in args.costs for lat in args.latency]
    cache = Cache(args.cache)
    results: list[dict[str, Any]] = []
    for i, cfg in enumerate(cfgs):
        results += rows_of(cfg, mods, args.time_limit, args.shapes, args.memories, cache, args.zb_repo, args.starts)
        write(args.output, args, argv, results, len(cfgs), i + 1)  # a partial table survives a timeout


if __name__ == "__main__":
    main()
