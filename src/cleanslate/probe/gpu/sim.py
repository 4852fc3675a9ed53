"""Placeholder: being written in this session."""

from __future__ import annotations
