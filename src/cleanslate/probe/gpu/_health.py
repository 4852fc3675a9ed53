"""Rules shared by the NVML and ``nvidia-smi`` backends: which readings are health problems.

Both backends turn the same facts into the same ``Gpu.health`` strings, so a verdict does not
depend on which backend read the host.
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


def value_health(
    *,
    ecc_uncorrected: int | None,
    retired_pages_pending: bool | None,
    remapped_rows_pending: bool | None,
    remapped_rows_failure: bool | None,
) -> list[str]:
    """Health problems that known values show (unknown values are not problems here: they are
    named in ``unknown_fields`` instead)."""
    problems: list[str] = []
    if ecc_uncorrected:
        problems.append(f"{ecc_uncorrected} uncorrected ECC error(s) since the driver loaded")
    if retired_pages_pending:
        problems.append("page retirement pending: the GPU needs a reset")
    if remapped_rows_pending:
        problems.append("row remapping pending: the GPU needs a reset")
    if remapped_rows_failure:
        problems.append("row remapping failed: the GPU needs service")
    return problems
