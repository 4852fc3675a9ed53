"""The simulated GPU ledger: a directory that stands in for the GPU driver's memory accounting.

**Standard library only**: the ``sim`` GPU backend sends this file's source to a host's Python
(``python -I -c SOURCE DIR``) and reads the JSON it prints, exactly as it would for a remote host.

Layout of the directory named by ``CLEANSLATE_SIM_GPU_DIR``:

``config.json`` (optional)
    ``{"gpus": 8, "memory_total_mib": 143771, "name": "...", "idle_used_mib": 0}``; missing keys
    and a missing file take the defaults below (8 x 143771 MiB, an idle GPU reads 0 MiB).
``alloc-<pid>-<gpu>.json``
    One allocation: ``{"pid": 1234, "start_ticks": 567890, "gpu": 0, "used_mib": 41487,
    "name": "sim::scheduler_TP0", "release_delay_s": 0.0, "gone_at": null}``. ``start_ticks`` is
    field 22 of ``/proc/PID/stat`` (start time in clock ticks since boot), so a reused PID is
    never mistaken for the owner. Writers replace the file atomically (write + rename).
``gone-<pid>-<gpu>.json``
    Written by the reader the first time it sees the owner gone when the allocation has a
    release delay: ``{"gone_at": <epoch seconds>}``.

Semantics (those of the driver): an allocation counts while its owner process exists; a zombie
counts as gone. Once the owner is gone the memory is released at once, or ``release_delay_s``
seconds after the owner was first seen gone (or after ``gone_at``, which an owner that exits
cleanly writes itself). During that delay the memory still counts in ``memory_used_mib`` but the
process is no longer listed, as ``nvidia-smi`` shows memory being freed after a kill. Released
entries are removed by the reader when it can.

Reader output (``python ledger.py DIR``): ``{"ok": true, "gpus": [{"index": 0,
"memory_used_mib": 41487, "memory_total_mib": 143771, "name": "...", "processes": [{"pid":
1234, "used_mib": 41487, "name": "sim::scheduler_TP0"}], "releasing_mib": 0}], "note": ...}``,
or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping
from typing import TypedDict

#: The environment variable that names the ledger directory: read by the simulated engine's
#: processes (they record their memory there), by the ``sim`` GPU backend and ``--gpu-backend
#: auto`` (they read it), and set by the sim engine adapter for the runs it prepares.
SIM_GPU_DIR_ENV = "CLEANSLATE_SIM_GPU_DIR"

DEFAULT_GPUS = 8
DEFAULT_MEMORY_MIB = 143771
DEFAULT_NAME = "Simulated NVIDIA H200 (cleanslate sim, not a real GPU)"
CONFIG_FILE = "config.json"


# The documents of the ledger (TypedDicts of Python 3.8's ``typing``: the host's Python may be
# that old; optional keys are those of a ``total=False`` class).


class ConfigFile(TypedDict, total=False):
    """``config.json`` as :func:`write_config` writes it (every key optional)."""

    gpus: int
    memory_total_mib: int
    name: str
    idle_used_mib: int


class LedgerConfig(TypedDict):
    """The ledger's configuration as :func:`read_config` reads it: every key, with defaults."""

    gpus: int
    memory_total_mib: int
    name: str
    idle_used_mib: int


class Allocation(TypedDict):
    """One ``alloc-<pid>-<gpu>.json`` entry (see the module docstring)."""

    pid: int
    start_ticks: int | None
    gpu: int
    used_mib: int
    name: str
    release_delay_s: float
    gone_at: float | None


class GoneStamp(TypedDict):
    """A ``gone-<pid>-<gpu>.json`` file: when the reader first saw the owner gone."""

    gone_at: float


class LedgerProcess(TypedDict):
    """A process holding memory on a simulated GPU, as the reader lists it."""

    pid: int
    used_mib: int
    name: str | None


class LedgerGpu(TypedDict):
    """One simulated GPU as the reader sees it."""

    index: int
    memory_used_mib: int
    memory_total_mib: int
    name: str
    processes: list[LedgerProcess]
    releasing_mib: int


class _LedgerResultBase(TypedDict):
    ok: bool


class LedgerResult(_LedgerResultBase, total=False):
    """What the reader prints: ``ok`` with ``gpus``, ``directory`` and maybe ``note``, or
    ``ok`` false with ``error``."""

    error: str
    gpus: list[LedgerGpu]
    directory: str
    note: str


def ledger_dir(environ: Mapping[str, str] | None = None) -> str | None:
    """The ledger directory named by :data:`SIM_GPU_DIR_ENV` in ``environ`` (this process's
    environment when ``None``), or ``None`` when it names none."""
    value = (os.environ if environ is None else environ).get(SIM_GPU_DIR_ENV)
    return value or None


