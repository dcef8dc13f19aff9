"""The passes of a search, each one job over the one `State` (state.py), in the order
orchestrate.py lists them per mode:

race.py      the applicable baselines on the real placement: the schedules to beat
start.py     a repetend that fits memory (a construction, one micro-batch at a time, or a solve)
period.py    the repetend: tessel's period search and its retry; fast's construction and polish
complete.py  warm-up and cool-down around the repetend, the deepest repetend at its period
shapes.py    a construction at the repetend's period, completed when a quick completion prefers it
rounds.py    a looped placement's grouped repetends (p micro-batches a period), unrolled and completed
rivals.py    the best baseline on the grid, completed, when it beats our own
whole.py     for few tasks, one solve of the whole problem hinted by the best so far; mode exact
orders.py    the best schedule's orders polished on the real durations (search/polish.py)
final.py     real-time compaction, the raced baselines, and the report

A pass is `run(state, clock)`: it reads the state, spends at most `clock` (its share of the
search's clock, Budget), and replaces state.best only by a better schedule. Adding a phase (a
new construction, a new polish) is adding a pass here and a line to orchestrate.py's lists.
"""
