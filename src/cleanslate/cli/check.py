"""``cleanslate check`` (being written)."""

from __future__ import annotations
