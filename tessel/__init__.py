"""Tessel: search fast, memory-bounded schedules for DNN placements over many devices."""
from .placement import Block, Placement, PlacementError, load_placement, make_placement
from .plan import plan
from .schedule import Repetend, Schedule, ScheduleError, Task
from .search import search

__all__ = ["Block", "Placement", "PlacementError", "Repetend", "Schedule", "ScheduleError", "Task",
           "load_placement", "make_placement", "plan", "search"]