def read_config(directory: str) -> LedgerConfig:
    """The ledger's GPU count, size and name, with defaults for what the config omits (the
    values the file holds are taken as they are)."""
    path = os.path.join(directory, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            loaded = json.load(fh)
    except FileNotFoundError:
        loaded = None
    if not isinstance(loaded, dict):
        loaded = {}
    return {
        "gpus": loaded.get("gpus", DEFAULT_GPUS),
        "memory_total_mib": loaded.get("memory_total_mib", DEFAULT_MEMORY_MIB),
        "name": loaded.get("name", DEFAULT_NAME),
        "idle_used_mib": loaded.get("idle_used_mib", 0),
    }


def write_config(
    directory: str, gpus: int = DEFAULT_GPUS, memory_total_mib: int = DEFAULT_MEMORY_MIB
) -> str:
    """Create the ledger directory and its config; returns the config's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, CONFIG_FILE)
    _atomic_write(path, {"gpus": gpus, "memory_total_mib": memory_total_mib, "name": DEFAULT_NAME})
    return path


def proc_start_ticks(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat``, or ``None`` when the process does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return None
    rest = data[data.rfind(")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 is rest[19].
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def owner_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` still exists, is not a zombie, and is the same process (start time)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode(errors="replace")
    except OSError:
        return False
    rest = data[data.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X", "x"):
        return False
    if start_ticks is not None:
        try:
            return int(rest[19]) == int(start_ticks)
        except (IndexError, ValueError):
            return False
    return True


def _atomic_write(path: str, payload: ConfigFile | Allocation | GoneStamp) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(payload, fh)
    os.replace(tmp, path)


def alloc_path(directory: str, pid: int, gpu: int) -> str:
    return os.path.join(directory, f"alloc-{pid}-{gpu}.json")


def allocate(
    directory: str,
    gpu: int,
    used_mib: int,
    name: str,
    release_delay_s: float = 0.0,
    pid: int | None = None,
) -> str:
    """Record (or update) the memory that process ``pid`` (default: this one) holds on ``gpu``."""
    pid = os.getpid() if pid is None else pid
    os.makedirs(directory, exist_ok=True)
    path = alloc_path(directory, pid, gpu)
    _atomic_write(
        path,
        {
            "pid": pid,
            "start_ticks": proc_start_ticks(pid),
            "gpu": gpu,
            "used_mib": int(used_mib),
            "name": name,
            "release_delay_s": float(release_delay_s),
            "gone_at": None,
        },
    )
    return path


def release(directory: str, gpu: int, pid: int | None = None) -> None:
    """Called by an owner that exits cleanly: drop its entry, or, when it has a release delay,
    stamp the time it left so the memory is freed that many seconds later."""
    pid = os.getpid() if pid is None else pid
    path = alloc_path(directory, pid, gpu)
    try:
        with open(path, encoding="utf-8") as fh:
            entry = json.load(fh)
    except (OSError, ValueError):
        return
    if float(entry.get("release_delay_s") or 0) > 0:
        entry["gone_at"] = time.time()
        _atomic_write(path, entry)
    else:
        with contextlib.suppress(OSError):
            os.unlink(path)


def read_ledger(directory: str, now: float | None = None) -> LedgerResult:
    """Read the ledger with the driver's semantics (see the module docstring)."""
    now = time.time() if now is None else now
    if not os.path.isdir(directory):
        return {"ok": False, "error": f"simulated GPU ledger {directory!r} does not exist"}
    try:
        config = read_config(directory)
        count = int(config["gpus"])
        total = int(config["memory_total_mib"])
        idle = int(config.get("idle_used_mib") or 0)
        names = sorted(os.listdir(directory))
    except (OSError, ValueError, TypeError) as exc:
        return {"ok": False, "error": f"cannot read simulated GPU ledger {directory!r}: {exc}"}
    gpus: list[LedgerGpu] = [
        {
            "index": i,
            "memory_used_mib": idle,
            "memory_total_mib": total,
            "name": str(config["name"]),
            "processes": [],
            "releasing_mib": 0,
        }
        for i in range(count)
    ]
    notes: list[str] = []
    for fname in names:
        if not (fname.startswith("alloc-") and fname.endswith(".json")):
            continue
        path = os.path.join(directory, fname)
        try:
            with open(path, encoding="utf-8") as fh:
                entry = json.load(fh)
            pid = int(entry["pid"])
            gpu = int(entry["gpu"])
            used = int(entry["used_mib"])
        except FileNotFoundError:
            continue  # released between listdir and open
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"unreadable ledger entry {fname}: {exc}")
            continue
        if not 0 <= gpu < count:
            notes.append(f"ledger entry {fname} names GPU {gpu}, outside 0..{count - 1}")
            continue
        start = entry.get("start_ticks")
        if owner_alive(pid, None if start is None else int(start)):
            gpus[gpu]["memory_used_mib"] += used
            gpus[gpu]["processes"].append({"pid": pid, "used_mib": used, "name": entry.get("name")})
            continue
        delay = float(entry.get("release_delay_s") or 0.0)
        gone_at = entry.get("gone_at")
        gone_path = os.path.join(directory, f"gone-{pid}-{gpu}.json")
        if delay > 0 and gone_at is None:
            try:
                with open(gone_path, encoding="utf-8") as fh:
                    gone_at = float(json.load(fh)["gone_at"])
            except (OSError, ValueError, KeyError, TypeError):
                gone_at = now
                with contextlib.suppress(OSError):
                    _atomic_write(gone_path, {"gone_at": now})
        if delay > 0 and gone_at is not None and now < float(gone_at) + delay:
            gpus[gpu]["memory_used_mib"] += used
            gpus[gpu]["releasing_mib"] += used
            continue
        for stale in (path, gone_path):
            with contextlib.suppress(OSError):
                os.unlink(stale)
    result: LedgerResult = {"ok": True, "gpus": gpus, "directory": directory}
    if notes:
        result["note"] = "; ".join(notes)
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(json.dumps({"ok": False, "error": "usage: ledger.py DIRECTORY"}))
        return 2
    print(json.dumps(read_ledger(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
