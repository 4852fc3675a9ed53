"""Start a run: the supervisor script on the host, the marker, the log file, the record.

Launch is designed for teardown (``docs/teardown.md``): the engine runs in a new session under a
supervisor that is its child subreaper, in its own cgroup where the host allows it, every
process carries ``CLEANSLATE_RUN=<run id>`` in its environment, the log goes to a file per run,
and the record names every PID with its start time, the host's boot and machine ids and the
cgroup before anything can go wrong.

Secrets: the run folder is 0700 and made under ``umask 077`` (locally and remotely); the spec
that carries the environment is written 0600 and deleted by the supervisor once read; the
record keeps the environment, flags and argv redacted (:mod:`cleanslate.redact`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict

from cleanslate._types import RUN_MARKER_ENV
from cleanslate.engines import EngineAdapter
from cleanslate.errors import CleanslateError
from cleanslate.hosts.base import Executor
from cleanslate.hosts.scripts import script_source
from cleanslate.probe.gpu.none import NoGpuBackend
from cleanslate.probe.host import probe_host
from cleanslate.redact import Scrubber, redact_argv, redact_env, redact_flags
from cleanslate.store import RunRecord, RunStatus

MARKER_ENV = RUN_MARKER_ENV
#: ``0`` launches runs without a cgroup of their own (teardown then relies on the marker, the
#: recorded PIDs and group/session numbers with evidence).
CGROUP_ENV = "CLEANSLATE_CGROUP"

_SCRUBBERS: dict[str, Scrubber] = {}


def register_secrets(run_id: str, env: dict[str, str], flags: dict[str, Any]) -> Scrubber:
    """Remember the secret values of a run launched by this process, so that its log tail and
    failure details are scrubbed wherever they are read here (:func:`scrubber_for`)."""
    scrubber = Scrubber.for_run(env, flags)
    _SCRUBBERS[run_id] = scrubber
    return scrubber


def scrubber_for(run_id: str) -> Scrubber:
    """The scrubber of a run launched by this process; for another run (``cleanslate stop`` in
    a new process, where only the redacted record is left) the generic one, which removes what
    looks like a secret (``--api-key X``, ``TOKEN=X``, URL passwords, bearer headers)."""
    return _SCRUBBERS.get(run_id) or Scrubber(())


def cgroup_disabled() -> str | None:
    """Why runs get no cgroup of their own (``None``: they get one where the host allows)."""
    if os.environ.get(CGROUP_ENV, "1").strip().lower() in ("0", "no", "false", "off"):
        return f"turned off ({CGROUP_ENV}=0)"
    return None


class LaunchError(CleanslateError):
    """The supervisor could not start the engine (the message says why). ``host_side``: the
    host failed (its run folder, the supervisor itself), not the engine's command line, so the
    failure says nothing of the configuration."""

    def __init__(self, message: str, *, host_side: bool = True) -> None:
        super().__init__(message)
        self.host_side = host_side


def new_run_id() -> str:
    """``r-YYYYmmdd-HHMMSS-xxxx``: sortable, short enough to type."""
    return datetime.now(UTC).strftime("r-%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def supervisor_source() -> bytes:
    """The run supervisor (:mod:`cleanslate.launch._supervise_script`). Unlike the other host
    scripts it is written to the run's folder and run from there, and prints no JSON: it
    daemonizes, and the run's state is in its state file."""
    return script_source("launch._supervise_script")


@dataclass(frozen=True)
class LaunchRequest:
    """Everything :func:`launch` needs. ``run_dir`` is the run's artifacts folder on the host."""

    run_id: str
    adapter: EngineAdapter
    model: str
    port: int
    argv: tuple[str, ...]
    flags: dict[str, Any]
    env: dict[str, str]
    gpus: tuple[int, ...] | None
    run_dir: str
    study: str | None = None
    trial: int | None = None


@dataclass(frozen=True)
class Launched:
    """A started run: its record, and why it has no cgroup of its own (``None`` if it has)."""

    run: RunRecord
    cgroup_error: str | None = None


async def make_private_dir(executor: Executor, path: str, timeout: float = 15.0) -> None:
    """Create ``path`` (and its parents) under ``umask 077`` and make it 0700, on any host."""
    await _prepare_run_dir(executor, path, timeout)


#: Run folder creation, then what the record written before the launch needs from the host,
#: each section after a line ``@name`` (``cat`` only: no interpreter started for it).
_PREPARE = ('umask 077 && mkdir -p -- "$1" && chmod 700 -- "$1" || exit 1; '
            'echo @uid; id -u; echo @boot; cat /proc/sys/kernel/random/boot_id; '
            'echo @machine; cat /etc/machine-id || cat /var/lib/dbus/machine-id; '
            'echo @cgroup; cat /proc/self/cgroup; echo @mountinfo; cat /proc/self/mountinfo')


