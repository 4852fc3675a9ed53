"""Shared by the NVML and ``nvidia-smi`` backends: which errors are GPU health problems.

``Gpu.health`` holds what the source itself reported as trouble (``GPU is lost``, ``Unknown
Error``, ``GPU requires reset``). Values that show trouble (uncorrected ECC errors, pending row
remapping) are left in their fields for the verdict to judge against a baseline: they are not
repeated in ``health``.
"""

from __future__ import annotations

#: Words in an error or special value that mean the GPU itself is in trouble (as opposed to a
#: field the GPU or driver simply does not support, like ``[N/A]`` or ``[Not Supported]``).
_HEALTH_WORDS: tuple[str, ...] = (
    "unknown error",
    "gpu is lost",
    "requires reset",
    "requires restart",
    "reset required",
    "corrupted inforom",
)


def is_health_message(text: str) -> bool:
    """Whether an error text or special value (``[Unknown Error]``, ``GPU is lost``, ``[GPU
    requires reset]``) says the GPU is in trouble, not merely that a field is unsupported."""
    lowered = text.lower()
    return any(word in lowered for word in _HEALTH_WORDS)
