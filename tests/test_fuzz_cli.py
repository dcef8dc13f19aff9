"""Fuzzed command lines and environments: every option given hostile values (NaN, infinities,
1e300, huge integers, lone surrogates, text where a number goes) and the runtime's environment
variables given hostile text; each attempt ends with exit 0 or one line and exit 2, never a
traceback (exit 1) or a hang. Cheap by construction: every command that could run long is
either refused up front or bounded (few micro-batches, --programs, a short time limit)."""
from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessel.cli import environ
from tessel.cli.environ import MAX_WORLD, TorchrunEnv, check_torchrun_env, wants_torchrun
from tessel.errors import UsageError

HOSTILE = ["nan", "-nan", "inf", "-inf", "0", "-1", "1e300", "-1e300", "1e-300", "abc", "", " ", "1,2",
           "9" * 45, "0x10", "1_000", "\udcff", "\ud800", "1e9", "2200000", "4097", "10**30", "1e12"]
GOOD = {"-n": ["1", "2", "4"], "--devices": ["1", "2", "4"], "--time-limit": ["1", "0.5"], "--memory": ["4", "2,2"],
        "--latency": ["0", "0.5", "1e10"], "--forward": ["1", "1e-6"], "--backward": ["3", "2.5"],
        "--timeout": ["30", "1000000"], "--micro-batch-size": ["1", "65536"], "--seed": ["0", "4294967295"],
        "--steps": ["1"], "--lr": ["0.1", "0"], "--data-parallel": ["1"], "--workers": ["1", "2"],
        "--noise": ["0", "0.1", "5"], "--trials": ["1", "3"], "--cores": ["1", "2.5"]}
SCHEDULE = "{schedule}"  # replaced by a real schedule file (simulate's argument)
COMMANDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # base command line, the options fuzzed on it
    "show": (("show", "vshape"), ("--devices", "--forward", "--backward", "--latency")),
    "search": (("search", "vshape", "--time-limit", "1"),
               ("-n", "--devices", "--memory", "--latency", "--forward", "--time-limit", "--workers")),
    "baseline": (("baseline", "1f1b", "vshape"), ("-n", "--devices", "--memory", "--latency", "--backward")),
    "run": (("run", "--model", "mlp", "--schedule", "1f1b", "--programs"),
            ("-n", "--devices", "--timeout", "--micro-batch-size", "--seed", "--steps", "--lr", "--data-parallel")),
    "plan": (("plan", "gpt", "--devices", "4", "--time-limit", "1"), ("--memory", "--set", "-n")),
    "simulate": (("simulate", SCHEDULE), ("--noise", "--seed", "--trials", "--latency", "--cores")),
    "compare": (("compare", "vshape", "--methods", "1f1b,gpipe,fast", "--time-limit", "1"),
                ("-n", "--devices", "--memory", "--latency", "--time-limit")),
}
ENV_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
ENV_TEXT = st.sampled_from(["0", "1", "2", "-1", "abc", "", " 1", "99999", "65535", "1e3", "\u0661", "\udcff",
                            "127.0.0.1", "a b", "x" * 300, str(MAX_WORLD + 1), "18446744073709551617"])


@st.composite
def command_line(draw: st.DrawFn) -> list[str]:
    name = draw(st.sampled_from(sorted(COMMANDS)))
    base, options = COMMANDS[name]
    argv = list(base)
    if name in ("search", "baseline") and draw(st.booleans()):
        argv += ["-n", "2"]
    for opt in draw(st.lists(st.sampled_from(options), min_size=1, max_size=3, unique=True)):
        if opt == "--set":
            key = draw(st.sampled_from(["hidden", "layers", "lm_head", "recompute", "heads", "nope"]))
            argv += ["--set", f"{key}={draw(st.sampled_from(HOSTILE + ['true', '2', '1000000000']))}"]
        else:
            value = draw(st.sampled_from(HOSTILE + GOOD.get(opt, [])))
            if opt in ("--time-limit", "--trials") and value in ("4097", "1e9", "2200000", "1e12"):
                value = "1" if value == "4097" else value  # a valid long limit would only make the test slow
            argv += [opt, value]
    if name in ("search", "baseline", "compare") and "-n" not in argv:
        argv += ["-n", "2"]
    return argv


