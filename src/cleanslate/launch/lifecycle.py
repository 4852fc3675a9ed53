"""The verified lifecycle of one server: preflight -> launch -> ready -> smoke, and stop.

:func:`start_server` is what ``cleanslate serve`` and each trial of ``cleanslate tune`` run;
:func:`stop_server` is ``cleanslate stop`` / ``clean --run``. Every transition is recorded in the
store as it happens, so a controller that dies leaves a record that the next one can act on.
Once the engine is launched, *any* way out of :func:`start_server` other than a ready,
smoke-tested server (a failure, a bug, a store error, Ctrl-C, a cancelled task) tears it down and
verifies before the exception goes on.

Secrets never reach the store: the record keeps the environment, flags and argv redacted, and
log tails and failure details are scrubbed of the run's secret values
(:func:`cleanslate.launch.launcher.scrubber_for`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleanslate.bench import ServerConfig
from cleanslate.doctor.snapshot import HostSnapshot, snapshot_host
from cleanslate.engines import (
    EngineAdapter,
    Leftovers,
    SmokeResult,
    engine_class,
    get_engine,
    smoke_test,
    validate_flags,
)
from cleanslate.errors import ExitCode, InputError
from cleanslate.hosts.base import Executor
from cleanslate.launch.config import ServeConfig, template_engines
from cleanslate.launch.launcher import (
    LaunchError,
    LaunchRequest,
    host_identity,
    launch,
    new_run_id,
    register_secrets,
    scrubber_for,
)
from cleanslate.launch.ready import (
    classify_run_log,
    log_tail,
    read_run_file,
    run_file,
    run_state,
    wait_ready,
)
from cleanslate.probe.gpu.base import GpuBackend, backend_names, get_backend, resolve_backend
from cleanslate.probe.snapshot import Snapshot
from cleanslate.redact import redact_argv
from cleanslate.store import HostRecord, RunRecord, RunStatus, Store, local_machine
from cleanslate.teardown import (
    TREE_FILE,
    ScopeSpec,
    TeardownReport,
    skip_teardown,
    teardown,
    valid_cgroup,
)
from cleanslate.verdict.baseline import Baseline
from cleanslate.verdict.check import CheckOptions, CheckReport, check_hosts
from cleanslate.verdict.findings import Verdict
from cleanslate.verdict.rules import Scope

Progress = Callable[[str], None]
#: Markers of runs that a check leaves to others, read after each probe (see ``CheckOptions``).
Exclusions = Callable[[], frozenset[str]]

#: The idle-state baseline (``cleanslate check --save-baseline``) that the checks before a
#: launch and after a teardown compare with, for everything run in this context: ``tune
#: --baseline`` sets it for a whole study (:func:`using_baseline`). ``None``: no baseline. A
#: context variable rather than an argument: it reaches every check of a study's trials,
#: replicates and recoveries, and asyncio tasks inherit it.
_BASELINE: ContextVar[Baseline | None] = ContextVar("cleanslate_baseline", default=None)


@contextlib.contextmanager
def using_baseline(baseline: Baseline | None) -> Iterator[None]:
    """Compare every check of a launch or teardown run inside this block with ``baseline``
    (see :data:`_BASELINE`)."""
    token = _BASELINE.set(baseline)
    try:
        yield
    finally:
        _BASELINE.reset(token)


def current_baseline() -> Baseline | None:
    """The baseline the checks of this context compare with (:func:`using_baseline`)."""
    return _BASELINE.get()


@dataclass
class StartOutcome:
    """How :func:`start_server` ended. ``ok`` means launched, ready and smoke-tested.

    ``refused`` is set when the preflight check found the host not clean (nothing was launched);
    otherwise a failed start has a ``cause`` (``oom``, ``nan``, ``timeout`` ...), the log tail,
    and the teardown that followed it.
    """

    run: RunRecord | None
    ok: bool
    refused: CheckReport | None = None
    cause: str | None = None
    detail: str | None = None
    log_tail: str = ""
    smoke: SmokeResult | None = None
    teardown: TeardownReport | None = None
    validation_note: str | None = None
    phases: dict[str, float] = field(default_factory=dict)
    cgroup_note: str | None = None
    host_snapshot: HostSnapshot | None = None
    #: The host failed the launch (``LaunchError.host_side``): no result of the configuration.
    host_failed: bool = False


def local_model_path(model: str) -> bool:
    """Whether ``model`` names a path on the host (absolute, or starting with ``./``, ``../``
    or ``~``) rather than a Hugging Face repo id (``org/name``), which is not looked for."""
    return model in (".", "..") or model.startswith(("/", "./", "../", "~"))


async def model_path_missing(executor: Executor, model: str, *, timeout: float = 30.0) -> bool:
    """Whether ``model`` is a local path (:func:`local_model_path`) that does not exist on
    ``executor``'s host: ``test -e MODEL`` there, an argv (no shell; the path as the engine
    gets it, ``~`` not expanded). ``False`` when it exists, is a repo id, or the host did not
    answer (the checks before the launch say so)."""
    if not local_model_path(model):
        return False
    result = await executor.run(["test", "-e", model], timeout=timeout)
    return result.returncode == 1


def missing_model_error(model: str, host: str, where: str | None) -> InputError:
    """The input error of a model path that :func:`model_path_missing` found missing."""
    return InputError(
        f"model {model!r} does not exist on {host}", where=where,
        hint="give the path of the model's folder (or file) on that host"
             + (" (a ~ is not expanded: the engine gets the path as written)"
                if model.startswith("~") else "")
             + ", or a Hugging Face repo id such as org/name")


def adapter_for(config: ServeConfig, executor: Executor) -> EngineAdapter:
    """The engine adapter for a server config: ``launch``, ``argv`` (engines started from an
    argv template, ``command``), ``readiness_path`` and ``python`` passed through; an engine
    whose default interpreter is ours gets the executor's on another host."""
    adapter_cls = engine_class(config.engine)
    options: dict[str, Any] = {}
    if adapter_cls.argv_template:
        if config.launch:
            raise InputError(f"engine {config.engine} takes argv: (the whole command, with "
                             "{port}), not launch:", where="launch")
        options["argv"] = config.argv
    elif config.argv:
        raise InputError(f"argv: is the template of engine {template_engines()}, not of "
                         f"{config.engine}", where="argv",
                         hint="use launch: to change how the engine starts")
    if config.launch:
        options["launch"] = config.launch
    if config.readiness_path:
        options["readiness_path"] = config.readiness_path
    if config.python:
        options["python"] = config.python
    elif adapter_cls.local_python and not executor.is_local:
        options["python"] = executor.python
    return get_engine(config.engine, **options)


