"""The NVML backend: read this machine's GPUs through nvidia-ml-py (``pynvml``).

NVML is a C library loaded into this process, so it reads only the local host (use the
``nvidia-smi`` backend for remote ones). ``pynvml`` is imported lazily: importing the probe must
not need the NVIDIA driver.

Reading happens in two steps:
1. :func:`read_raw` calls NVML in a worker thread and records what each call returned, or the
   NVML error it raised, in a plain JSON-like dict (the format of the ``*_nvml.out`` fixture
   dumps, see :func:`gpu_from_raw`). NVML can hang on a broken GPU: the thread is a daemon and
   the read gives up after ``timeout`` seconds.
2. :func:`reading_from_raw` turns that dict into a :class:`~cleanslate.probe.snapshot.GpuReading`:
   a pure function, tested on real dumps.

Memory is read with the v2 API (``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)``),
which reports driver-reserved memory (~615 MiB on an H200) apart from ``used`` (3-4 MiB idle);
v1, which counts reserved memory as used, is the fallback for drivers without v2, and the
reading's ``note`` then says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict, TypeGuard, TypeVar

from cleanslate.errors import CleanslateError
from cleanslate.hosts.base import Executor
from cleanslate.probe.gpu._health import is_health_message
from cleanslate.probe.gpu.base import GpuBackend, register
from cleanslate.probe.snapshot import Gpu, GpuProcess, GpuReading

NVML = "nvml"
MIB = 1024 * 1024

#: NVML errors that mean "this GPU or driver cannot give that value": the field is unknown,
#: which is not a health problem in itself.
UNSUPPORTED_ERRORS = frozenset({"NotSupported", "FunctionNotFound", "ArgumentVersionMismatch"})
#: NVML errors that mean the GPU is in trouble: the field is unknown *and* a health problem.
HEALTH_ERRORS = frozenset({"GpuIsLost", "Unknown", "ResetRequired", "CorruptedInforom"})

#: How long :meth:`NvmlBackend.usable` waits for ``nvmlInit``.
USABLE_TIMEOUT_S = 5.0

#: All the ``Gpu`` attributes a GPU without a handle cannot give.
_ALL_FIELDS: tuple[str, ...] = (
    "uuid",
    "name",
    "pci_bus_id",
    "memory_used_mib",
    "memory_total_mib",
    "memory_reserved_mib",
    "processes",
    "ecc_uncorrected",
    "retired_pages_pending",
    "remapped_rows_pending",
    "remapped_rows_failure",
)

T = TypeVar("T")

# Worker threads that did not return before their timeout (thread, start time): while one is
# alive, NVML is presumed hung and new reads answer at once instead of piling up threads.
_STUCK: list[tuple[threading.Thread, float]] = []
_STUCK_LOCK = threading.Lock()


class NvmlTimeout(CleanslateError):
    """NVML did not answer in time (the worker thread is left behind as a daemon)."""


def _load_pynvml() -> Any:
    import pynvml

    return pynvml


# ----------------------------------------------------------------------------------------------
# Step 1: call NVML, record values and errors.
# ----------------------------------------------------------------------------------------------


class NvmlError(TypedDict):
    """A call that failed, in place of its value: the error's kind (``NotSupported``) and text."""

    nvml_error: str
    message: str


class RawProcess(TypedDict, total=False):
    pid: int
    used: int | None
    name: str


class RawRemappedRows(TypedDict):
    corrected: int
    uncorrected: int
    pending: int
    failure: int


class RawGpu(TypedDict, total=False):
    """One GPU as :func:`read_raw` records it (see :func:`gpu_from_raw`)."""

    index: int
    handle: NvmlError
    uuid: str | NvmlError
    name: str | NvmlError
    pci_bus_id: str | NvmlError | None
    mem_v2: dict[str, int | None] | NvmlError
    mem_v1: dict[str, int | None] | NvmlError
    procs: list[RawProcess] | NvmlError
    ecc_uncorrected: int | NvmlError
    retired_pages_pending: int | NvmlError
    remapped_rows: RawRemappedRows | NvmlError


class RawHost(TypedDict, total=False):
    """A host's record (see :func:`reading_from_raw`): its GPUs, or why NVML read none."""

    driver: str | NvmlError
    error: str
    gpus: list[RawGpu]


