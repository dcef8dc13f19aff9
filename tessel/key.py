"""The identity of one task: a block of one micro-batch, as (block id, micro-batch)."""
from __future__ import annotations

Key = tuple[str, int]