def run_gpu_backend(gpu_backend: str, engine: str, env: Mapping[str, str]) -> str | GpuBackend:
    """The GPU backend of a run's checks, configured from the run's environment ``env`` (the
    sim's ledger). ``auto`` is the engine's own backend when it has one
    (:attr:`~cleanslate.engines.EngineAdapter.gpu_backend`), else resolved on the host."""
    if gpu_backend == "auto":
        gpu_backend = engine_class(engine).gpu_backend or "auto"
    if gpu_backend in backend_names():
        return get_backend(gpu_backend, env=env)
    return gpu_backend  # ``auto``, or a bad name: reported where the check resolves it


def verify_options(run: RunRecord, *, gpu_backend: str = "auto", timeout: float = 10.0,
                   exclude_roots: frozenset[int] = frozenset(),
                   exclusions: Exclusions | None = None) -> CheckOptions:
    """What "clean after this run" means: its GPUs, its port, its engine and its marker;
    ``exclusions`` gives the markers of runs that are not this run's business (a study's other
    slots on the host: :class:`~cleanslate.verdict.check.CheckOptions`)."""
    scope = Scope(
        gpus=frozenset(run.gpus) if run.gpus is not None else None,
        engines=(run.engine,),
        markers=frozenset({run.marker}),
        exclude_roots=exclude_roots or frozenset({os.getpid()}),
    )
    return CheckOptions(scope=scope, ports=(run.port,),
                        gpu_backend=run_gpu_backend(gpu_backend, run.engine, run.env),
                        timeout=timeout, exclusions=exclusions, baseline=current_baseline())


