"""Hostile inputs: how long tessel takes to accept a wide placement or refuse a harmful one.

The issue's cases: blocks without edges (the topological sort used to be quadratic: 10k blocks
8 s, 30k 54 s, 100k > 120 s), a YAML alias bomb (minutes, 2.5 GB), a billion devices (a hang),
a billion micro-batches (MemoryError after 30 s), deeply nested JSON (a traceback). Each row
runs the real command line in a fresh process (interpreter start-up included, which dominates
the refusals) or, for the sort, the library call alone.

    .venv/bin/python bench/hostile.py                     # writes bench/results/hostile.md
    .venv/bin/python bench/hostile.py --shared-machine    # issue 22's cases: bench/results/hostile-run.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tessel.io import atomic_write
from tessel.placement import Block, make_placement

ROOT = Path(__file__).resolve().parents[1]


def sort_rows() -> list[str]:
    out = []
    for n in (10_000, 30_000, 100_000):
        blocks = [Block(f"b{i}", "forward", 1, 0, (i % 4,)) for i in range(n)]
        t0 = time.perf_counter()
        p = make_placement("wide", 4, blocks, [])
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        order = p.topo_sorted(lambda b: 0)
        sort = time.perf_counter() - t0
        assert len(order) == n
        out.append(f"| {n:,} blocks, no edges | validate {built:.3f} s, topological sort {sort:.3f} s | ok |")
    return out


def _alias_bomb() -> str:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(12):
        x, y = chr(98 + i), chr(97 + i)
        lines.append(f"{x}: &{x} [*{y}, *{y}, *{y}, *{y}]")
    return "\n".join(lines) + "\n"


def cli_rows(tmp: Path) -> list[str]:
    (tmp / "bomb.yaml").write_text(_alias_bomb())
    (tmp / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp / "devices.json").write_text(json.dumps({"devices": 10**9, "blocks": [], "edges": []}))
    cases = [("YAML alias bomb (572 bytes)", ["show", "bomb.yaml"]),
             ("JSON nested 100,000 deep", ["show", "deep.json"]),
             ('"devices": 1000000000', ["show", "devices.json"]),
             ("-n 1000000000", ["search", "vshape", "-n", "1000000000"]),
             ("baseline, 2,000 micro-batches (16,000 tasks)", ["baseline", "1f1b", "vshape", "-n", "2000"])]
    return [_run(name, argv, tmp) for name, argv in cases]


def _chain(n: int, devices: int = 8) -> str:
    """A training chain of n blocks (n/2 forwards down the devices, their backwards back up)."""
    half = n // 2
    blocks = [{"id": f"f{i}", "kind": "forward", "duration": 1, "memory": 1, "devices": [i * devices // half]}
              for i in range(half)]
    blocks += [{"id": f"b{i}", "kind": "backward", "duration": 2, "memory": -1, "grad_of": f"f{i}",
                "devices": [i * devices // half]} for i in range(half)]
    edges = [[f"f{i}", f"f{i + 1}"] for i in range(half - 1)] + [[f"f{half - 1}", f"b{half - 1}"]]
    edges += [[f"b{i + 1}", f"b{i}"] for i in range(half - 1)]
    return json.dumps({"name": f"chain-{n}", "devices": devices, "blocks": blocks, "edges": edges})


def wall_clock_rows(tmp: Path) -> list[str]:
    """`--time-limit` is a wall clock for the whole command (issue: fast ran 8 s at a 5 s limit on
    1,000 blocks and > 150 s on 5,000)."""
    out = []
    for n in (1_000, 5_000):
        (tmp / f"chain{n}.json").write_text(_chain(n))
        for mode in ("fast", "tessel", "exact"):
            argv = ["search", f"chain{n}.json", "-n", "16", "--mode", mode, "--time-limit", "5"]
            out.append(_run(f"{n:,}-block chain, --mode {mode} --time-limit 5", argv, tmp))
    # tests/test_search.py's time-limited case: its wall clock is a figure here, not a test's assertion
    argv = ["search", "xshape", "--devices", "8", "-n", "32", "--memory", "20", "--time-limit", "0.3"]
    out.append(_run("xshape, 8 devices, -n 32, --time-limit 0.3", argv, tmp))
    return out


# ---- issue 22: `tessel run` on a shared machine (results, processes, outputs, terminal text) ----
# (name, argv, expected exit code, most seconds); the store attacks need a second process on the
# job's port: tests/test_run_store_attacks.py
LONG = "a" * 256
SHARED_MACHINE_CASES: list[tuple[str, list[str], int, float]] = [
    ("-o x.json --trace x.json", ["baseline", "1f1b", "vshape", "-n", "4", "-o", "x.json", "--trace", "x.json"], 2, 10),
    ("-o with a 256-character name", ["baseline", "1f1b", "vshape", "-n", "4", "-o", LONG + ".json"], 2, 10),
    ("-o the command's own input", ["baseline", "1f1b", "p.json", "-n", "4", "-o", "p.json"], 2, 10),
    ("plan --placement-out in a missing directory", ["plan", "gpt", "--devices", "4", "--placement-out",
                                                      "no/p.json"], 2, 10),
    ("run --devices 4096", ["run", "--model", "mlp", "--devices", "4096"], 2, 10),
    ("run --data-parallel 1000", ["run", "--model", "mlp", "--devices", "2", "--data-parallel", "1000"], 2, 10),
    ("run --programs -n 600000 (a schedule file)", ["run", "--model", "mlp", "--schedule", "s.json", "-n", "600000",
                                                    "--programs"], 2, 10),
    ("run --lr 1e6 --check (NaN on both sides by step 3)", ["run", "--model", "mlp", "--placement", "vshape", "--devices", "2",
                                                  "-n", "2", "--steps", "3", "--schedule", "1f1b", "--lr", "1e6",
                                                  "--check"], 1, 120),
    ("search --workers 100000", ["search", "vshape", "-n", "4", "--workers", "100000"], 2, 10),
    ("check, a task twice, 2 micro-batches", ["check", "dup2.json"], 1, 10),
    ("check, a task twice, 64 micro-batches", ["check", "dup64.json"], 1, 10),
    ("show, a newline and escapes in meta.method", ["show", "meta.json"], 0, 10),
]


def shared_machine_rows(tmp: Path) -> list[str]:
    """Each issue-22 case: its exit code and seconds against the expected ones."""
    from tessel import library
    from tessel.methods import run_method
    library.build("vshape", 2).save(tmp / "p.json")
    run_method("1f1b", library.build("vshape", 2), 4).save(tmp / "s.json")
    for n in (2, 64):
        doc = run_method("1f1b", library.build("vshape", 2), n).to_dict()
        doc["tasks"].append(doc["tasks"][0])
        (tmp / f"dup{n}.json").write_text(json.dumps(doc))
    doc = run_method("1f1b", library.build("vshape", 2), 2).to_dict()
    doc["meta"]["method"] = "1f1b\n    makespan: 1\x1b[2J"
    (tmp / "meta.json").write_text(json.dumps(doc))
    out = []
    for name, argv, code, most in SHARED_MACHINE_CASES:
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "tessel", *argv], cwd=tmp, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
        secs = time.perf_counter() - t0
        lines = r.stderr.strip().splitlines()
        first = next((x for x in lines if not x.startswith(("[W", "W1"))), "(no message)")[:90]
        raw = "\x1b" in r.stdout + r.stderr
        verdict = ("ok" if r.returncode == code and secs <= most and not raw else
                   f"UNEXPECTED (want exit {code} within {most:g} s{', no raw escape' if raw else ''})")
        out.append(f"| {name} | {secs:.2f} s, exit {r.returncode} | {first.replace('|', '/')} | {verdict} |")
    return out


# ---- round 3 (issue 21): input reliability. Each case: the command line, extra environment,
# the exit code the README promises and the seconds it may take (its own limit + 2 s for the
# scale cases, a few seconds for refusals: interpreter start-up included). Another developer
# adds the runtime's cases in their own list.
@dataclass(frozen=True)
class Case:
    name: str
    argv: tuple[str, ...]
    code: int
    bound: float
    env: tuple[tuple[str, str], ...] = ()


def _env(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(kw.items())


TORCHRUN = ("run", "--model", "mlp", "--schedule", "s.json")
LISTENER = "{listener}"  # an environment value: the port of a bare TCP listener the bench holds open
RANK2 = {"RANK": "0", "WORLD_SIZE": "2"}
ROUND3_CASES: tuple[Case, ...] = (
    # environment the runtime reads
    Case("RANK=0 WORLD_SIZE=2, no MASTER_ADDR", TORCHRUN, 2, 5, _env(**RANK2)),
    Case("MASTER_PORT=abc", TORCHRUN, 2, 5, _env(**RANK2, MASTER_ADDR="127.0.0.1", MASTER_PORT="abc")),
    Case("MASTER_PORT=99999", TORCHRUN, 2, 5, _env(**RANK2, MASTER_ADDR="127.0.0.1", MASTER_PORT="99999")),
    Case("RANK=abc", TORCHRUN, 2, 5, _env(RANK="abc", WORLD_SIZE="2")),
    Case("RANK=5 WORLD_SIZE=1", TORCHRUN, 2, 5, _env(RANK="5", WORLD_SIZE="1")),
    Case("MASTER_PORT=1, nothing listening", TORCHRUN, 2, 8,
         _env(**RANK2, MASTER_ADDR="127.0.0.1", MASTER_PORT="1")),
    # numeric options
    Case("run --timeout 1e300", (*TORCHRUN, "--timeout", "1e300"), 2, 5),
    Case("run --timeout 1e9", (*TORCHRUN, "--timeout", "1e9"), 2, 5),
    Case("run --timeout 2200000", (*TORCHRUN, "--timeout", "2200000"), 2, 5),
    Case("run --micro-batch-size 1000000000000", (*TORCHRUN, "--micro-batch-size", "1000000000000"), 2, 5),
    Case("plan gpt --devices 4 --memory 1e300", ("plan", "gpt", "--devices", "4", "--memory", "1e300"), 2, 5),
    Case("plan gpt --devices 4 --set hidden=nan", ("plan", "gpt", "--devices", "4", "--set", "hidden=nan"), 2, 5),
    # document text
    Case("show: block id \\ud800", ("show", "surrogate.json"), 2, 5),
    Case("search --plot --trace: block id \\ud800",
         ("search", "surrogate.json", "-n", "2", "--plot", "x.png", "--trace", "x.json"), 2, 5),
    # numbers in range compute in range (latency 1e10 over durations 1e-6: a 10**20-unit grid before)
    *(Case(f"search --latency 1e10, durations 1e-6, --mode {m}",
           ("search", "vshape", "-n", "8", "--forward", "0.000001", "--backward", "0.000003", "--latency", "1e10",
            "--mode", m, "--time-limit", "3"), 0, 5) for m in ("tessel", "fast", "exact")),
    # only regular files; strict YAML
    Case("show FIFO", ("show", "fifo.json"), 2, 5),
    Case("check FIFO", ("check", "fifo.json"), 2, 5),
    Case("YAML duplicate key", ("show", "dup.yaml"), 2, 5),
    Case("YAML merge key <<", ("show", "merge.yaml"), 2, 5),
    Case("YAML sexagesimal 1:30", ("show", "sexagesimal.yaml"), 2, 5),
    # wall clocks and sizes
    Case("plan gpt --devices 4096 --time-limit 20", ("plan", "gpt", "--devices", "4096", "--time-limit", "20"), 0, 22),
    Case("plan gpt --set layers=1000000000 --time-limit 5",
         ("plan", "gpt", "--devices", "4", "--set", "layers=1000000000", "--time-limit", "5"), 2, 7),
    Case("search vshape --devices 4096 -n 64 --time-limit 10",
         ("search", "vshape", "--devices", "4096", "-n", "64", "--time-limit", "10"), 0, 12),
    Case("search vshape --devices 1024 -n 64 --time-limit 5",
         ("search", "vshape", "--devices", "1024", "-n", "64", "--time-limit", "5"), 0, 7),
    Case("baseline 1f1b vshape --devices 4096 -n 64", ("baseline", "1f1b", "vshape", "--devices", "4096", "-n", "64"),
         0, 10),
    Case("run --schedule s.json -n 600000 --programs", (*TORCHRUN, "-n", "600000", "--programs"), 2, 5),
    Case("run -n 10**30 --programs", ("run", "--model", "mlp", "-n", str(10**30), "--programs"), 2, 5),
)

# our own new ones, round 3
OWN_CASES: tuple[Case, ...] = (
    Case("RANK set, WORLD_SIZE not", TORCHRUN, 2, 5, _env(RANK="0")),
    Case("WORLD_SIZE=0", TORCHRUN, 2, 5, _env(RANK="0", WORLD_SIZE="0")),
    Case("LOCAL_RANK=-1", TORCHRUN, 2, 5, _env(**RANK2, LOCAL_RANK="-1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")),
    Case("MASTER_ADDR with a space", TORCHRUN, 2, 5, _env(**RANK2, MASTER_ADDR="a b", MASTER_PORT="29500")),
    Case("run --seed -1", (*TORCHRUN, "--seed", "-1"), 2, 5),
    Case("run --lr nan", (*TORCHRUN, "--lr", "nan"), 2, 5),
    Case("run --steps 10**30", (*TORCHRUN, "--steps", str(10**30)), 2, 5),
    Case("search --time-limit 1e300", ("search", "vshape", "-n", "4", "--time-limit", "1e300"), 2, 5),
    Case("compare --time-limit 1e9", ("compare", "vshape", "-n", "4", "--time-limit", "1e9"), 2, 5),
    Case("plan --set lm_head=3", ("plan", "gpt", "--devices", "4", "--set", "lm_head=3"), 2, 5),
    Case("plan --set hidden=1e300", ("plan", "gpt", "--devices", "4", "--set", "hidden=1e300"), 2, 5),
    Case("search --latency 1e12 (horizon past 1e12)", ("search", "vshape", "-n", "8", "--latency", "1e12"), 2, 5),
    Case("show a directory", ("show", "dir.json"), 2, 5),
    Case("show /dev/zero", ("show", "/dev/zero"), 2, 5),
    Case("YAML yes as a boolean", ("show", "yes.yaml"), 2, 5),
    Case("YAML 0x1f as an integer", ("show", "hex.yaml"), 2, 5),
    Case("YAML date as a name", ("show", "date.yaml"), 2, 5),
    Case("JSON key \\udc80", ("show", "surrogate-key.json"), 2, 5),
    Case("check: schedule with block id \\ud800", ("check", "surrogate-schedule.json"), 2, 5),
    # round 4: a listener that accepts but is no torch store (as 0.0.0.0/8 is in some sandboxes)
    Case("MASTER_ADDR:MASTER_PORT a bare TCP listener", TORCHRUN, 2, 8,
         _env(**RANK2, MASTER_ADDR="127.0.0.1", MASTER_PORT=LISTENER)),
    Case("MASTER_ADDR=0.0.0.7 (0.0.0.0/8)", TORCHRUN, 2, 8, _env(**RANK2, MASTER_ADDR="0.0.0.7", MASTER_PORT="29500")),
    # round 4: 4,096 devices where no baseline fits the memory: the search's own schedule, cut short
    Case("search vshape --devices 4096 -n 64 --memory 40 --time-limit 10",
         ("search", "vshape", "--devices", "4096", "-n", "64", "--memory", "40", "--time-limit", "10"), 0, 12),
    # round 5 (issue 21, closing): no baseline fits at 1,024 devices either; every mode keeps its clock
    *(Case(f"search vshape --devices 1024 -n 64 --memory 40 --time-limit 5 --mode {m}",
           ("search", "vshape", "--devices", "1024", "-n", "64", "--memory", "40", "--time-limit", "5", "--mode", m),
           0, 7) for m in ("tessel", "fast", "exact")),
    Case("compare vshape --devices 1024 -n 64 --memory 40 --time-limit 5 --methods exact",
         ("compare", "vshape", "--devices", "1024", "-n", "64", "--memory", "40", "--time-limit", "5", "--methods",
          "exact"), 0, 7),
    Case("memory 1e12, durations 1e-6, --memory 1e12", ("search", "mem1e12.json", "-n", "8", "--memory", "1e12",
                                                        "--time-limit", "3"), 0, 5),
    Case("check: a task of an unknown block", ("check", "unknown-block.json"), 1, 5),
    Case("check: micro_batches 10**30", ("check", "huge-n.json"), 2, 5),
    Case("search -n 0", ("search", "vshape", "-n", "0"), 2, 5),
    Case("simulate --seed -5", ("simulate", "s.json", "--seed", "-5"), 2, 5),
    Case("simulate --trials 1000000000", ("simulate", "s.json", "--trials", "1000000000"), 2, 5),
    Case("simulate --trials 100000 (3.2M task replays)", ("simulate", "s.json", "--noise", "0.1", "--trials", "100000"),
         2, 5),
    Case("simulate --noise 1e300", ("simulate", "s.json", "--noise", "1e300"), 2, 5),
    Case("simulate --noise 5 (draws under 1e-6)", ("simulate", "s.json", "--noise", "5", "--trials", "3"), 0, 10),
    Case("block id with a bidi override U+202E (shown escaped)", ("show", "bidi.json"), 0, 5),
    Case("search: block id with a bidi override, --ascii", ("search", "bidi.json", "-n", "2", "--ascii",
                                                           "--time-limit", "2"), 0, 5),
    Case("a symlink loop as the placement", ("show", "loop1.json"), 2, 5),
    Case("a 2 GB sparse file", ("show", "sparse.json"), 2, 5),
    Case("YAML .nan as a duration", ("show", "nan.yaml"), 2, 5),
    Case("JSON integer of 5,000 digits", ("show", "bigint.json"), 2, 5),
    Case("JSON with a UTF-8 byte-order mark", ("show", "bom.json"), 2, 5),
    Case("an empty file", ("show", "empty.json"), 2, 5),
    Case("-o /dev/full", ("baseline", "1f1b", "vshape", "-n", "4", "-o", "/dev/full"), 2, 5),
)


def _round3_files(tmp: Path) -> None:
    one = "name: y\ndevices: 1\nblocks:\n  - id: a\n    kind: forward\n    duration: %s\n    devices: [0]\n"
    (tmp / "surrogate.json").write_text('{"devices":1,"blocks":[{"id":"\\ud800","kind":"forward","duration":1,'
                                        '"devices":[0]}],"edges":[]}')
    (tmp / "surrogate-key.json").write_text('{"devices":1,"\\udc80":1,"blocks":[{"id":"a","kind":"forward",'
                                            '"duration":1,"devices":[0]}],"edges":[]}')
    (tmp / "surrogate-schedule.json").write_text(
        '{"version":1,"micro_batches":1,"placement":{"devices":1,"blocks":[{"id":"\\ud800","kind":"forward",'
        '"duration":1,"devices":[0]}],"edges":[]},"tasks":[{"block":"\\ud800","micro_batch":0,"start":0}]}')
    (tmp / "dup.yaml").write_text("name: y\ndevices: 1\ndevices: 2\nblocks: []\n")
    (tmp / "merge.yaml").write_text("name: y\nbase: {devices: 1}\nplacement:\n  <<: {devices: 1}\nblocks: []\n")
    (tmp / "sexagesimal.yaml").write_text(one % "1:30")
    (tmp / "yes.yaml").write_text("name: yes\ndevices: 1\nblocks: []\n")
    (tmp / "hex.yaml").write_text(one % "0x1f")
    (tmp / "date.yaml").write_text("name: 2001-12-14\ndevices: 1\nblocks: []\n")
    os.mkfifo(tmp / "fifo.json")
    (tmp / "dir.json").mkdir()
    subprocess.run([sys.executable, "-m", "tessel", "baseline", "1f1b", "vshape", "-n", "4", "-o", "s.json"],
                   cwd=tmp, env=_environ(), check=True, capture_output=True)
    _round5_files(tmp)


def _round5_files(tmp: Path) -> None:
    """The closing round's documents: extreme values in range, broken references, odd files."""
    def block(i: str, kind: str, d: float, m: float, dev: int, grad: str | None = None) -> dict[str, object]:
        return {"id": i, "kind": kind, "duration": d, "memory": m, "devices": [dev], **({"grad_of": grad} if grad else {})}
    blocks = [block("f0", "forward", 1e-6, 1e12, 0), block("f1", "forward", 1e-6, 1e12, 1),
              block("b1", "backward", 1e-6, -1e12, 1, "f1"), block("b0", "backward", 1e-6, -1e12, 0, "f0")]
    (tmp / "mem1e12.json").write_text(json.dumps({"name": "huge-memory", "devices": 2, "blocks": blocks,
                                                  "edges": [["f0", "f1"], ["f1", "b1"], ["b1", "b0"]]}))
    s = json.loads((tmp / "s.json").read_text())
    s["tasks"][0]["block"] = "nope"
    (tmp / "unknown-block.json").write_text(json.dumps(s))
    s = json.loads((tmp / "s.json").read_text())
    s["micro_batches"] = 10**30
    (tmp / "huge-n.json").write_text(json.dumps(s))
    one = {"devices": 1, "blocks": [{"id": "a\u202eevil", "kind": "forward", "duration": 1, "devices": [0]}],
           "edges": []}
    (tmp / "bidi.json").write_text(json.dumps(one))
    (tmp / "bom.json").write_text("\ufeff" + json.dumps(one))
    (tmp / "empty.json").write_text("")
    (tmp / "bigint.json").write_text('{"devices":1' + "0" * 5000 + ',"blocks":[],"edges":[]}')
    (tmp / "nan.yaml").write_text("name: n\ndevices: 1\nblocks:\n  - id: a\n    kind: forward\n    duration: .nan\n"
                                  "    devices: [0]\n")
    os.symlink("loop2.json", tmp / "loop1.json")
    os.symlink("loop1.json", tmp / "loop2.json")
    with open(tmp / "sparse.json", "wb") as f:
        f.truncate(2 * 2**30)  # 2 GB of nothing on disk