def _error_record(exc: BaseException) -> NvmlError:
    kind = type(exc).__name__
    kind = kind.removeprefix("NVMLError_") if kind.startswith("NVMLError_") else kind
    try:
        message = str(exc) or kind
    except Exception:
        message = kind
    return {"nvml_error": kind, "message": message}


def _is_error(value: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, Mapping) and "nvml_error" in value


def _failed(value: object) -> TypeGuard[NvmlError]:
    """Whether what :func:`_call` returned is its error record."""
    return _is_error(value)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call one NVML function; an error is returned as ``{"nvml_error": KIND, "message": ..}``.

    Any exception counts (``ctypes.ArgumentError`` included): one field that cannot be read
    must not lose the others.
    """
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        return _error_record(exc)


def _text(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _read_gpu(nvml: Any, index: int) -> RawGpu:
    gpu: RawGpu = {"index": index}
    handle = _call(nvml.nvmlDeviceGetHandleByIndex, index)
    if _failed(handle):
        gpu["handle"] = handle
        return gpu
    gpu["uuid"] = _text(_call(nvml.nvmlDeviceGetUUID, handle))
    gpu["name"] = _text(_call(nvml.nvmlDeviceGetName, handle))
    pci = _call(nvml.nvmlDeviceGetPciInfo, handle)
    gpu["pci_bus_id"] = pci if _failed(pci) else _text(getattr(pci, "busId", None))

    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is None:
        gpu["mem_v2"] = {"nvml_error": "FunctionNotFound", "message": "pynvml has no v2"}
    else:
        mem = _call(nvml.nvmlDeviceGetMemoryInfo, handle, version=version)
        gpu["mem_v2"] = mem if _failed(mem) else _fields(mem, "total", "used", "free", "reserved")
    if _failed(gpu["mem_v2"]):
        mem = _call(nvml.nvmlDeviceGetMemoryInfo, handle)
        gpu["mem_v1"] = mem if _failed(mem) else _fields(mem, "total", "used", "free")

    procs = _call(nvml.nvmlDeviceGetComputeRunningProcesses, handle)
    if _failed(procs):
        gpu["procs"] = procs
    else:
        entries: list[RawProcess] = []
        for proc in procs:
            entry: RawProcess = {"pid": proc.pid, "used": proc.usedGpuMemory}
            name = _text(_call(nvml.nvmlSystemGetProcessName, proc.pid))
            if isinstance(name, str) and name:
                entry["name"] = name
            entries.append(entry)
        gpu["procs"] = entries

    gpu["ecc_uncorrected"] = _call(
        nvml.nvmlDeviceGetTotalEccErrors,
        handle,
        nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        nvml.NVML_VOLATILE_ECC,
    )
    gpu["retired_pages_pending"] = _call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    rows = _call(nvml.nvmlDeviceGetRemappedRows, handle)
    if _failed(rows):
        gpu["remapped_rows"] = rows
    else:
        corrected, uncorrected, pending, failure = rows
        gpu["remapped_rows"] = {
            "corrected": corrected,
            "uncorrected": uncorrected,
            "pending": pending,
            "failure": failure,
        }
    return gpu


def _fields(obj: Any, *names: str) -> dict[str, int | None]:
    return {name: getattr(obj, name, None) for name in names}


def read_raw(nvml: Any) -> RawHost:
    """Read every GPU with NVML and return the raw record :func:`reading_from_raw` takes.

    The calls, with their ``nvidia-smi`` equivalents: ``nvmlDeviceGetMemoryInfo`` v2
    (``nvidia-smi --query-gpu=memory.used,memory.reserved,memory.total --format=csv``),
    ``nvmlDeviceGetComputeRunningProcesses`` (``nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv``), ``nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)``
    (``--query-gpu=ecc.errors.uncorrected.volatile.total``), ``nvmlDeviceGetRemappedRows``
    (``--query-gpu=remapped_rows.pending,remapped_rows.failure``),
    ``nvmlDeviceGetRetiredPagesPendingStatus`` (``--query-gpu=retired_pages.pending``).
    Blocking: call it in a worker thread. It does not raise for NVML errors.
    """
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return {"error": f"NVML could not initialise: {_error_record(exc)['message']}"}
    try:
        raw: RawHost = {"driver": _text(_call(nvml.nvmlSystemGetDriverVersion))}
        count = _call(nvml.nvmlDeviceGetCount)
        if _is_error(count):
            raw["error"] = f"nvmlDeviceGetCount failed: {count['message']}"
            return raw
        raw["gpus"] = [_read_gpu(nvml, index) for index in range(count)]
        return raw
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


# ----------------------------------------------------------------------------------------------
# Step 2: the pure conversion.
# ----------------------------------------------------------------------------------------------


class _GpuBuilder:
    def __init__(self) -> None:
        self.unknown: list[str] = []
        self.health: list[str] = []
        self.notes: list[str] = []

    def failed(self, attrs: Sequence[str], call: str, error: Mapping[str, Any]) -> None:
        """An NVML call failed: its fields are unknown; a GPU-trouble error is also health."""
        self.unknown.extend(a for a in attrs if a not in self.unknown)
        kind = str(error.get("nvml_error", ""))
        message = str(error.get("message", kind))
        if kind in HEALTH_ERRORS or (kind not in UNSUPPORTED_ERRORS and is_health_message(message)):
            problem = f"{call}: {message}"
            if problem not in self.health:
                self.health.append(problem)

    def value(self, raw: Mapping[str, Any], key: str, attr: str, call: str, kind: type) -> Any:
        """The value of ``raw[key]`` when it has the right type, else ``None`` and unknown."""
        value = raw.get(key)
        if _is_error(value):
            self.failed([attr], call, value)
            return None
        if kind is int:
            value = _count(value)
        elif kind is bool:
            value = None if _count(value) is None else bool(value)
        elif not isinstance(value, str) or not value:
            value = None
        if value is None:
            self.unknown.append(attr)
        return value


def _count(value: Any) -> int | None:
    """A non-negative integer, or ``None`` (bool, negative, other types are not counts)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _mib(value: Any) -> int | None:
    """Bytes to MiB, rounded up as ``nvidia-smi`` does (26871267328 B is 25626.4 MiB; both
    print 25627), so the two backends agree to the MiB on the same GPU state."""
    count = _count(value)
    return None if count is None else -(-count // MIB)


def _memory(raw: Mapping[str, Any], b: _GpuBuilder) -> dict[str, int | None]:
    v2, v1 = raw.get("mem_v2"), raw.get("mem_v1")
    call = "nvmlDeviceGetMemoryInfo"
    if isinstance(v2, Mapping) and not _is_error(v2):
        memory = {
            "memory_used_mib": _mib(v2.get("used")),
            "memory_total_mib": _mib(v2.get("total")),
            "memory_reserved_mib": _mib(v2.get("reserved")),
        }
    elif isinstance(v1, Mapping) and not _is_error(v1):
        if _is_error(v2):
            b.failed(["memory_reserved_mib"], f"{call} (v2)", v2)
            why = str(v2.get("message"))
        else:
            b.unknown.append("memory_reserved_mib")
            why = "not read"
        b.notes.append(
            f"NVML memory info v2 is not available on GPU {raw.get('index')} ({why}): "
            "memory_used_mib includes driver-reserved memory (about 600 MiB on an idle H200)"
        )
        memory = {
            "memory_used_mib": _mib(v1.get("used")),
            "memory_total_mib": _mib(v1.get("total")),
            "memory_reserved_mib": None,
        }
    else:
        attrs = ["memory_used_mib", "memory_total_mib", "memory_reserved_mib"]
        for error in (v2, v1):
            if _is_error(error):
                b.failed(attrs, call, error)
        b.unknown.extend(a for a in attrs if a not in b.unknown)
        return dict.fromkeys(attrs)
    b.unknown.extend(a for a, v in memory.items() if v is None and a not in b.unknown)
    return memory


def _processes(raw: Mapping[str, Any], b: _GpuBuilder) -> tuple[GpuProcess, ...]:
    procs = raw.get("procs")
    if _is_error(procs):
        b.failed(["processes"], "nvmlDeviceGetComputeRunningProcesses", procs)
        return ()
    if not isinstance(procs, list):
        b.unknown.append("processes")
        return ()
    result: list[GpuProcess] = []
    for proc in procs:
        pid = _count(proc.get("pid")) if isinstance(proc, Mapping) else None
        if pid is None or not isinstance(proc, Mapping):
            # A process NVML lists but that cannot be named still holds memory: say unknown.
            if "processes" not in b.unknown:
                b.unknown.append("processes")
            continue
        name = proc.get("name")
        result.append(
            GpuProcess(
                pid=pid,
                used_mib=_mib(proc.get("used")),  # usedGpuMemory None: not available
                name=name if isinstance(name, str) and name else None,
            )
        )
    return tuple(result)


def _convert(raw: Mapping[str, Any]) -> tuple[Gpu, list[str]]:
    index = _count(raw.get("index"))
    if index is None:
        raise ValueError(f"NVML record without a GPU index: {dict(raw)!r}")
    b = _GpuBuilder()
    handle = raw.get("handle")
    if _is_error(handle):
        b.failed(_ALL_FIELDS, "nvmlDeviceGetHandleByIndex", handle)
        gpu = Gpu(
            index=index,
            health=tuple(b.health),
            unknown_fields=tuple(b.unknown),
            source=NVML,
        )
        return gpu, b.notes
    uuid = b.value(raw, "uuid", "uuid", "nvmlDeviceGetUUID", str)
    name = b.value(raw, "name", "name", "nvmlDeviceGetName", str)
    pci = b.value(raw, "pci_bus_id", "pci_bus_id", "nvmlDeviceGetPciInfo", str)
    memory = _memory(raw, b)
    processes = _processes(raw, b)
    ecc = b.value(raw, "ecc_uncorrected", "ecc_uncorrected", "nvmlDeviceGetTotalEccErrors", int)
    retired = b.value(
        raw,
        "retired_pages_pending",
        "retired_pages_pending",
        "nvmlDeviceGetRetiredPagesPendingStatus",
        bool,
    )
    rows = raw.get("remapped_rows")
    rows_call = "nvmlDeviceGetRemappedRows"
    if _is_error(rows):
        b.failed(["remapped_rows_pending", "remapped_rows_failure"], rows_call, rows)
        rows_pending = rows_failure = None
    else:
        rows_map: Mapping[str, Any] = rows if isinstance(rows, Mapping) else {}
        rows_pending = b.value(rows_map, "pending", "remapped_rows_pending", rows_call, bool)
        rows_failure = b.value(rows_map, "failure", "remapped_rows_failure", rows_call, bool)
    gpu = Gpu(
        index=index,
        uuid=uuid,
        name=name,
        pci_bus_id=pci,
        processes=processes,
        ecc_uncorrected=ecc,
        retired_pages_pending=retired,
        remapped_rows_pending=rows_pending,
        remapped_rows_failure=rows_failure,
        health=tuple(b.health),
        unknown_fields=tuple(b.unknown),
        source=NVML,
        **memory,
    )
    return gpu, b.notes


def gpu_from_raw(raw: Mapping[str, Any]) -> Gpu:
    """Turn one GPU's raw NVML record into a :class:`Gpu`.

    The record (as :func:`read_raw` writes it, and as the ``*_nvml.out`` fixtures hold it)::

        {"index": 0, "uuid": "GPU-..", "name": "NVIDIA H200", "pci_bus_id": "00000000:00:06.0",
         "mem_v2": {"total": B, "used": B, "free": B, "reserved": B},   # bytes
         "mem_v1": {"total": B, "used": B, "free": B},                  # read if v2 failed
         "procs": [{"pid": 584, "used": B or None, "name": "python3"}],
         "ecc_uncorrected": 0, "retired_pages_pending": 0,
         "remapped_rows": {"corrected": 0, "uncorrected": 0, "pending": 0, "failure": 0}}

    Any value may instead be ``{"nvml_error": "NotSupported" | "GpuIsLost" | .., "message": ..}``
    (a failed call), and ``"handle"`` holds such an error when the GPU could not be opened. A
    missing key means the value was not read: unknown, but not a health problem. Memory comes
    from v2 when it was read, else v1 (which counts driver-reserved memory as used).
    """
    return _convert(raw)[0]


def reading_from_raw(raw: Mapping[str, Any], *, elapsed_s: float = 0.0) -> GpuReading:
    """Turn the raw record of a whole host (``{"driver": .., "gpus": [..]}``, or ``{"error":
    ..}`` when NVML failed as a whole) into a reading. Pure: tested on the real dumps."""
    driver = raw.get("driver")
    driver_version = driver if isinstance(driver, str) and driver else None
    error = raw.get("error")
    gpus: list[Gpu] = []
    notes: list[str] = []
    records = raw.get("gpus")
    if error is None and not isinstance(records, list):
        error = "NVML returned no GPU list"
    try:
        for record in records if isinstance(records, list) else ():
            gpu, gpu_notes = _convert(record)
            gpus.append(gpu)
            notes.extend(gpu_notes)
    except (ValueError, AttributeError, TypeError) as exc:
        error = f"NVML returned a record cleanslate cannot read: {exc}"
    return GpuReading(
        backend=NVML,
        ok=error is None,
        gpus=tuple(gpus),
        error=str(error) if error is not None else None,
        driver_version=driver_version,
        note="; ".join(notes) if notes else None,
        elapsed_s=elapsed_s,
    )


# ----------------------------------------------------------------------------------------------
# The backend.
# ----------------------------------------------------------------------------------------------


def _stuck_since() -> float | None:
    """When the oldest NVML call that is still hung started, if any."""
    with _STUCK_LOCK:
        _STUCK[:] = [(thread, start) for thread, start in _STUCK if thread.is_alive()]
        return min((start for _, start in _STUCK), default=None)


async def _in_thread(fn: Callable[[], T], timeout: float) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`NvmlTimeout` after ``timeout`` seconds.

    Not ``asyncio.to_thread``: a hung call there would keep the default executor, and with it
    the interpreter's exit, waiting forever.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(value: T | None, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)  # type: ignore[arg-type]

    def work() -> None:
        value: T | None = None
        error: BaseException | None = None
        try:
            value = fn()
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop closed while NVML hung
            loop.call_soon_threadsafe(settle, value, error)

    start = time.monotonic()
    thread = threading.Thread(target=work, name="cleanslate-nvml", daemon=True)
    thread.start()
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        with _STUCK_LOCK:
            _STUCK.append((thread, start))
        raise NvmlTimeout(f"NVML did not answer within {timeout:g} s") from None


def _probe_init(nvml: Any) -> bool:
    try:
        nvml.nvmlInit()
    except Exception:
        return False
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()
    return True


@register
class NvmlBackend(GpuBackend):
    """Reads this machine's GPUs with NVML (nvidia-ml-py)."""

    name = NVML

    async def read(self, executor: Executor, timeout: float) -> GpuReading:
        """Read memory (v2), compute processes, ECC and row-remapping state of every GPU.

        The equivalent command line::

            nvidia-smi --query-gpu=index,uuid,name,pci.bus_id,memory.used,memory.total,\\
                memory.reserved,ecc.errors.uncorrected.volatile.total,retired_pages.pending,\\
                remapped_rows.pending,remapped_rows.failure --format=csv
            nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv

        Returns within ``timeout`` seconds: a hung NVML gives ``ok=False``, "NVML did not
        answer within N s".
        """
        start = time.monotonic()

        def failed(error: str) -> GpuReading:
            return GpuReading(
                backend=NVML, ok=False, error=error, elapsed_s=time.monotonic() - start
            )

        if not executor.is_local:
            return failed(
                f"NVML reads only this machine's GPUs, not {executor.name}'s: "
                "use --gpu-backend nvidia-smi"
            )
        try:
            nvml = _load_pynvml()
        except ImportError as exc:
            return failed(f"nvidia-ml-py is not importable: {exc}")
        stuck = _stuck_since()
        if stuck is not None:
            return failed(
                f"an earlier NVML call has not returned for {time.monotonic() - stuck:.0f} s: "
                "the driver may be hung"
            )
        try:
            raw = await _in_thread(lambda: read_raw(nvml), timeout)
        except NvmlTimeout as exc:
            return failed(str(exc))
        except Exception as exc:
            return failed(f"NVML read failed: {type(exc).__name__}: {exc}")
        return reading_from_raw(raw, elapsed_s=time.monotonic() - start)

    @classmethod
    async def usable(cls, executor: Executor) -> bool:
        """Whether the executor is this machine and ``nvmlInit`` succeeds here (it fails with
        ``NVMLError_LibraryNotFound`` where no NVIDIA driver is installed)."""
        if not executor.is_local or _stuck_since() is not None:
            return False
        try:
            nvml = _load_pynvml()
        except ImportError:
            return False
        try:
            return await _in_thread(lambda: _probe_init(nvml), USABLE_TIMEOUT_S)
        except Exception:
            return False