def shm_remover(run: RunRecord, leftovers: Leftovers) -> Callable[[Snapshot], list[str]]:
    """Pick the run's own ``/dev/shm`` files: matching the engine's leftovers (or the generic
    patterns), absent before the launch, modified after it started, and owned by the run's
    user: the uid its supervisor ran as (``RunRecord.uid``), or, for a record made before that
    was kept, the user this probe ran as on the host (the collector's uid). A file of another
    user (``/dev/shm`` is world-writable: anyone can create a name that matches) or whose owner
    was not read is never removed."""
    globs = leftovers.shm_globs

    def pick(snapshot: Snapshot) -> list[str]:
        before = set(run.shm_before)
        uid = run.uid
        if uid is None and snapshot.collector_pid is not None:
            collector = snapshot.process(snapshot.collector_pid)
            uid = collector.uid if collector is not None else None
        if uid is None:
            return []
        out = []
        for entry in snapshot.shm:
            if entry.name in before or entry.mtime < run.started_at - 1.0:
                continue
            if entry.uid != uid:
                continue
            if globs and not any(fnmatch.fnmatchcase(entry.name, g) for g in globs):
                continue
            out.append(entry.name)
        return out

    return pick


async def start_server(
    executor: Executor,
    store: Store,
    config: ServeConfig,
    *,
    gpu_backend: str = "auto",
    preflight: bool = True,
    validate: bool = True,
    progress: Progress | None = None,
    study: str | None = None,
    trial: int | None = None,
    verify_deadline_s: float = 60.0,
    run_id: str | None = None,
    exclusions: Exclusions | None = None,
    snapshot: bool = False,
) -> StartOutcome:
    """Preflight, launch, wait ready, smoke-test. On any failure: tear down, verify, record.

    ``run_id``: the run's id (its marker), when the caller recorded it before the launch;
    ``exclusions``: markers of runs the checks leave alone (:func:`verify_options`);
    ``snapshot``: take a doctor snapshot of the host before the preflight check and record it
    with the run once launched (``cleanslate serve``; a study records its own per host). A
    snapshot that fails is recorded with why; it never stops the launch."""
    say = progress or (lambda _m: None)
    phases: dict[str, float] = {}
    adapter = adapter_for(config, executor)
    port = config.port or adapter.default_port
    run_id = run_id or new_run_id()
    artifacts = store.artifacts
    env = adapter.prepare_env(config.env, artifacts)
    argv = adapter.build_argv(config.model, port, config.flags)
    note = None

    t0 = time.monotonic()
    if validate:
        if await model_path_missing(executor, config.model):
            raise missing_model_error(config.model, executor.name, "model")
        say("validating flags against the engine's --help")
        validation = await validate_flags(adapter, config.flags, executor)
        note = validation.note
        for warning in validation.warnings:
            say(f"warning: {warning}")
    phases["validate_s"] = round(time.monotonic() - t0, 3)

    t0 = time.monotonic()
    options = CheckOptions(
        scope=Scope(gpus=frozenset(config.gpus) if config.gpus is not None else None,
                    exclude_roots=frozenset({os.getpid()})),
        ports=(port,), gpu_backend=run_gpu_backend(gpu_backend, config.engine, env),
        exclusions=exclusions, baseline=current_baseline())
    host: HostSnapshot | None = None
    if snapshot:
        # Before the check, not beside it: the doctor's nvidia-smi holds the GPUs' device
        # files while it runs, and the check would see a holder that is not the run's.
        say("doctor snapshot of the host")
        host = await snapshot_host(executor)
        phases["doctor_s"] = round(time.monotonic() - t0, 3)
        t0 = time.monotonic()
    before = await check_hosts([executor], options)
    phases["verify_before_s"] = round(time.monotonic() - t0, 3)
    if preflight and before.verdict != Verdict.CLEAN:
        return StartOutcome(run=None, ok=False, refused=before, validation_note=note,
                            phases=phases, host_snapshot=host)

    run_dir = f"{artifacts}/{run_id}" if executor.is_local else f".cleanslate/runs/{run_id}"
    request = LaunchRequest(run_id=run_id, adapter=adapter, model=config.model, port=port,
                            argv=tuple(argv), flags=dict(config.flags), env=env,
                            gpus=tuple(config.gpus) if config.gpus is not None else None,
                            run_dir=run_dir, study=study, trial=trial)
    scrub = register_secrets(run_id, env, dict(config.flags))
    t0 = time.monotonic()
    say(f"launching {run_id}: {' '.join(redact_argv(argv))}")
    pending: list[RunRecord] = []

    shm_before = tuple(str(f.evidence.get("name")) for f in before.hosts[0].findings
                       if f.kind == "shm_leftover")

    def record(run: RunRecord) -> None:
        store.save_run(run.model_copy(update={"verdict_before": before,
                                              "shm_before": shm_before}))
        pending.append(run)

    try:
        launched = await launch(executor, request, record=record)
    except LaunchError as exc:
        _close_launching(store, pending, "launch_failed", scrub(str(exc)), say)
        return StartOutcome(run=None, ok=False, cause="launch_failed", detail=scrub(str(exc)),
                            validation_note=note, phases=phases, host_failed=exc.host_side)
    except BaseException:
        # Launched or not, no PID is recorded yet: end whatever carries the run's marker.
        await _abandon_launch(executor, run_id, gpu_backend, say)
        _close_launching(store, pending, "interrupted", "interrupted while launching", say)
        raise
    run = launched.run
    if launched.cgroup_error:
        say(f"no cgroup for this run: {launched.cgroup_error}")
    phases["launch_s"] = round(time.monotonic() - t0, 3)
    run = run.model_copy(update={"verdict_before": before, "shm_before": shm_before})
    try:
        if host is not None:
            _save_host(store, executor, run, host, say)
        outcome = await _after_launch(executor, store, adapter, run, config, phases, note,
                                      gpu_backend, verify_deadline_s, say, exclusions)
    except BaseException as exc:
        await _cleanup_after_error(executor, store, run, config, exc, gpu_backend,
                                   verify_deadline_s, say, exclusions)
        raise
    outcome.cgroup_note = launched.cgroup_error
    outcome.host_snapshot = host
    return outcome


