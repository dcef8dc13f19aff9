"""Plan: enumerate placements of a model on a cluster, prune by memory and bound, search the
survivors, rank the plans. It chooses; search schedules; runtime runs."""
from .candidates import Candidate, Cluster, candidates
from .inputs import load_model
from .planner import Plan, Row, explain, plan

__all__ = ["Candidate", "Cluster", "Plan", "Row", "candidates", "explain", "load_model", "plan"]