@pytest.fixture(scope="module")
def schedule_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tessel import library
    from tessel.baselines import BASELINES
    path = tmp_path_factory.mktemp("fuzz") / "s.json"
    BASELINES["1f1b"](library.vshape(4), 4, None).save(path)
    return str(path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=command_line())
def test_fuzzed_options_never_traceback(argv: list[str], tessel: Any, monkeypatch: pytest.MonkeyPatch,
                                        schedule_file: str) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    rc, out, err = tessel(*(schedule_file if a == SCHEDULE else a for a in argv))
    assert rc in (0, 2), (argv, rc, err[-2000:])
    if rc == 2:
        assert err.count("\n") == 1 and err.startswith("tessel: error: "), (argv, err)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(env=st.dictionaries(st.sampled_from(ENV_NAMES), ENV_TEXT, max_size=5))
def test_fuzzed_environment_never_traceback(env: dict[str, str], tessel: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI under a hostile torchrun environment: refused in one line naming a variable (the
    store probe shortened: nothing listens on port 1)."""
    monkeypatch.setattr(environ, "PROBE_SECONDS", 0.05)
    if "RANK" not in env and "WORLD_SIZE" not in env:
        env = {**env, "RANK": "0"}  # always a torchrun rank: never a local launch here
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    for k, v in env.items():
        if k == "MASTER_PORT" and v.strip().isdigit() and 1 < int(v) <= 65535:
            v = "1"  # never a port something may listen on
        monkeypatch.setenv(k, v.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
    rc, out, err = tessel("run", "--model", "mlp", "--schedule", "1f1b", "-n", "2", "--steps", "1")
    assert rc == 2, (env, rc, err[-2000:])
    assert err.count("\n") == 1 and err.startswith("tessel: error: environment: "), (env, err)
    assert any(name in err for name in ENV_NAMES), err


@settings(max_examples=200, deadline=None)
@given(env=st.dictionaries(st.sampled_from(ENV_NAMES), ENV_TEXT | st.text(max_size=8), max_size=5),
       replicas=st.integers(1, 4))
def test_environment_check_accepts_only_what_torch_can_use(env: dict[str, str], replicas: int) -> None:
    try:
        wanted = wants_torchrun(env)
        got = check_torchrun_env(env, replicas, probe=0) if wanted else None
    except UsageError as e:
        assert str(e).startswith("environment: ") and any(name in str(e) for name in ENV_NAMES)
        assert "\n" not in str(e)
        return
    if got is None:
        assert "RANK" not in env and "WORLD_SIZE" not in env
        return
    assert isinstance(got, TorchrunEnv)
    assert 0 <= got.rank < got.world <= MAX_WORLD and got.world % replicas == 0
    assert 1 <= got.port <= 65535 and got.host == env["MASTER_ADDR"] and got.host.isascii()
    assert got.local_rank is None or 0 <= got.local_rank < got.world
    assert int(env["RANK"]) == got.rank and int(env["WORLD_SIZE"]) == got.world


def test_a_listener_that_is_not_a_store_and_no_listener_are_refused_in_one_line() -> None:
    """A bare TCP listener accepts the connection but never answers a store's ping (as anything in
    0.0.0.0/8 does in some sandboxes): refused within the probe, not waited on forever. A real
    store is accepted: tests/test_runtime_security.py."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        t0 = time.monotonic()
        with pytest.raises(UsageError, match="MASTER_ADDR:MASTER_PORT = 127.0.0.1:.* is not a torch store") as e:
            check_torchrun_env(env, probe=1.0)
        assert time.monotonic() - t0 < 3.0 and "\n" not in str(e.value)
    with pytest.raises(UsageError, match="nothing listens at MASTER_ADDR:MASTER_PORT"):
        check_torchrun_env(env, probe=0.3)



def test_run_against_a_listener_that_is_not_a_store_exits_2_in_one_line(tessel: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`tessel run` as a torchrun rank whose MASTER_ADDR:MASTER_PORT accepts but is no store."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        for k, v in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(server.getsockname()[1])}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setattr(environ, "PROBE_SECONDS", 1.0)
        t0 = time.monotonic()
        rc, out, err = tessel("run", "--model", "mlp", "--schedule", "1f1b", "-n", "2", "--steps", "1")
    assert rc == 2 and err.count("\n") == 1, err[-2000:]
    assert "MASTER_ADDR:MASTER_PORT" in err and "is not a torch store" in err
    assert time.monotonic() - t0 < 10