def _save_host(store: Store, executor: Executor, run: RunRecord, host: HostSnapshot,
               say: Progress) -> None:
    """Record a run's host snapshot; a store that refuses it is said, not raised (the run's
    own record is what matters, and it is written next)."""
    try:
        store.save_host(HostRecord(run_id=run.id, host=executor.name,
                                   machine=local_machine() if executor.is_local else "",
                                   snapshot=host))
    except InputError as exc:
        say(f"the doctor snapshot of {executor.name} was not recorded: {exc.message}")
        return
    say(f"{executor.name}: {host.summary()}")


async def _after_launch(executor: Executor, store: Store, adapter: EngineAdapter,
                        run: RunRecord, config: ServeConfig, phases: dict[str, float],
                        note: str | None, gpu_backend: str, verify_deadline_s: float,
                        say: Progress, exclusions: Exclusions | None = None) -> StartOutcome:
    """Ready and smoke test of a launched run; a failure is torn down and recorded here."""
    store.save_run(run)
    # Every request to the server goes to 127.0.0.1:port *on its host*: through an SSH forward
    # for a remote run, never this machine's own loopback (another server may listen there).
    async with executor.forward_port(run.port) as base_url:
        return await _ready_and_smoke(executor, store, adapter, run, config, phases, note,
                                      gpu_backend, verify_deadline_s, say, exclusions,
                                      base_url)