def round3_rows(tmp: Path, cases: tuple[Case, ...]) -> tuple[list[str], int]:
    _round3_files(tmp)
    rows, failed = [], 0
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = str(listener.getsockname()[1])
        for c in cases:
            row, ok = _round3_row(tmp, c, {k: port if v == LISTENER else v for k, v in c.env})
            rows.append(row)
            failed += not ok
    return rows, failed


def _round3_row(tmp: Path, c: Case, env: dict[str, str]) -> tuple[str, bool]:
    t0, cpu0 = time.perf_counter(), _children_cpu()
    try:
        r = subprocess.run([sys.executable, "-m", "tessel", *c.argv], cwd=tmp, capture_output=True, text=True,
                           env={**_environ(), **env}, timeout=c.bound + 60)
        code, out, err = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired:
        code, out, err = -9, "", "(killed: over the bound + 60 s)"
    secs, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    lines = err.strip().splitlines()
    one_line = code != 2 or (len(lines) == 1 and lines[0].startswith("tessel: error: "))
    ok = code == c.code and secs <= c.bound and one_line and "Traceback" not in err and not _steers(out + err)
    first = (lines or ["(none)"])[0][:100].replace("|", "\\|")
    return (f"| {c.name} | {c.code} | {c.bound:g} | {code} | {secs:.2f} | {cpu:.2f} | {len(lines)} | "
            f"{'ok' if ok else 'FAIL'} | {first} |"), ok


