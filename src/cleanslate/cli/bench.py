"""``cleanslate bench``: the benchmark client (filled in by the bench issue)."""

from __future__ import annotations