async def _ready_and_smoke(executor: Executor, store: Store, adapter: EngineAdapter,
                           run: RunRecord, config: ServeConfig, phases: dict[str, float],
                           note: str | None, gpu_backend: str, verify_deadline_s: float,
                           say: Progress, exclusions: Exclusions | None,
                           base_url: str) -> StartOutcome:
    say(f"waiting until ready (timeout {config.ready_timeout_s:g} s)")
    t0 = time.monotonic()
    ready = await wait_ready(executor, adapter, run, timeout=config.ready_timeout_s,
                             base_url=base_url)
    phases["ready_s"] = round(time.monotonic() - t0, 3)
    if not ready.ready:
        return await _fail(executor, store, adapter, run, config, ready.cause or "not_ready",
                           ready.detail, phases, note, gpu_backend, verify_deadline_s, say,
                           exclusions)
    run = run.model_copy(update={"status": "ready", "ready_at": time.time()})
    store.save_run(run)
    t0 = time.monotonic()
    run = run.model_copy(update={"server_config": await read_run_config(
        executor, adapter, run, config.flags, base_url)})
    phases["config_s"] = round(time.monotonic() - t0, 3)
    store.save_run(run)

    smoke = None
    if config.smoke:
        say("smoke test")
        t0 = time.monotonic()
        smoke = await smoke_test(base_url, config.model,
                                 completions=adapter.supports_completions,
                                 chat=adapter.supports_chat,
                                 request_timeout=config.smoke_timeout_s)
        phases["smoke_s"] = round(time.monotonic() - t0, 3)
        if not smoke.passed:
            # The log often says more than the HTTP answer (a worker's traceback).
            found = await classify_run_log(executor, adapter, run)
            detail = smoke.detail or ""
            if found is not None:
                detail = f"{detail}; log: {found[1]}" if detail else found[1]
            cause = str(smoke.cause)
            outcome = await _fail(executor, store, adapter, run, config, cause, detail, phases,
                                  note, gpu_backend, verify_deadline_s, say, exclusions)
            outcome.smoke = smoke
            return outcome
    run = run.model_copy(update={"phases": phases})
    store.save_run(run)
    return StartOutcome(run=run, ok=True, smoke=smoke, validation_note=note, phases=phases)


#: Bytes of the head of a run's log read for the engine's arguments (vLLM says them in its first
#: lines; its whole start-up log on CPU was 14 KB).
CONFIG_LOG_BYTES = 256 * 1024


async def read_run_config(executor: Executor, adapter: EngineAdapter, run: RunRecord,
                          flags: Mapping[str, Any] | None, base_url: str) -> ServerConfig:
    """The configuration the run's engine says it runs with (:meth:`EngineAdapter.read_config`)
    against the run's ``flags``, through ``base_url`` (the executor's forward for a remote
    run); for an engine that says its arguments in its log, the head of the run's own log,
    scrubbed of the run's secrets. Never raises except on cancellation."""
    log_text = None
    if adapter.config_from_log:
        try:
            head = await read_run_file(executor, run, "server.log", max_bytes=CONFIG_LOG_BYTES)
        except OSError:
            head = b""
        log_text = scrubber_for(run.id)(head.decode(errors="replace")) or None
    return await adapter.read_config(None, base_url, flags=flags, log_text=log_text)


async def _abandon_launch(executor: Executor, run_id: str, gpu_backend: str,
                          say: Progress) -> None:
    """Tear down a launch that was interrupted before its record existed (by its marker)."""
    with contextlib.suppress(BaseException):
        say(f"interrupted during launch: ending whatever carries {run_id}")
        await asyncio.shield(teardown(executor, ScopeSpec(
            marker=run_id, exclude_roots=frozenset({os.getpid()})), grace_s=5.0))