def _steers(text: str) -> bool:
    """Whether output holds characters that steer a terminal (escapes, bidi overrides) raw."""
    return any(not c.isprintable() and c not in "\n\t" for c in text)


def _children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes: on a loaded machine the wall
    clock measures the load, this what the command itself needed."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _environ() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}


def _run(name: str, argv: list[str], tmp: Path) -> str:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tessel", *argv], cwd=tmp, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=300)
    secs = time.perf_counter() - t0
    first = (r.stderr.strip().splitlines() or ["(no message)"])[0][:90]
    return f"| {name} | {secs:.2f} s, exit {r.returncode}, {len(r.stderr.splitlines())} stderr line(s) | {first} |"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(ROOT / "bench" / "results" / "hostile.md"))
    ap.add_argument("--shared-machine", action="store_true",
                    help="the issue-22 cases only, written to bench/results/hostile-run.md")
    ap.add_argument("--round3", action="store_true", help="only round 3's cases (issue 21)")
    ap.add_argument("--match", default="", help="only round 3's cases whose name holds this text")
    args = ap.parse_args()
    if args.shared_machine:
        with tempfile.TemporaryDirectory() as d:
            shared = shared_machine_rows(Path(d))
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        text = "\n".join([f"# `tessel run` on a shared machine, issue 22 ({platform.machine()}, {os.cpu_count()} CPUs, "
                          f"load average {load})", "", "| input | time, outcome | message | expected |",
                          "|---|---|---|---|", *shared, ""])
        print(text)
        atomic_write(ROOT / "bench" / "results" / "hostile-run.md", text)
        return
    load0 = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory() as d:
        rows = [] if args.round3 else sort_rows() + cli_rows(Path(d)) + wall_clock_rows(Path(d))
    with tempfile.TemporaryDirectory() as d:
        chosen = tuple(c for c in ROUND3_CASES + OWN_CASES if args.match in c.name)
        r3, failed = round3_rows(Path(d), chosen)
    shared: list[str] = []
    if not args.round3:
        with tempfile.TemporaryDirectory() as d:
            shared = shared_machine_rows(Path(d))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    head = [f"# Hostile inputs ({platform.machine()}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average {load0} at the start, {load} at the end)", ""]
    if rows:
        head += ["| input | time, outcome | message |", "|---|---|---|", *rows, ""]
    text = "\n".join([*head, "## Round 3 (issue 21): every case with its promised exit code and time bound", "",
                      f"{len(chosen) - failed} of {len(chosen)} cases as promised (exit code, one line for exit 2, "
                      "no raw terminal-steering characters in the output, "
                      "within the bound; interpreter start-up included). The bound is on the wall clock; on a "
                      "loaded machine (the load average above) the CPU seconds say what the command itself "
                      "needed.", "",
                      "| case | expected exit | bound s | exit | wall s | CPU s | stderr lines | verdict | "
                      "first stderr line |", "|---|---|---|---|---|---|---|---|---|", *r3, "",
                      *(["## `tessel run` on a shared machine (issue 22)", "",
                         "| input | time, outcome | message | expected |", "|---|---|---|---|", *shared, ""]
                        if shared else [])])
    print(text)
    atomic_write(args.output, text)


if __name__ == "__main__":
    main()
