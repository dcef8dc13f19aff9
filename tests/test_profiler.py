"""Profiler: a tiny torch model measured into a placement that schedules validly."""
from __future__ import annotations

import pytest

pytest.importorskip("torch")
import torch
from torch import nn

from tessel import library
from tessel.builder import Stage, build_stages
from tessel.placement import PlacementError
from tessel.runtime.profiler import MIB, _Run, profile, saved_bytes
from tessel.timing import schedule_from_orders

pytestmark = pytest.mark.torch

B, H, F = 32, 64, 256


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(H, F), nn.GELU(), nn.Linear(F, H))


# Linear saves its input (B x H), GELU its input (B x F), the second Linear its input (B x F), fp32
MLP_ACTIVATION = 4 * (B * H + 2 * B * F)


class Join(nn.Module):
    """A fusion block: two inputs in, one out."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(2 * H, H)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.proj(torch.cat([a, b], dim=-1))


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def chain(devices: int, split: bool = False):
    stages = [Stage(f"s{i}", (i,), 1, 2, 1 if split else 0, memory=1) for i in range(devices)]
    return build_stages("mlp", devices, stages, [(f"s{i}", f"s{i + 1}") for i in range(devices - 1)],
                        split_weight=split)


def gpipe(p, n):
    return [[(b.id, m) for m in range(n) for b in p.blocks_on(d) if b.kind == "forward"]
            + [(b.id, m) for m in range(n) for b in p.blocks_on(d) if b.kind != "forward"]
            for d in range(p.devices)]


def test_saved_bytes_counts_activations_not_parameters():
    torch.manual_seed(0)
    x = torch.randn(B, H, requires_grad=True)
    _, saved = saved_bytes(mlp(), (x,))
    assert saved == MLP_ACTIVATION


def test_profiled_chain_is_a_valid_placement_in_ms_and_mib():
    torch.manual_seed(0)
    p = chain(4)
    prof = profile(p, {f"s{i}.f": mlp() for i in range(4)}, (torch.randn(B, H),), repeats=3, warmup=1,
                   bandwidth=1e9, alpha=1e-5)
    q = prof.placement
    assert [b.id for b in q.blocks] == [b.id for b in p.blocks] and q.edges == p.edges
    assert all(b.duration > 0 for b in q.blocks)
    for b in q.blocks:
        want = round(MLP_ACTIVATION / MIB, 3)
        assert b.memory == (want if b.kind == "forward" else -want)
    for d in range(4):
        assert sum(b.memory for b in q.blocks_on(d)) == 0
    # the largest message is one B x H fp32 output
    assert q.latency == pytest.approx((4 * B * H / 1e9 + 1e-5) * 1e3)
    s = schedule_from_orders(q, 4, gpipe(q, 4))
    assert s.errors() == []
    assert s.peak_memory[0] == pytest.approx(4 * round(MLP_ACTIVATION / MIB, 3))
    end_levels = [sum(delta for _, delta in s.memory_events(d)) for d in range(4)]
    assert end_levels == pytest.approx([0, 0, 0, 0])


def test_split_backward_measures_input_and_weight_gradients():
    torch.manual_seed(0)
    p = chain(2, split=True)
    prof = profile(p, {"s0.f": mlp(), "s1.f": mlp()}, (torch.randn(B, H),), repeats=2, warmup=1)
    q = prof.placement
    assert q.by_id["s1.b"].memory == 0 and q.by_id["s1.w"].memory == -q.by_id["s1.f"].memory
    assert q.by_id["s1.b"].duration > 0 and q.by_id["s1.w"].duration > 0
    m = {b.block: b for b in prof.blocks}["s1.f"]
    assert m.input_grad_ms > 0 and m.backward_ms > 0  # both measured; which is longer is noise on CPU


def test_input_gradient_pass_leaves_weights_alone_and_the_backward_fills_them():
    """B (timed as W's complement) computes input gradients only; the whole backward fills weight grads."""
    torch.manual_seed(0)
    module, x = mlp(), torch.randn(B, H)
    run = _Run(module, (x,), True, torch.device("cpu"), warmup=0, repeats=1)
    seen: list[torch.Tensor] = []
    module.register_full_backward_hook(lambda _m, grad_in, _out: seen.extend(g for g in grad_in if g is not None))
    run.input_grad_ms()
    assert [tuple(g.shape) for g in seen] == [(B, H)]  # the input's gradient was computed
    assert all(p.grad is None for p in module.parameters())
    run.backward_ms()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())