def _close_launching(store: Store, pending: list[RunRecord], cause: str, detail: str | None,
                     say: Progress) -> None:
    """Record ``failed`` a run whose launch ended before its PIDs were known (its ``launching``
    record, when one was saved). No verification is recorded: the next recovery of the study
    verifies the host for it (a run not verified clean is not known to be gone). Never
    raises: the store may be what failed."""
    if not pending:
        return
    try:
        store.save_run(store.get_run(pending[0].id).model_copy(update={
            "status": "failed", "cause": cause, "detail": detail, "stopped_at": time.time()}))
    except Exception as exc:
        say(f"run {pending[0].id} stays recorded launching: {type(exc).__name__}: {exc}")


async def _cleanup_after_error(executor: Executor, store: Store, run: RunRecord,
                               config: ServeConfig, exc: BaseException, gpu_backend: str,
                               verify_deadline_s: float, say: Progress,
                               exclusions: Exclusions | None = None) -> None:
    """Tear down and verify a run whose start raised (a bug, a store error, Ctrl-C, a cancelled
    task), and record it ``failed`` if the store still answers. Never raises: the caller
    re-raises the original exception."""
    interrupted = isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt, SystemExit))
    cause = "interrupted" if interrupted else "error"
    detail = "interrupted while starting" if interrupted else \
        f"{type(exc).__name__} while starting: {scrubber_for(run.id)(str(exc)) or ''}"
    say(f"{detail}: tearing down")
    try:
        await asyncio.shield(stop_server(
            executor, store, run, grace_s=min(config.grace_s, 10.0), gpu_backend=gpu_backend,
            verify_deadline_s=verify_deadline_s, status="failed", cause=cause, detail=detail,
            progress=say, exclusions=exclusions))
    except BaseException as second:  # the first exception is the one the caller raises
        say(f"teardown after the error failed too: {type(second).__name__}: {second}")


async def _fail(executor: Executor, store: Store, adapter: EngineAdapter, run: RunRecord,
                config: ServeConfig, cause: str, detail: str | None, phases: dict[str, float],
                note: str | None, gpu_backend: str, verify_deadline_s: float,
                say: Progress, exclusions: Exclusions | None = None) -> StartOutcome:
    scrub = scrubber_for(run.id)
    tail = scrub(await log_tail(executor, run)) or ""
    detail = scrub(detail)
    say(f"failed ({cause}): tearing down")
    t0 = time.monotonic()
    report = await stop_server(executor, store, run, grace_s=min(config.grace_s, 10.0),
                               gpu_backend=gpu_backend, verify_deadline_s=verify_deadline_s,
                               status="failed", cause=cause, detail=detail, log_tail_text=tail,
                               exclusions=exclusions)
    phases["teardown_s"] = round(time.monotonic() - t0, 3)
    final = store.get_run(run.id).model_copy(update={"phases": phases})
    store.save_run(final)
    return StartOutcome(run=final, ok=False, cause=cause, detail=detail, log_tail=tail,
                        teardown=report, validation_note=note, phases=phases)


