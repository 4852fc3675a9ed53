"""The ``nvidia-smi`` backend: parse ``--query-gpu`` and ``--query-compute-apps`` CSV.

The process query asks for no name: ``nvidia-smi`` prints a process's name (its ``argv[0]``)
raw, so a local user's CUDA process whose ``argv[0]`` holds a newline split its row, and the
reading was UNKNOWN for as long as that process ran (a real capture:
``tests/fixtures/forged-process-name-h200x1/``). A GPU process is named from ``/proc`` by the
process table of the same snapshot (its ``comm`` and command line), never by this backend.

It runs through an :class:`~cleanslate.hosts.base.Executor`, so it serves local and remote hosts
alike. The parsers are pure functions of a command's ``(stdout, stderr, exit code)`` and are
tested on real outputs (``tests/fixtures/nvidia-h200x2/``).

Parsing rules:
- columns are found by their header names (``memory.used [MiB]`` is ``memory.used``); output
  without a header (``--format=csv,noheader``) is read with the field list that was asked for;
  values with or without units (``41487 MiB`` / ``41487``) are both read;
- ``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``[GPU requires reset]`` or a value that
  does not parse make that field ``None`` and named in ``Gpu.unknown_fields``, never 0; the ones
  that say the GPU is in trouble (``Unknown Error``, ``GPU is lost``, ``requires reset``) are
  also added to ``Gpu.health``;
- a non-zero exit, a timeout or a row that cannot be read make the reading ``ok=False`` with
  ``nvidia-smi``'s own message in ``error``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cleanslate.hosts.base import CommandResult, Executor
from cleanslate.probe.gpu._health import is_health_message
from cleanslate.probe.gpu.base import GpuBackend, register
from cleanslate.probe.snapshot import Gpu, GpuProcess, GpuReading

NVIDIA_SMI = "nvidia-smi"

#: The ``--query-gpu`` fields this backend asks for, in order.
GPU_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.used",
    "memory.total",
    "memory.reserved",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
)

#: The ``--query-compute-apps`` fields this backend asks for, in order: no ``process_name``
#: (text a process chooses, printed raw: a newline in it breaks the CSV).
APPS_QUERY_FIELDS: tuple[str, ...] = ("gpu_uuid", "pid", "used_memory")

#: Fields that older drivers (or older GPUs) do not know. When ``nvidia-smi`` rejects one of
#: these with ``Field "X" is not a valid field to query.``, the query is repeated without it.
OPTIONAL_GPU_FIELDS: tuple[str, ...] = (
    "memory.reserved",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.pending",
)

#: What each ``Gpu`` attribute is read from.
_GPU_ATTR_FIELD: dict[str, str] = {
    "uuid": "uuid",
    "name": "name",
    "pci_bus_id": "pci.bus_id",
    "memory_used_mib": "memory.used",
    "memory_total_mib": "memory.total",
    "memory_reserved_mib": "memory.reserved",
    "ecc_uncorrected": "ecc.errors.uncorrected.volatile.total",
    "retired_pages_pending": "retired_pages.pending",
    "remapped_rows_pending": "remapped_rows.pending",
    "remapped_rows_failure": "remapped_rows.failure",
}
_INT_ATTRS = frozenset(
    {"memory_used_mib", "memory_total_mib", "memory_reserved_mib", "ecc_uncorrected"}
)
_BOOL_ATTRS = frozenset({"retired_pages_pending", "remapped_rows_pending", "remapped_rows_failure"})

#: Header names ``nvidia-smi`` prints for a field asked under another name.
_HEADER_ALIASES: dict[str, str] = {"used_gpu_memory": "used_memory"}

#: Columns whose free text may itself contain ``", "`` (a process path, a product name).
_TEXT_FIELDS: tuple[str, ...] = ("process_name", "name")

_HEADER_CELL = re.compile(r"^(?P<field>[a-z][a-z0-9_.]*)(?:\s*\[(?P<unit>[^\]]*)\])?$")
_NUMBER_WITH_UNIT = re.compile(r"^(?P<number>\d+)(?:\s+(?P<unit>[A-Za-z%]+))?$")
_REJECTED_FIELD = re.compile(r'Field "(?P<field>[^"]+)" is not a valid field to query')

NOTE_NO_RESERVED = (
    "this driver's nvidia-smi does not know memory.reserved: memory_used_mib includes "
    "driver-reserved memory (about 600 MiB on an idle H200)"
)

#: One command's outcome as the parsers take it: (stdout, stderr, exit status).
CommandOutput = tuple[str, str, int]


class _UnreadableRow(ValueError):
    """A CSV row that cannot be read as a whole (wrong column count, no usable index/pid)."""


@dataclass(frozen=True)
class _Table:
    columns: tuple[str, ...]
    rows: tuple[dict[str, str], ...]


@dataclass(frozen=True)
class GpuQueryResult:
    """What :func:`parse_gpu_query` read. ``error`` is ``None`` when the output was usable;
    ``rejected_field`` names the field ``nvidia-smi`` refused (``Field "X" is not a valid field
    to query.``), if that was the error."""

    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    error: str | None = None
    rejected_field: str | None = None


@dataclass(frozen=True)
class AppsQueryResult:
    """What :func:`parse_apps_query` read: ``(gpu_uuid, process)`` pairs, or an ``error``."""

    processes: tuple[tuple[str, GpuProcess], ...] = ()
    error: str | None = None


def gpu_query_argv(fields: Sequence[str] = GPU_QUERY_FIELDS) -> list[str]:
    """``nvidia-smi --query-gpu=FIELDS --format=csv``: the argv of the GPU query."""
    return [NVIDIA_SMI, f"--query-gpu={','.join(fields)}", "--format=csv"]


def apps_query_argv(fields: Sequence[str] = APPS_QUERY_FIELDS) -> list[str]:
    """``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv``."""
    return [NVIDIA_SMI, f"--query-compute-apps={','.join(fields)}", "--format=csv"]


def tool_message(stdout: str, stderr: str, limit: int = 500) -> str:
    """``nvidia-smi``'s own words about a failure, on one line: it prints most errors on stdout
    (``Field "memory.bogus" is not a valid field to query.``, ``No devices were found``)."""
    lines = [line.strip() for line in (stderr + "\n" + stdout).splitlines() if line.strip()]
    text = " / ".join(lines) if lines else "no output"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _failure(what: str, stdout: str, stderr: str, exit_code: int) -> str:
    return f"`{what}` exited {exit_code}: {tool_message(stdout, stderr)}"


def _split_row(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(", ")]


def _header(cells: list[str]) -> list[str] | None:
    """The field names of a header line, or ``None`` when the line is data."""
    names: list[str] = []
    for cell in cells:
        match = _HEADER_CELL.match(cell)
        if match is None:
            return None
        name = match["field"]
        names.append(_HEADER_ALIASES.get(name, name))
    return names


def _fit(cells: list[str], columns: Sequence[str], line: str) -> dict[str, str]:
    if len(cells) > len(columns):
        # A text column (a process path, a product name) may contain ", " itself: give it the
        # extra cells when there is exactly one such column.
        text_cols = [i for i, col in enumerate(columns) if col in _TEXT_FIELDS]
        if len(text_cols) == 1:
            i = text_cols[0]
            extra = len(cells) - len(columns)
            cells = [*cells[:i], ", ".join(cells[i : i + extra + 1]), *cells[i + extra + 1 :]]
    if len(cells) != len(columns):
        raise _UnreadableRow(
            f"row has {len(cells)} values for {len(columns)} columns: {line.strip()!r}"
        )
    return dict(zip(columns, cells, strict=True))


def _table(stdout: str, fields: Sequence[str]) -> _Table:
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        return _Table(tuple(fields), ())
    header = _header(_split_row(lines[0]))
    if header is not None:
        columns, data = header, lines[1:]
    else:
        columns, data = list(fields), lines
    return _Table(tuple(columns), tuple(_fit(_split_row(line), columns, line) for line in data))


def _special(value: str) -> bool:
    """``[N/A]``, ``[Not Supported]``, ``[Unknown Error]``, ``N/A`` ...: not a value."""
    return (value.startswith("[") and value.endswith("]")) or value in ("N/A", "")


def _int(value: str) -> int | None:
    match = _NUMBER_WITH_UNIT.match(value)
    return int(match["number"]) if match else None


def _bool(value: str) -> bool | None:
    return {"yes": True, "no": False, "enabled": True, "disabled": False}.get(value.lower())


def _gpu_from_row(row: dict[str, str]) -> tuple[Gpu, str | None]:
    raw_index = row.get("index")
    index = _int(raw_index) if raw_index is not None else None
    if index is None:
        raise _UnreadableRow(f"no GPU index in row {', '.join(row.values())!r}")
    values: dict[str, object] = {}
    unknown: list[str] = []
    health: list[str] = []
    for attr, field in _GPU_ATTR_FIELD.items():
        raw = row.get(field)
        parsed: object = None
        if raw is None:
            pass  # not asked for (an older driver rejected it), or not printed
        elif _special(raw):
            if is_health_message(raw):
                health.append(f"{field} reads {raw}")
        elif attr in _INT_ATTRS:
            parsed = _int(raw)
        elif attr in _BOOL_ATTRS:
            parsed = _bool(raw)
        else:
            parsed = raw
        if parsed is None:
            unknown.append(attr)
        values[attr] = parsed
    driver = row.get("driver_version")
    gpu = Gpu.model_validate(
        {
            "index": index,
            **values,
            "health": tuple(health),
            "unknown_fields": tuple(unknown),
            "source": NVIDIA_SMI,
        }
    )
    return gpu, (driver if driver and not _special(driver) else None)


def parse_gpu_query(
    stdout: str, stderr: str, exit_code: int, fields: Sequence[str] = GPU_QUERY_FIELDS
) -> GpuQueryResult:
    """Read the output of ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``.

    ``fields`` is the list that was asked for; it is used only when the output has no header.
    Processes are not filled in here (see :func:`build_reading`).
    """
    what = "nvidia-smi --query-gpu"
    if exit_code != 0:
        rejected = _REJECTED_FIELD.search(stdout + "\n" + stderr)
        return GpuQueryResult(
            error=_failure(what, stdout, stderr, exit_code),
            rejected_field=rejected["field"] if rejected else None,
        )
    try:
        table = _table(stdout, fields)
        parsed = [_gpu_from_row(row) for row in table.rows]
    except _UnreadableRow as exc:
        return GpuQueryResult(error=f"`{what}` printed a row cleanslate cannot read: {exc}")
    if not parsed:
        return GpuQueryResult(
            error=f"`{what}` exited 0 but listed no GPU: {tool_message(stdout, stderr)}"
        )
    drivers = {driver for _, driver in parsed if driver}
    return GpuQueryResult(
        gpus=tuple(gpu for gpu, _ in parsed),
        driver_version=", ".join(sorted(drivers)) if drivers else None,
    )


def parse_apps_query(
    stdout: str, stderr: str, exit_code: int, fields: Sequence[str] = APPS_QUERY_FIELDS
) -> AppsQueryResult:
    """Read ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory
    --format=csv[,noheader][,nounits]``.

    A ``process_name`` column, where a saved output has one (the backend no longer asks for
    it), is read into ``name``: what ``nvidia-smi`` prints, the process's ``argv[0]``, not the
    ``comm`` a process may have renamed itself to. ``used_memory`` of ``[N/A]`` (no
    permission, some container setups) is ``used_mib=None``.
    """
    what = "nvidia-smi --query-compute-apps"
    if exit_code != 0:
        return AppsQueryResult(error=_failure(what, stdout, stderr, exit_code))
    try:
        table = _table(stdout, fields)
        processes: list[tuple[str, GpuProcess]] = []
        for row in table.rows:
            uuid = row.get("gpu_uuid", "")
            pid = _int(row.get("pid", ""))
            if pid is None or _special(uuid):
                raise _UnreadableRow(f"no GPU UUID and PID in row {', '.join(row.values())!r}")
            name = row.get("process_name")
            used = row.get("used_memory")
            processes.append(
                (
                    uuid,
                    GpuProcess(
                        pid=pid,
                        used_mib=_int(used) if used is not None and not _special(used) else None,
                        name=name if name and not _special(name) else None,
                    ),
                )
            )
    except _UnreadableRow as exc:
        return AppsQueryResult(error=f"`{what}` printed a row cleanslate cannot read: {exc}")
    return AppsQueryResult(processes=tuple(processes))


def build_reading(
    gpus: GpuQueryResult,
    apps: AppsQueryResult | None,
    *,
    notes: Sequence[str] = (),
    elapsed_s: float = 0.0,
) -> GpuReading:
    """Combine the two queries into one reading: processes are attached to their GPU by UUID.

    The reading is ``ok=False`` when either query failed (``apps=None`` means the process query
    did not run) or a process names a GPU UUID that the GPU query did not list; the GPUs that
    were read are kept so a report can still show them.
    """
    errors = [e for e in (gpus.error, apps.error if apps else None) if e]
    if apps is None and gpus.error is None:
        errors.append("`nvidia-smi --query-compute-apps` did not run")
    by_uuid: dict[str, list[GpuProcess]] = {}
    for uuid, proc in apps.processes if apps else ():
        by_uuid.setdefault(uuid, []).append(proc)
    known = {gpu.uuid for gpu in gpus.gpus}
    stray = sorted(uuid for uuid in by_uuid if uuid not in known)
    if stray and gpus.error is None:
        errors.append(
            "`nvidia-smi --query-compute-apps` lists processes on GPU(s) the GPU query did not "
            f"list: {', '.join(stray)}"
        )
    attached = tuple(
        gpu.model_copy(update={"processes": tuple(by_uuid.get(gpu.uuid or "", ()))})
        for gpu in gpus.gpus
    )
    return GpuReading(
        backend=NVIDIA_SMI,
        ok=not errors,
        gpus=attached,
        error="; ".join(errors) if errors else None,
        driver_version=gpus.driver_version,
        note="; ".join(notes) if notes else None,
        elapsed_s=elapsed_s,
    )


def reading_from_outputs(
    query: CommandOutput,
    apps: CommandOutput | None,
    *,
    query_fields: Sequence[str] = GPU_QUERY_FIELDS,
    apps_fields: Sequence[str] = APPS_QUERY_FIELDS,
) -> GpuReading:
    """The reading that the two commands' ``(stdout, stderr, exit status)`` give: a pure
    function, for tests and for replaying saved outputs."""
    gpus = parse_gpu_query(*query, fields=query_fields)
    apps_result = parse_apps_query(*apps, fields=apps_fields) if apps is not None else None
    return build_reading(gpus, apps_result)


def _decoded(result: CommandResult) -> CommandOutput:
    return (
        result.stdout.decode(errors="replace"),
        result.stderr.decode(errors="replace"),
        result.returncode if result.returncode is not None else -1,
    )


def _not_run(result: CommandResult, timeout: float) -> str | None:
    """Why a command gave no output to parse (timed out, could not start), or ``None``."""
    cmd = " ".join(result.argv[:2])
    if result.timed_out:
        return f"`{cmd}` did not answer within {timeout:.1f} s"
    if result.returncode is None:
        return f"`{cmd}` could not run: {result.error or 'unknown reason'}"
    return None


@register
class NvidiaSmiBackend(GpuBackend):
    """Reads GPUs by running ``nvidia-smi`` on the executor's host."""

    name = NVIDIA_SMI

    async def read(self, executor: Executor, timeout: float) -> GpuReading:
        """Run, at the same time, and parse::

            nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,driver_version,memory.used,\\
                memory.total,memory.reserved,ecc.errors.uncorrected.volatile.total,\\
                retired_pages.pending,remapped_rows.pending,remapped_rows.failure --format=csv
            nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv

        Both commands share the whole ``timeout`` (they run concurrently); when the driver
        rejects an optional field (``memory.reserved`` on old drivers), the GPU query is run
        again without it in the time that is left, and ``note`` says what that means.
        """
        start = time.monotonic()
        deadline = start + timeout
        fields = list(GPU_QUERY_FIELDS)
        notes: list[str] = []
        gpu_result, apps_result = await asyncio.gather(
            executor.run(gpu_query_argv(fields), timeout=timeout),
            executor.run(apps_query_argv(), timeout=timeout),
        )
        gpu_timeout = timeout
        while True:
            failure = _not_run(gpu_result, gpu_timeout)
            if failure is not None:
                return _failed(failure, start)
            gpus = parse_gpu_query(*_decoded(gpu_result), fields=fields)
            dropped = gpus.rejected_field
            left = deadline - time.monotonic()
            retry = dropped in OPTIONAL_GPU_FIELDS and dropped in fields and left > 0
            if dropped is None or not retry:
                break
            fields.remove(dropped)
            notes.append(
                NOTE_NO_RESERVED
                if dropped == "memory.reserved"
                else f"this driver's nvidia-smi does not know {dropped}: it is unknown"
            )
            gpu_timeout = left
            gpu_result = await executor.run(gpu_query_argv(fields), timeout=left)
        failure = _not_run(apps_result, timeout)
        if failure is not None:
            reading = build_reading(gpus, AppsQueryResult(error=failure), notes=notes)
        else:
            reading = build_reading(gpus, parse_apps_query(*_decoded(apps_result)), notes=notes)
        return reading.model_copy(update={"elapsed_s": time.monotonic() - start})

    @classmethod
    async def usable(cls, executor: Executor) -> bool:
        """Whether ``nvidia-smi`` is on the host's ``PATH`` (``sh -c 'command -v nvidia-smi'``)."""
        result = await executor.run(["sh", "-c", f"command -v {NVIDIA_SMI}"], timeout=5.0)
        return result.ok and bool(result.stdout.strip())


def _failed(error: str, start: float) -> GpuReading:
    return GpuReading(backend=NVIDIA_SMI, ok=False, error=error, elapsed_s=time.monotonic() - start)