def test_join_block_takes_its_predecessors_outputs_and_inference_keeps_nothing():
    torch.manual_seed(0)
    p = library.kshape(4).inference()
    mods = {"f0": mlp(), "f1": mlp(), "f2": mlp(), "f3": mlp(), "fA0": Join()}
    prof = profile(p, mods, (torch.randn(B, H),), repeats=2, warmup=0, bandwidth=1e8)
    q = prof.placement
    assert all(b.memory == 0 for b in q.blocks) and not q.is_training
    join = {b.block: b for b in prof.blocks}["fA0"]
    assert join.output_bytes == 4 * B * H
    assert q.latency > 0


def test_a_block_on_several_devices_is_spread_over_them():
    torch.manual_seed(0)
    p = build_stages("wide", 2, [Stage("w", (0, 1), 1, 1, memory=1)], [])
    whole = profile(p, {"w.f": mlp()}, (torch.randn(B, H),), repeats=3, warmup=1, sharded_modules=True)
    spread = profile(p, {"w.f": mlp()}, (torch.randn(B, H),), repeats=3, warmup=1)
    assert spread.blocks[0].activation_bytes == whole.blocks[0].activation_bytes // 2


def test_missing_module_and_bad_arguments_are_named():
    p = chain(2)
    with pytest.raises(PlacementError, match="s1.f"):
        profile(p, {"s0.f": mlp()}, (torch.randn(B, H),))
    with pytest.raises(ValueError, match="repeats"):
        profile(p, {"s0.f": mlp(), "s1.f": mlp()}, (torch.randn(B, H),), repeats=0)
    with pytest.raises(ValueError, match="bandwidth"):
        profile(p, {"s0.f": mlp(), "s1.f": mlp()}, (torch.randn(B, H),), bandwidth=0)


def test_cli_profile_writes_a_placement_of_the_example_model(tmp_path, capsys):
    from tessel.cli import main
    from tessel.placement import load_placement
    out = tmp_path / "gpt.json"
    assert main(["profile", "--model", "gpt", "--devices", "4", "--dim", "32", "--ffn", "64", "--seq", "8",
                 "--vocab", "64", "--layers", "1", "--repeats", "2", "--warmup", "1",
                 "--bandwidth", "1e9", "-o", str(out)]) == 0
    p = load_placement(out)
    assert p.name == "mllm-4" and p.devices == 4 and p.latency > 0
    assert all(b.duration > 0 for b in p.blocks)
    assert "fA0" in capsys.readouterr().out
    assert main(["profile", "--model", "kshape", "--placement", "vshape", "-o", str(tmp_path / "x.json")]) == 2


class TwoOut(nn.Module):
    """Returns a dict: the next block reads it as one argument, as the runtime passes it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"h": self.lin(x), "skip": x}


class ReadsDict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(H, H)

    def forward(self, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.lin(d["h"]) + d["skip"]


def test_profile_modules_measures_any_chain_with_a_split_backward():
    from tessel.runtime.profiler import profile_modules
    from tessel.runtime.split import split_sequential
    torch.manual_seed(0)
    blocks = split_sequential(nn.Sequential(mlp(), mlp(), mlp()), 3) | {"s3": TwoOut(), "s4": ReadsDict()}
    prof = profile_modules(blocks, (torch.randn(B, H),), devices=2, split_weight=True, repeats=2, warmup=1)
    p = prof.placement
    assert p.devices == 2 and [b.devices for b in p.blocks if b.kind == "forward"] == [(0,), (1,), (0,), (1,), (0,)]
    assert {b.kind for b in p.blocks} == {"forward", "backward", "weight"}
    assert prof.blocks[0].activation_bytes == MLP_ACTIVATION
    assert prof.blocks[3].output_bytes == 2 * 4 * B * H  # both tensors of the dict
    assert all(b.duration > 0 for b in p.blocks)
    s = schedule_from_orders(p, 2, gpipe(p, 2))
    s.validate()  # raises unless the four rules hold
    assert max(s.peak_memory) > 0
    with pytest.raises(PlacementError, match="5 blocks cannot use 6 devices"):
        profile_modules(blocks, (torch.randn(B, H),), devices=6)


def test_cli_profile_module_imports_the_users_factory(tmp_path, monkeypatch, capsys):
    from tessel.cli import main
    from tessel.placement import load_placement
    (tmp_path / "my_model.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def blocks():\n"
        "    return [nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)], (torch.randn(4, 8),)\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "p.json"
    assert main(["profile", "--module", "my_model:blocks", "--devices", "3", "--repeats", "2", "--warmup", "0",
                 "-o", str(out)]) == 0
    p = load_placement(out)
    assert p.devices == 3 and len([b for b in p.blocks if b.kind == "forward"]) == 3
    assert "s2" in capsys.readouterr().out
    assert main(["profile", "--module", "my_model:nothing", "-o", str(out)]) == 2
    assert "has no attribute 'nothing'" in capsys.readouterr().err


# ---- trust: pinned threads, repeated until the spread is small, warnings with the figure ----------
class Wide(nn.Module):
    """An MLP block of about a millisecond on one thread: long enough to time reproducibly."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _costs(prof) -> dict[str, float]:
    return {b.id: float(b.duration) for b in prof.placement.blocks}