async def stop_server(
    executor: Executor,
    store: Store,
    run: RunRecord,
    *,
    grace_s: float = 30.0,
    gpu_backend: str = "auto",
    verify_deadline_s: float = 60.0,
    verify_settle_s: float | None = None,
    status: str = "stopped",
    cause: str | None = None,
    detail: str | None = None,
    log_tail_text: str | None = None,
    progress: Progress | None = None,
    exclusions: Exclusions | None = None,
) -> TeardownReport:
    """Teardown of a recorded run (``docs/teardown.md``), verification, and the record updated.

    A record from another boot of the host names no live process: nothing is signalled, the
    host is verified, and the record is closed (``host_rebooted``). A record from another
    machine (a shared store, the same host name) is refused with exit code 2 and left as it is:
    the run may be alive there. A run asked to stop (``status`` ``stopped``) whose server had
    ended by itself (the supervisor recorded its exit status, 0 included) is recorded
    ``crashed`` with the exit's cause, the reason for the stop kept in its detail: a run is
    ``stopped`` only when cleanslate ended it. The teardown always runs to its end before the
    store is written; a store error is raised after it. ``exclusions``: see :func:`verify_options`.
    ``verify_settle_s``: the verification's settle window (``None``: the default,
    :data:`~cleanslate.verdict.check.DEFAULT_SETTLE_S`).
    """
    say = progress or (lambda _m: None)
    # The run's log and state are read only from its folder in the store's own artifacts
    # folder (an InputError, before anything is signalled, when another user could write it).
    artifacts = store.artifacts_root if executor.is_local else None
    settle = {"verify_settle_s": verify_settle_s} if verify_settle_s is not None else {}
    scrub = scrubber_for(run.id)
    leftovers = engine_class(run.engine).leftovers
    verify = verify_options(run, gpu_backend=gpu_backend, exclusions=exclusions)
    boot_id, machine_id = await host_identity(executor)
    if run.machine_id and machine_id and run.machine_id != machine_id:
        reason = (f"run {run.id} was launched on machine {run.machine_id}, and {executor.name} "
                  f"is machine {machine_id}: stop it from that machine")
        return await skip_teardown(executor, reason, ExitCode.INPUT, progress=say)
    if run.boot_id and boot_id and run.boot_id != boot_id:
        reason = (f"run {run.id} was launched on boot {run.boot_id} of {executor.name}, which "
                  f"has rebooted since (boot {boot_id}): its processes cannot exist any more")
        report = await skip_teardown(executor, reason, None, verify=verify,
                                     verify_deadline_s=verify_deadline_s, progress=say,
                                     **settle)
        status, cause, detail = "stopped", cause or "host_rebooted", detail or reason
    else:
        if status == "stopped" and run.status in ("starting", "ready"):
            # Asked to stop a run that was serving: did its server end before we came? Then it
            # crashed, whatever its exit status (0 too) and whatever the stop was for.
            how, ended, why = await ended_before_stop(executor, run, None, artifacts=artifacts)
            if how == "crashed":
                if cause is None:
                    detail = detail or why
                else:
                    detail = f"{why}; stopped for {cause}" + (f": {detail}" if detail else "")
                status, cause = "crashed", ended
        if run.status == RunStatus.LAUNCHING:
            run = await _launched_since(executor, run, artifacts)
        cgroup = valid_cgroup(run.cgroup, run.id)
        if run.cgroup and cgroup is None:
            say(f"ignoring the recorded cgroup {run.cgroup!r}: not this run's")
        backend = None
        if gpu_backend != "none":
            with contextlib.suppress(InputError):
                backend = await resolve_backend(
                    run_gpu_backend(gpu_backend, run.engine, run.env), executor)
        spec = ScopeSpec(
            root=(run.pid, run.create_time) if run.pid and run.create_time else None,
            supervisor=(run.supervisor_pid, run.supervisor_create_time)
            if run.supervisor_pid and run.supervisor_create_time else None,
            pgid=run.pgid, sid=run.sid, marker=run.marker, signature=run.engine,
            gpus=frozenset(run.gpus) if run.gpus is not None else None, port=run.port,
            cgroup=cgroup, cgroup_id=run.cgroup_id, uid=run.uid,
            not_before=run.started_at, not_after=run.stopped_at,
            exclude_roots=frozenset({os.getpid()}),
            tree=run_file(executor, run, TREE_FILE, artifacts),
        )
        report = await teardown(
            executor, spec, grace_s=grace_s, verify=verify,
            verify_deadline_s=verify_deadline_s, **settle,
            remove_shm=shm_remover(run, leftovers), progress=say, gpu=backend,
        )
    if status == "stopped" and cause is None and run.status in ("starting", "ready") \
            and run.pid and not any(t.pid == run.pid and t.why == "root"
                                    for t in report.targets):
        # No exit status was recorded (its supervisor is gone too), but the root was gone.
        status, cause = "crashed", "exited"
        detail = detail or (f"the server's root process {run.pid} was gone before `stop`; its "
                            "exit status was not recorded (the run's supervisor is gone too)")
    if log_tail_text is None and status != "stopped":
        log_tail_text = await log_tail(executor, run, artifacts=artifacts)
    updated = run.model_copy(update={
        # a run already closed keeps how it ended: a second `stop` of a crashed run verifies
        # the host again, it does not turn the crash into a stop
        "status": status if run.status not in ("stopped", "failed", "crashed") else run.status,
        "cause": cause or run.cause,
        "detail": scrub(detail) or run.detail,
        "log_tail": scrub(log_tail_text) if log_tail_text is not None else run.log_tail,
        "stopped_at": time.time(),
        "teardown": report,
        "verdict_after": report.verify,
    })
    store.save_run(updated)
    return report


