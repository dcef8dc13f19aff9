"""What the CLI and the charts offer comes from the registries: a new method shows up unasked."""
from __future__ import annotations

from tessel.baselines import BASELINES
from tessel.methods import METHODS
from tessel.search import MODES
from tessel.viz.compare import BOUND_COLOR, OTHER_COLOR, method_color


def test_baseline_and_compare_help_list_every_registered_method(tessel) -> None:
    rc, out, _ = tessel("baseline", "--help")
    assert rc == 0
    text = " ".join(out.split()).replace("- ", "-")  # argparse wraps lines at a name's hyphen
    assert all(name in text for name in BASELINES)
    rc, out, _ = tessel("compare", "--help")
    text = " ".join(out.split()).replace("- ", "-")
    assert rc == 0 and all(name in text for name in METHODS)


def test_search_help_lists_every_mode(tessel) -> None:
    rc, out, _ = tessel("--help")
    assert rc == 0 and f"modes {', '.join(MODES)}" in " ".join(out.split())


def test_every_method_has_its_own_chart_colour() -> None:
    colours = [method_color(m) for m in METHODS]
    assert len(set(colours)) == len(colours)
    assert OTHER_COLOR not in colours and BOUND_COLOR not in colours
    assert method_color("not-a-method") == OTHER_COLOR