def test_profiling_the_same_blocks_twice_agrees_within_10_percent_or_warns():
    """Each block's share of the step's compute (what the search's choices depend on) agrees within
    10% between two profiles, or a profile warned that its runs stayed spread out: never a silent
    disagreement. (Absolute times move with the machine's load: on 2 shared cores the CPU time of
    the same block moves by 25% and more between minutes, a busy sibling hyper-thread.)"""
    torch.manual_seed(0)
    mods = {f"s{i}.f": Wide() for i in range(2)}
    x = (torch.randn(64, 256),)
    shares, warned = [], False
    for _ in range(2):
        prof = profile(chain(2), mods, x, repeats=10, warmup=3)
        warned = warned or bool(prof.warnings)
        costs = _costs(prof)
        per_block = {s: costs[f"{s}.f"] + costs[f"{s}.b"] for s in ("s0", "s1")}  # forward + backward
        shares.append({b: t / sum(per_block.values()) for b, t in per_block.items()})
    first, second = shares
    agree = all(abs(second[b] - t) <= 0.10 * max(t, second[b]) for b, t in first.items())
    assert agree or warned, (first, second)


def test_threads_are_pinned_while_profiling_and_restored():
    seen = []

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(H, H)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(torch.get_num_threads())
            return self.lin(x)

    torch.set_num_threads(2)
    profile(chain(1), {"s0.f": Probe()}, (torch.randn(B, H),), repeats=2, warmup=0)
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="threads must be >= 1"):
        profile(chain(1), {"s0.f": Probe()}, (torch.randn(B, H),), threads=0)


def test_a_noisy_time_is_repeated_then_warned_about_with_its_spread(caplog):
    import time as clock

    class Jittery(nn.Module):
        """Three forwards in four take 8 ms more: a spread no number of runs narrows."""

        def __init__(self) -> None:
            super().__init__()
            self.lin, self.calls = nn.Linear(H, H), 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if self.calls % 4:
                clock.sleep(0.008)
            return self.lin(x)

    m = Jittery()
    with caplog.at_level("WARNING", logger="tessel.runtime.profiler"):
        prof = profile(build_stages("one", 1, [Stage("s0", (0,), 1, 0, 0, memory=0)], []), {"s0.f": m},
                       (torch.randn(B, H),), repeats=4, warmup=0)
    forward = [w for w in prof.warnings if w.startswith("block s0.f forward")]
    runs = int(forward[0].split("after ")[1].split(" runs")[0])
    assert len(forward) == 1 and runs >= 16, prof.warnings  # 4 x repeats at least, then warned
    spread = int(forward[0].split("still spreads ")[1].split("%")[0])
    assert spread > 10
    assert forward[0] in caplog.text


def test_cli_profile_refuses_more_devices_than_blocks_and_lays_out_a_v(tmp_path, monkeypatch, capsys):
    """4 blocks on 6 devices was written as a 4-device placement with exit 0; now refused, like the
    Python API. `--layout v` puts blocks d and 2p-1-d on device d (torchtitan's ZB-V layout)."""
    from tessel.cli import main
    from tessel.placement import load_placement
    (tmp_path / "four.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def blocks():\n"
        "    return [nn.Linear(8, 8) for _ in range(4)], (torch.randn(4, 8),)\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "p.json"
    assert main(["profile", "--module", "four:blocks", "--devices", "6", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "4 blocks cannot use 6 devices" in err and err.count("\n") == 1 and not out.exists()
    assert main(["profile", "--module", "four:blocks", "--layout", "v", "--repeats", "1", "--warmup", "0",
                 "--split-weight", "-o", str(out)]) == 0
    p = load_placement(out)
    assert p.devices == 2
    assert {b.id: b.devices for b in p.blocks if b.kind == "forward"} == {
        "s0": (0,), "s1": (1,), "s2": (1,), "s3": (0,)}