@dataclass(frozen=True)
class HostFacts:
    """What the host said just before a launch (each ``None`` when it could not be read): the
    uid commands run as there, its boot and machine ids, and the cgroup (v2) directory its
    commands run in, under which the supervisor creates the run's cgroup."""

    uid: int | None = None
    boot_id: str | None = None
    machine_id: str | None = None
    cgroup_parent: str | None = None


def _sections(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("@") and line[1:].isalpha():
            current = out.setdefault(line[1:], [])
        elif current is not None:
            current.append(line)
    return out


def _unescape_mount(field: str) -> str:
    """A path field of ``/proc/self/mountinfo`` (spaces and the like as ``\\ooo``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def cgroup_parent_of(own: list[str], mountinfo: list[str]) -> str | None:
    """The directory of a process's cgroup v2 from its ``/proc/self/cgroup`` lines (``0::/path``)
    and ``/proc/self/mountinfo`` lines: the same directory the run supervisor creates the run's
    cgroup in (:mod:`cleanslate.launch._supervise_script`), ``None`` where it would create none
    (no v2 hierarchy, a removed cgroup, no writable v2 mount that shows it)."""
    path = next((line.strip()[3:] for line in own if line.startswith("0::")), "")
    if not path.startswith("/") or path.endswith(" (deleted)"):
        return None
    mounts: list[tuple[str, str, bool]] = []
    for line in mountinfo:
        head, sep, tail = line.partition(" - ")
        fields = head.split()
        if sep and len(fields) >= 6 and tail.split()[:1] == ["cgroup2"]:
            mounts.append((_unescape_mount(fields[3]), _unescape_mount(fields[4]),
                           "ro" in fields[5].split(",")))
    for root, point, read_only in sorted(mounts, key=lambda m: m[0] != "/"):
        if root == "/":
            relative = path
        elif path == root or path.startswith(root.rstrip("/") + "/"):
            relative = path[len(root.rstrip("/")):] or "/"
        else:
            continue
        return None if read_only else point.rstrip("/") + (relative if relative != "/" else "")
    return None


async def _prepare_run_dir(executor: Executor, path: str, timeout: float) -> HostFacts:
    """Create the run folder (:func:`make_private_dir`) and read :class:`HostFacts` in the same
    host command. Raises :class:`LaunchError` when the folder cannot be made."""
    result = await executor.run(["sh", "-c", _PREPARE, "sh", path], timeout=timeout)
    if not result.ok and b"@uid" not in result.stdout:
        raise LaunchError(f"cannot create the run folder {path}: {result.describe_failure()}")
    found = _sections(result.stdout.decode(errors="replace"))
    uid = "".join(found.get("uid", [])).strip()
    return HostFacts(
        uid=int(uid) if uid.isdigit() else None,
        boot_id="".join(found.get("boot", [])).strip() or None,
        machine_id="".join(found.get("machine", [])).strip() or None,
        cgroup_parent=cgroup_parent_of(found.get("cgroup", []), found.get("mountinfo", [])))


async def launch(executor: Executor, request: LaunchRequest, *,
                 timeout: float = 15.0,
                 record: Callable[[RunRecord], object] | None = None) -> Launched:
    """Start the engine under the supervisor and return the run record with its PIDs.

    ``record`` is called with the run's ``launching`` record (:func:`launching_record`) once
    the run folder exists and before the supervisor starts (the store's ``save_run``): a
    process killed at any moment after that leaves a record whose marker and cgroup find what
    the launch started. An exception it raises stops the launch before anything runs.

    Raises :class:`LaunchError` when the supervisor cannot start or reports no engine PID.
    """
    run_dir = request.run_dir.rstrip("/")
    log_path = f"{run_dir}/server.log"
    state_path = f"{run_dir}/state.json"
    spec_path = f"{run_dir}/spec.json"
    script_path = f"{run_dir}/supervise.py"
    env = _run_env(request)
    disabled = cgroup_disabled()
    cgroup = None if disabled else f"cleanslate-{request.run_id}"
    spec = {"argv": list(request.argv), "env": env, "log": log_path, "state": state_path,
            "daemonize": True, "cgroup": cgroup, "cgroup_error": disabled}
    facts = await _prepare_run_dir(executor, run_dir, timeout)
    started = time.time()
    pending = launching_record(request, executor.name, facts, started,
                               cgroup=cgroup)
    if record is not None:
        record(pending)
    await executor.write_file(script_path, supervisor_source(), mode=0o600)
    await executor.write_file(spec_path, json.dumps(spec, indent=1).encode(), mode=0o600)
    result = await executor.run([executor.python, "-I", "-S", script_path, spec_path],
                                timeout=timeout, env={MARKER_ENV: request.run_id})
    if not result.ok:
        await _remove_spec(executor, spec_path)
        raise LaunchError(f"the run supervisor did not start: {result.describe_failure()}")
    try:
        state = await _read_state(executor, state_path, timeout)
    except LaunchError:
        await _remove_spec(executor, spec_path)
        raise
    if state.get("error") or not state.get("pid"):
        raise LaunchError(f"the run supervisor could not start the engine: {state.get('error')}",
                          host_side=False)
    snapshot = await probe_host(executor, NoGpuBackend(), timeout=timeout)
    root = snapshot.process(int(state["pid"]))
    supervisor = snapshot.process(int(state["supervisor_pid"]))
    run = pending.model_copy(update=dict(
        status=RunStatus.STARTING,
        pid=int(state["pid"]),
        pgid=int(state["pgid"]),
        sid=int(state["sid"]),
        create_time=root.create_time if root else None,
        supervisor_pid=int(state["supervisor_pid"]),
        supervisor_create_time=supervisor.create_time if supervisor else None,
        boot_id=_text(state.get("boot_id")),
        machine_id=_text(state.get("machine_id")),
        cgroup=_text(state.get("cgroup")),
        user=_text(state.get("user")),
        uid=_int(state.get("uid")),
        cgroup_id=_int(state.get("cgroup_id")) if state.get("cgroup") else None,
    ))
    return Launched(run=run, cgroup_error=_text(state.get("cgroup_error")))


def _run_env(request: LaunchRequest) -> dict[str, str]:
    """The engine's environment: the request's, its marker, and its GPUs when given."""
    env = {**request.env, MARKER_ENV: request.run_id}
    if request.gpus is not None and "CUDA_VISIBLE_DEVICES" not in env:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, request.gpus))
    return env


def launching_record(request: LaunchRequest, host: str, facts: HostFacts, started: float, *,
                     cgroup: str | None) -> RunRecord:
    """The run's record before its supervisor starts (status ``launching``): everything but
    the PIDs. ``cgroup`` is the name the supervisor is asked to create (``None``: none), recorded
    as the path it will have under ``facts.cgroup_parent``; the environment, flags and argv
    redacted."""
    env = _run_env(request)
    run_dir = request.run_dir.rstrip("/")
    return RunRecord(
        id=request.run_id,
        host=host,
        engine=request.adapter.name,
        model=request.model,
        argv=tuple(redact_argv(request.argv)),
        flags=redact_flags(request.flags),
        env=redact_env(env),
        marker=request.run_id,
        port=request.port,
        gpus=request.gpus,
        url=request.adapter.base_url(request.port),
        log_path=f"{run_dir}/server.log",
        artifacts_dir=run_dir,
        status=RunStatus.LAUNCHING,
        started_at=started,
        study=request.study,
        trial=request.trial,
        boot_id=facts.boot_id,
        machine_id=facts.machine_id,
        cgroup=f"{facts.cgroup_parent}/{cgroup}" if cgroup and facts.cgroup_parent else None,
        uid=facts.uid,
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def _remove_spec(executor: Executor, spec_path: str) -> None:
    """Best effort: the supervisor did not get to delete the spec (and its secrets)."""
    with contextlib.suppress(Exception):
        await executor.run(["rm", "-f", "--", spec_path], timeout=15.0)


async def host_identity(executor: Executor) -> tuple[str | None, str | None]:
    """The host's ``(boot_id, machine_id)`` now, each ``None`` when it cannot be read."""
    out: list[str | None] = []
    for paths in (("/proc/sys/kernel/random/boot_id",),
                  ("/etc/machine-id", "/var/lib/dbus/machine-id")):
        value = None
        for path in paths:
            try:
                value = (await executor.read_file(path, max_bytes=256)).decode(
                    errors="replace").strip() or None
            except OSError:
                continue
            if value:
                break
        out.append(value)
    return out[0], out[1]


class SupervisorState(TypedDict, total=False):
    """The supervisor's state file (:mod:`cleanslate.launch._supervise_script`); every field is
    absent or ``null`` until the supervisor knows it."""

    supervisor_pid: int
    pid: int
    pgid: int
    sid: int
    started: float
    exit_code: int | None
    exited_at: float | None
    error: str | None
    boot_id: str | None
    machine_id: str | None
    user: str | None
    uid: int | None
    cgroup: str | None
    cgroup_id: int | None
    cgroup_error: str | None


async def read_state(executor: Executor, state_path: str) -> SupervisorState | None:
    """The supervisor's state file, or ``None`` while it does not exist."""
    try:
        data: SupervisorState = json.loads(await executor.read_file(state_path))
    except (FileNotFoundError, ValueError):
        return None
    return data


async def _read_state(executor: Executor, state_path: str, timeout: float) -> SupervisorState:
    deadline = time.monotonic() + timeout
    while True:
        state = await read_state(executor, state_path)
        if state is not None and (state.get("pid") or state.get("error")):
            return state
        if time.monotonic() > deadline:
            raise LaunchError(f"the run supervisor wrote no state within {timeout:g} s "
                              f"({state_path})")
        await asyncio.sleep(0.05)