async def _launched_since(executor: Executor, run: RunRecord,
                          artifacts: Path | None) -> RunRecord:
    """A ``launching`` record (its launcher died before it recorded the PIDs) with the cgroup
    its supervisor reported since in its state file (read only from the run's own folder:
    :func:`~cleanslate.launch.ready.run_state`): that path with its id, when it is a path this
    run's cgroup can have (:func:`~cleanslate.teardown.valid_cgroup`), so teardown acts on the
    very cgroup the supervisor made. The PIDs are not taken from it: the run's processes are
    found by its marker and its cgroup, never by bare numbers."""
    state = await run_state(executor, run, artifacts=artifacts)
    if state is None:
        return run
    made = state.get("cgroup")
    cgroup = valid_cgroup(made, run.id) if isinstance(made, str) else None
    cgroup_id, uid = state.get("cgroup_id"), state.get("uid")
    if cgroup is None or not isinstance(cgroup_id, int) or isinstance(cgroup_id, bool):
        return run
    return run.model_copy(update={
        "cgroup": cgroup, "cgroup_id": cgroup_id,
        "uid": uid if isinstance(uid, int) and not isinstance(uid, bool) else run.uid})


def describe_exit(code: int) -> tuple[str, str]:
    """(cause, detail) of an engine root's exit status as the supervisor recorded it: a
    negative status is the signal that killed it (``-9``: SIGKILL)."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return "killed", f"the server was killed by {name} (exit status {code})"
    return "exited", f"the server exited with status {code}"


async def ended_before_stop(executor: Executor, run: RunRecord, detail: str | None,
                            when: str = "before `stop`", *, artifacts: Path | None = None
                            ) -> tuple[str, str | None, str | None]:
    """(status, cause, detail) for a serving run that ``stop`` was asked to end, or whose
    foreground wait saw its engine exit: ``stopped`` while its server still runs, else
    ``crashed`` with the cause from its log (``model_load``, ``oom``...) or from its exit
    status (``killed`` by a signal, ``exited``)."""
    code = await run_exit_code(executor, run, artifacts=artifacts)
    if code is None:
        return "stopped", None, detail
    found: tuple[str, str] | None = None
    try:
        adapter = engine_class(run.engine)()
    except (InputError, TypeError):
        adapter = None  # an engine that needs its options (command): the exit status says why
    if adapter is not None:
        found = await classify_run_log(executor, adapter, run, returncode=code,
                                       artifacts=artifacts)
    cause, why = found if found is not None else describe_exit(code)
    return "crashed", cause, detail or f"{when}: {why}"


async def run_exit_code(executor: Executor, run: RunRecord, *,
                        artifacts: Path | None = None) -> int | None:
    """The engine root's exit status from the supervisor's state, ``None`` while it runs (or
    when the state is not in the run's own folder: :func:`~cleanslate.launch.ready.run_state`,
    ``artifacts`` the store's artifacts folder)."""
    state = await run_state(executor, run, artifacts=artifacts)
    code = None if state is None else state.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None
