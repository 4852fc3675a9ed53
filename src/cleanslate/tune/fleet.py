"""Trials in parallel: one worker per slot, leases in the store, re-queue and quarantine per slot.

A *slot* is (host, GPUs, port) (:class:`~cleanslate.tune.study.Slot`). Each slot runs one trial
at a time in its own asyncio task (``cleanslate tune`` with several slots), or in a process of
its own on any machine (``cleanslate worker``); both claim work the same way, from the store:

- **Leases.** A slot claims a configuration with :meth:`~cleanslate.store.Store.claim_lease`
  (atomic across processes: ``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL) and
  renews the lease every ``lease_timeout_s / 3`` while its trial runs. Grid and ablation hand
  out each planned configuration once (by its key); TPE and random ask Optuna's sampler, whose
  RDB storage makes ``ask()`` safe across processes and whose ``constant_liar`` keeps it from
  proposing what is already running.
- **Re-queue.** A lease whose heartbeat is older than the timeout (or whose worker, on this
  machine, is not running any more) is expired by the next claim: its configuration goes back
  to the queue, its trial is recorded ``infra_failed`` (``controller_died``), and its run is
  torn down on its host by marker. Where that is not possible (the host does not answer), the
  slot is ``suspect``: it gets no new trial until it verifies clean.
- **Quarantine.** A slot still dirty after ``retries`` cleanings is ``quarantined`` with the
  findings; its trial goes back to the queue for another slot and the study goes on. Only
  when every slot is quarantined does the study stop with ``quarantine``.
- **Host snapshots.** Before a host's first trial, one doctor snapshot of it is recorded for
  the study (``cs_hosts``): the slots of a host wait for the one probe, and a worker on a host
  the study has a snapshot of already takes none. A probe that fails or times out is recorded
  with why, and the study goes on.
- **Scope.** A slot's checks are about its GPUs and its port; the processes of this study's
  runs on the host's other slots are not strays there (their markers are excluded), but memory
  they hold on this slot's GPUs is a finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from cleanslate.doctor.snapshot import snapshot_host
from cleanslate.errors import CleanslateError, InputError
from cleanslate.hosts import executor_for
from cleanslate.hosts.base import Executor
from cleanslate.launch.launcher import new_run_id
from cleanslate.launch.lifecycle import Exclusions, current_baseline, stop_server
from cleanslate.store import (
    Claim,
    HostRecord,
    LeaseOutcome,
    LeaseRecord,
    LeaseState,
    Replicate,
    RunStatus,
    SlotRecord,
    SlotState,
    Store,
    TrialCause,
    TrialRecord,
    TrialStatus,
    config_key,
    local_machine,
)
from cleanslate.tune._systemic import stop_if_systemic
from cleanslate.tune.notebook import Proposal, noted, path_state
from cleanslate.tune.race import Racer, decided_by_crash, tie_set
from cleanslate.tune.space import distributions, mark_feasible, planned_configs, trial_budget
from cleanslate.tune.study import Slot, StudySpec
from cleanslate.tune.trial import (
    HostQuarantined,
    Interrupted,
    how_to_proceed,
    run_replicate,
    run_trial,
    verdict_of,
)
from cleanslate.tune.view import TuneView
from cleanslate.verdict.check import CheckOptions, CheckReport, check_hosts
from cleanslate.verdict.findings import Finding, Severity, Verdict
from cleanslate.verdict.rules import Scope

#: User attribute of an Optuna trial: the id of the lease it runs under (a controller that
#: starts fails only the running trials whose lease is not held any more).
LEASE_ATTR = "lease"

#: Why a slot's worker stopped: its share of the plan or budget is done, the time budget is
#: used, it was asked to stop, or the slot is quarantined.
DONE, HOURS, INTERRUPTED, QUARANTINE = "done", "hours", "interrupted", "quarantine"


class LeaseLost(CleanslateError):
    """A slot's lease expired while it measured more of its trial (a race): it stops measuring;
    the trial's result already recorded stands or is discarded by the lease's release."""


# -- workers ---------------------------------------------------------------------------------------


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> str:
    """Field 22 of ``/proc/PID/stat`` (the start time in clock ticks), ``""`` when gone."""
    stat = _read(f"/proc/{pid}/stat")
    return stat.rsplit(")", 1)[-1].split()[19] if ")" in stat else ""


def _pid_namespace() -> str:
    with contextlib.suppress(OSError):
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:").strip("[]")
    return ""


def _this_machine() -> str:
    """``hostname/boot id/PID namespace``: where a PID names the same process as here."""
    boot = _read("/proc/sys/kernel/random/boot_id")[:8]
    return f"{socket.gethostname()}/{boot}/{_pid_namespace()}"


def worker_id() -> str:
    """This process as a lease's owner: ``hostname/boot/pidns/PID/start ticks`` (a PID reused
    after the worker died has another start time)."""
    pid = os.getpid()
    return f"{_this_machine()}/{pid}/{_start_ticks(pid)}"


def worker_gone(worker: str) -> bool:
    """Whether the worker that holds a lease is known not to run any more: it ran on this
    machine, in this PID namespace, since this boot, and its PID is gone or is another process
    now. A worker elsewhere is never known gone (its lease expires by its timeout)."""
    machine, _, rest = worker.rpartition("/")
    machine, _, pid = machine.rpartition("/")
    if machine != _this_machine() or not pid.isdigit():
        return False
    return _start_ticks(int(pid)) != rest


# -- a slot's scope --------------------------------------------------------------------------------


def other_slots_markers(store: Store, study: str, host: str, slot: Slot) -> Exclusions:
    """The markers a slot's checks leave alone, read when called: the runs of this study on
    ``host`` on another slot, recorded running (their port and GPUs are not this slot's) or
    about to launch (the ``run_id`` of another slot's active lease, recorded before its
    launch)."""
    gpus = tuple(slot.gpus) if slot.gpus is not None else None

    def read() -> frozenset[str]:
        out = {lease.run_id for lease in store.leases(study, state=LeaseState.ACTIVE)
               if lease.host == host and lease.slot != slot.key and lease.run_id}
        for status in (s for s in RunStatus if s.running):
            out |= {run.id for run in store.runs(status=status, study=study)
                    if run.host == host and (run.port, run.gpus) != (slot.port, gpus)}
        return frozenset(out)

    return read


def _errors(report: CheckReport | None) -> tuple[Finding, ...]:
    if report is None:
        return ()
    return tuple(f for h in report.hosts for f in h.findings
                 if f.severity in (Severity.ERROR, Severity.UNKNOWN))


# -- the fleet -------------------------------------------------------------------------------------


def _in_distribution(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value``, as JSON gave it back, is one of ``dist``'s values: of a categorical
    one's choices with its type (``1`` is not ``True``, ``"16"`` is not ``16``), an integer
    or a finite number within an int or float range and on its step."""
    if isinstance(dist, CategoricalDistribution):
        return any(type(choice) is type(value) and choice == value for choice in dist.choices)
    if isinstance(dist, IntDistribution):
        if type(value) is not int:
            return False
    elif isinstance(dist, FloatDistribution):
        if type(value) not in (int, float) or not math.isfinite(value):
            return False
    else:
        return False
    try:
        return bool(dist._contains(dist.to_internal_repr(value)))
    except (ValueError, TypeError, OverflowError):
        return False


@dataclass
class SlotEnd:
    """How one slot's worker ended, and what it did."""

    slot: Slot
    why: str
    trials: int = 0
    infra_failures: int = 0
    message: str = ""
    report: CheckReport | None = None


@dataclass
class Fleet:
    """One process's workers of a study: the Optuna study, the plan, and what they share."""

    store: Store
    spec: StudySpec
    study: optuna.Study
    view: TuneView
    stop: asyncio.Event
    gpu_backend: str = "auto"
    worker: str = field(default_factory=worker_id)
    labels: bool = False
    _clock: float = field(default_factory=time.monotonic)
    _executors: dict[str, Executor] = field(default_factory=dict)
    _snapshots: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    # strategy: guided: the step the next fresh lease runs, and each running trial's step
    _proposal: Proposal | None = None
    _steps: dict[int, Proposal] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.dists = distributions(self.spec)
        self.total = trial_budget(self.spec)
        plan = planned_configs(self.spec)
        self.plan = None if plan is None else list(
            {self._key(p): (self._key(p), p) for p in plan}.values())
        # The store keeps parameters redacted: a claimed plan entry runs with its own values.
        self.params = {k: p for k, p in self.plan or ()}
        base = dict(self.spec.baseline) if plan is None and self.spec.baseline else None
        self.first = [(self._key(base), base)] if base else []
        self.poll_s = min(2.0, self.spec.lease_timeout_s / 3)

    def claim(self, template: LeaseRecord, say: Callable[[str], None]) -> Claim:
        """The next lease of ``template``'s slot (:meth:`~cleanslate.store.Store.claim_lease`),
        every re-queued configuration checked against the study's space
        (:meth:`lease_problem`); a row that is not a lease of this study is marked ``invalid``
        by the store, said as a warning, and skipped: the worker goes on."""
        claim = self.store.claim_lease(
            template, timeout_s=self.spec.lease_timeout_s, plan=self.plan, first=self.first,
            limit=self.total, gone=lambda lease: worker_gone(lease.worker),
            valid=self.lease_problem)
        for bad in claim.invalid:
            say(f"warning: lease row {bad.id} in the store is not a lease of this study: "
                f"{bad.reason}; marked invalid and skipped")
        return claim

    def lease_problem(self, lease: LeaseRecord) -> str | None:
        """Why a re-queued lease's configuration is not one this study may run (``None``: it
        is): no parameters, a key that is not its parameters', a flag that is not in the
        space, or a value that is not one of the space's (a planned configuration must be one
        of the plan's). The store marks such a row ``invalid`` and the claim goes on."""
        params = lease.params
        if not params:
            return "it names no parameters"
        if lease.key != self._key(params):
            return "its key is not the key of its parameters"
        if self.plan is not None and lease.key not in self.params:
            return "its configuration is not one of the study's plan"
        for name, value in params.items():
            dist = self.dists.get(name)
            if dist is None:
                return f"{name[:80]!r} is not a flag of the study's space"
            if not _in_distribution(dist, value):
                return f"{name}: {str(value)[:80]!r} is not a value of the study's space"
        return None

    def _key(self, params: dict[str, Any]) -> str:
        """A configuration's key as the store compares it (its redacted parameters)."""
        return config_key(self.store.redacted(dict(params)))

    def tick(self) -> float:
        """Add the wall time since the last tick to the study; returns its total (seconds)."""
        now = time.monotonic()
        spent = self.store.add_study_time(self.spec.name, now - self._clock)
        self._clock = now
        return spent

    def hours_used(self) -> bool:
        hours = self.spec.budget.hours
        return hours is not None and self.tick() >= hours * 3600

    # -- the slots --

    async def run(self, slots: list[Slot]) -> list[SlotEnd]:
        """Run one worker per slot until each is done, quarantined or stopped. An error in one
        (a bug, the store gone) cancels the others: each tears its trial down and gives its
        lease back, then the error goes on."""
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._work(slot, self.executor(slot.host)))
                         for slot in slots]
        finally:
            await self.close()
        return [t.result() for t in tasks]

    def executor(self, host: str) -> Executor:
        """The executor of ``host``, one per host for the whole fleet: the slots of a host share
        its SSH connection, which is closed once, when every slot is done (:meth:`close`)."""
        if host not in self._executors:
            self._executors[host] = executor_for(host)
        return self._executors[host]

    async def close(self) -> None:
        """Close the hosts' connections (after the slots have ended)."""
        snapshots, self._snapshots = list(self._snapshots.values()), {}
        for task in snapshots:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        executors, self._executors = list(self._executors.values()), {}
        for executor in executors:
            with contextlib.suppress(Exception):
                await executor.close()

    def _say(self, slot: Slot) -> Callable[[str], None]:
        if not self.labels:
            return self.view.phase
        return lambda message: self.view.phase(f"[{slot.key}] {message}")

    async def host_snapshot(self, executor: Executor, say: Callable[[str], None]) -> None:
        """Record the study's doctor snapshot of ``executor``'s host unless the study has one
        (:mod:`cleanslate.store._hosts`): one probe per host for every slot on it, waited for
        by each. Never raises (except ``CancelledError``): a failed probe is recorded with why,
        and a store that refuses it is said."""
        task = self._snapshots.get(executor.name)
        if task is None:
            task = asyncio.ensure_future(self._record_snapshot(executor, say))
            self._snapshots[executor.name] = task
        # Until the probe ends or the study is asked to stop (a hung nvidia-smi does not hold
        # Ctrl-C up to the deadline); a slot cancelled while it waits leaves the probe to the
        # others (asyncio.wait cancels neither).
        stopping = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()

    async def _record_snapshot(self, executor: Executor, say: Callable[[str], None]) -> None:
        machine = local_machine() if executor.is_local else ""
        try:
            if self.store.has_host(self.spec.name, executor.name, machine):
                return
            say(f"doctor snapshot of {executor.name}")
            snapshot = await snapshot_host(executor)
            saved = self.store.save_host(HostRecord(study=self.spec.name, host=executor.name,
                                                    machine=machine, snapshot=snapshot))
        except InputError as exc:
            say(f"the doctor snapshot of {executor.name} was not recorded: {exc.message}")
            return
        except Exception as exc:  # a bug here must not end the study: said, not raised
            say(f"the doctor snapshot of {executor.name} was not recorded: "
                f"{type(exc).__name__}: {exc}")
            return
        if saved is not None:
            say(f"{executor.name}: {snapshot.summary()}")

    async def _work(self, slot: Slot, executor: Executor) -> SlotEnd:
        say = self._say(slot)
        spec = self.spec.for_slot(slot)
        end = SlotEnd(slot=slot, why=DONE)
        await self.host_snapshot(executor, say)
        exclusions = other_slots_markers(self.store, spec.name, executor.name, slot)
        template = LeaseRecord(study=spec.name, key="", worker=self.worker, host=executor.name,
                               gpus=slot.gpus, port=slot.port, slot=slot.key)
        while True:
            if self.stop.is_set():
                end.why = INTERRUPTED
                return end
            if self.hours_used():
                end.why, end.message = HOURS, f"time budget of {spec.budget.hours:g} h used"
                return end
            if not await self.usable(slot, executor, spec, exclusions, say, end):
                return end
            if spec.strategy == "guided" and not self._guide(say, end):
                return end
            claim = self.claim(template.model_copy(update={"run_id": new_run_id()}), say)
            for lost in claim.expired:
                await self.requeue(lost, say)
            if claim.lease is None:
                if claim.done:
                    return end
                await self._wait()
                continue
            await self._one(claim.lease, claim.finished + claim.active, slot, executor, spec,
                            exclusions, say, end)
            if end.why != DONE:
                return end

    async def _wait(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), timeout=self.poll_s)

    def _guide(self, say: Callable[[str], None], end: SlotEnd) -> bool:
        """``strategy: guided``: read the notebook for the next step (:func:`path_state`);
        ``False`` when the path has ended (said, and the slot's end says why)."""
        state = path_state(self.spec, self.store.trials(self.spec.name))
        self._proposal = state.proposal
        if state.proposal is None:
            end.message = f"the guided path ended: {state.ended}"
            say(end.message)
            return False
        return True

    def _guided_trial(self, lease: LeaseRecord, proposal: Proposal) -> optuna.trial.Trial:
        """The Optuna trial of a guided step: its configuration as it is, or with the flags the
        sampler picks (``proposal.sample``) asked of it, the others enqueued at the
        incumbent's values."""
        if not proposal.sample:
            return self._fixed_trial(lease, dict(proposal.params))
        held = {k: v for k, v in proposal.params.items() if k not in proposal.sample}
        if held:
            self.study.enqueue_trial(held, skip_if_exists=False)
        trial = self.study.ask(self.dists)
        trial.set_user_attr(LEASE_ATTR, lease.id)
        return trial

    def _fixed_trial(self, lease: LeaseRecord, params: dict[str, Any]) -> optuna.trial.Trial:
        frozen = optuna.trial.create_trial(
            state=optuna.trial.TrialState.RUNNING, params=params,
            distributions={k: self.dists[k] for k in params},
            user_attrs={LEASE_ATTR: lease.id})
        storage = self.study._storage
        return optuna.trial.Trial(self.study, storage.create_new_trial(
            self.study._study_id, template_trial=frozen))

    def _trial_for(self, lease: LeaseRecord) -> tuple[optuna.trial.Trial, LeaseRecord | None]:
        """The Optuna trial of a lease: a fixed configuration (planned, the baseline, a
        re-queued one) is created as it is; a new one is asked of the sampler. The lease is
        bound to its trial number (and key and parameters); ``None`` when it expired before
        (the trial is then failed: another worker runs the configuration)."""
        proposal, self._proposal = self._proposal, None
        if lease.params:
            params = dict(self.params.get(lease.key, lease.params))
            trial = self._fixed_trial(lease, params)
            values: dict[str, Any] = {"trial": trial.number, "params": params}
            if proposal is not None and proposal.params == params:
                self._steps[trial.number] = proposal
        elif proposal is not None:
            trial = self._guided_trial(lease, proposal)
            params = dict(trial.params)
            values = {"trial": trial.number, "params": params, "key": self._key(params)}
            self._steps[trial.number] = proposal
        else:
            trial = self.study.ask(self.dists)
            trial.set_user_attr(LEASE_ATTR, lease.id)
            params = dict(trial.params)
            values = {"trial": trial.number, "params": params, "key": self._key(params)}
        try:
            return trial, self.store.bind_lease(lease, **values)
        except ValueError:
            self._fail(trial)
            return trial, None

    async def _one(self, lease: LeaseRecord, index: int, slot: Slot, executor: Executor,
                   spec: StudySpec, exclusions: Exclusions, say: Callable[[str], None],
                   end: SlotEnd) -> None:
        """One leased trial on a slot, its lease renewed while it runs and given back with its
        outcome; sets ``end.why`` when the slot stops (quarantine, interrupted)."""
        heart: asyncio.Task[None] | None = None
        trial: optuna.trial.Trial | None = None
        try:
            trial, bound = self._trial_for(lease)
            if bound is None:
                say(f"lease {lease.id} expired before its trial started: left to others")
                end.infra_failures += 1
                return
            lease = bound
            heart = asyncio.create_task(self._heartbeat(lease))
            self.view.trial_started(index, self.total, trial.number, dict(lease.params))
            if self.labels:
                say(f"trial #{trial.number} on this slot")
            record = await run_trial(executor, self.store, spec, trial.number,
                                     dict(lease.params), gpu_backend=self.gpu_backend, say=say,
                                     stop=self.stop, run_id=lease.run_id, exclusions=exclusions,
                                     slot=slot.key)
            record, lease, stopped = await self._statistics(record, lease, slot, executor,
                                                            spec, exclusions, say)
            if spec.strategy == "guided" and record.status.finished:
                record = self._note(record, say)
        except HostQuarantined as exc:
            self._fail(trial)
            self.store.release_lease(lease, LeaseOutcome.REQUEUED, "the slot is quarantined")
            self._quarantine(slot, executor, spec, exc, say, end)
            return
        except Interrupted:
            self._fail(trial)
            self.store.release_lease(lease, LeaseOutcome.REQUEUED, "interrupted")
            end.why = INTERRUPTED
            return
        except BaseException:
            # run_trial tore its server down and recorded the trial before raising.
            with contextlib.suppress(Exception):
                self._fail(trial)
                self.store.release_lease(lease, LeaseOutcome.REQUEUED, "controller error")
            raise
        finally:
            if heart is not None:
                heart.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heart
        if stop_if_systemic(self, trial, lease, record, spec, say, end):
            return  # not the configuration's failure: re-queued, every slot stopped
        if not self.store.release_lease(lease, LeaseOutcome.RESULT):
            # The lease expired while the trial ran: another worker runs the configuration,
            # and this run does not count (no configuration counted twice).
            self.store.save_trial(record.model_copy(update={
                "status": TrialStatus.INFRA_FAILED, "cause": "lease_lost",
                "detail": "the lease expired before the trial ended (no heartbeat within "
                          f"{spec.lease_timeout_s:g} s): another worker runs it"}))
            self._fail(trial)
            end.infra_failures += 1
            return
        end.trials += 1
        try:
            self._tell(trial, record, spec)
        except Exception as exc:  # the result stands in the store; the sampler misses it
            say(f"Optuna did not take trial #{trial.number}'s value: {exc}")
        self._back_to_ok(slot, executor.name, record)
        self.view.trial_finished(record, best_trial(self.store.trials(spec.name), spec))
        if stopped is not None:
            self._stopped_in_race(stopped, slot, executor, spec, say, end)

    def _note(self, record: TrialRecord, say: Callable[[str], None]) -> TrialRecord:
        """Write a guided trial's notebook entry once it is measured and raced: kept or
        reverted, with the effect (:func:`cleanslate.tune.notebook.noted`); said as its line
        and saved."""
        proposal = self._steps.pop(record.number, None)
        others = [t for t in self.store.trials(self.spec.name) if t.number != record.number]
        record, line = noted(self.spec, record, others,
                             proposal.step if proposal is not None else None)
        self.store.save_trial(record)
        say(line)
        return record

    async def _statistics(self, record: TrialRecord, lease: LeaseRecord, slot: Slot,
                          executor: Executor, spec: StudySpec, exclusions: Exclusions,
                          say: Callable[[str], None],
                          ) -> tuple[TrialRecord, LeaseRecord, BaseException | None]:
        """After a trial's first measurement: more of them, as the study's ``statistics:``
        asks (``docs/statistics.md``): ``replicates: N`` measures it until it has ``N``;
        ``auto`` races it against the incumbent on this slot when it is within the noise.
        Each measurement is a verified cycle under this slot's lease (a new run id bound to
        it before each launch). Returns the trial as recorded, the lease, and what stopped the
        measurements early (``Interrupted``, ``HostQuarantined``), for the caller to act on
        once the trial's result is in."""
        stats = spec.statistics
        if record.status != TrialStatus.FEASIBLE or (not stats.racing and
                                                    stats.fixed_count() <= 1):
            why = decided_by_crash(record)
            if why is not None and (stats.racing or stats.fixed_count() > 1):
                say(why)  # zero more launches: said, so that a reader does not wait for a race
            return record, lease, None
        bound = lease

        async def measure(trial: TrialRecord, seed: int, pair: int,
                          against: int | None) -> Replicate:
            nonlocal bound
            try:
                bound = self.store.bind_lease(bound, run_id=new_run_id())
            except ValueError:  # the lease expired: this slot no longer owns the trial
                raise LeaseLost(f"lease {bound.id} expired during the race") from None
            say(f"trial {trial.number}: one more measurement (seed {seed})")
            return await run_replicate(executor, self.store, spec, trial, seed, pair=pair,
                                       against=against, gpu_backend=self.gpu_backend, say=say,
                                       stop=self.stop, exclusions=exclusions, slot=slot.key,
                                       run_id=bound.run_id)

        racer = Racer(spec, load=self._latest_trial, save=self.store.save_trial,
                      measure=measure, trials=lambda: self.store.trials(spec.name), say=say)
        if stats.racing:
            step = self._steps.get(record.number)
            against = step.step.against if step is not None and step.step.step else None
            result = await racer.race(record, slot.key, against,
                                      step.max_pairs if step is not None else None)
        else:
            result = await racer.repeat(record)
        return result.challenger, bound, result.stopped

    def _latest_trial(self, number: int) -> TrialRecord | None:
        """The last record of trial ``number`` in the store."""
        found = [t for t in self.store.trials(self.spec.name) if t.number == number]
        return found[-1] if found else None

    def _stopped_in_race(self, stopped: BaseException, slot: Slot, executor: Executor,
                         spec: StudySpec, say: Callable[[str], None], end: SlotEnd) -> None:
        """A replicate was interrupted or found its host dirty, after the trial's own result
        was recorded: the slot stops as it would after a trial (quarantined or interrupted);
        anything else goes on up."""
        if isinstance(stopped, Interrupted):
            end.why = INTERRUPTED
            return
        if isinstance(stopped, HostQuarantined):
            self._quarantine(slot, executor, spec, stopped, say, end)
            return
        if isinstance(stopped, LeaseLost):
            say(f"{stopped}: the race ends undecided here, the slot goes on")
            return
        raise stopped

    def _quarantine(self, slot: Slot, executor: Executor, spec: StudySpec,
                    exc: HostQuarantined, say: Callable[[str], None], end: SlotEnd) -> None:
        """Record the slot quarantined with the findings of ``exc``; the slot's worker stops."""
        self.store.save_slot(SlotRecord(
            study=spec.name, slot=slot.key, host=executor.name, gpus=slot.gpus,
            port=slot.port, state=SlotState.QUARANTINED, reason=str(exc),
            findings=_errors(exc.report)))
        say(f"slot {slot.key} quarantined: {exc!s}")
        if exc.report is not None:
            say(how_to_proceed(exc.report))
        end.why, end.message, end.report = QUARANTINE, str(exc), exc.report
        end.infra_failures += 1

    def _fail(self, trial: optuna.trial.Trial | None) -> None:
        if trial is not None:
            with contextlib.suppress(Exception):
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)

    def _tell(self, trial: optuna.trial.Trial, record: TrialRecord, spec: StudySpec) -> None:
        tell_result(self.study, trial, record, spec)

    async def _heartbeat(self, lease: LeaseRecord) -> None:
        """Renew the lease every third of its timeout until cancelled; a store that does not
        answer is tried again at the next beat (the lease may expire meanwhile)."""
        timeout = self.spec.lease_timeout_s
        while True:
            await asyncio.sleep(timeout / 3)
            try:
                if not await asyncio.to_thread(self.store.heartbeat, lease, timeout):
                    self.view.phase(f"lease {lease.id} expired while its trial ran: its "
                                    "result will not count")
                    return
            except InputError:
                continue

    # -- re-queue, suspect and quarantined slots --

    async def requeue(self, lease: LeaseRecord, say: Callable[[str], None]) -> list[TrialRecord]:
        """After a lease expired: record its trial ``infra_failed`` (its configuration is back
        in the queue), fail its Optuna trial (or tell it the trial's recorded result, when its
        worker is known gone: :func:`tell_stored`), and tear its run down on its host by marker
        and cgroup;
        where that cannot be verified, its slot is suspect. Returns the trial records it
        closed."""
        say(f"lease {lease.id} of {lease.worker} on {lease.slot} expired ({lease.detail}): "
            f"trial #{lease.trial} goes back to the queue")
        closed = []
        for record in self.store.trials(self.spec.name, status=TrialStatus.RUNNING):
            if record.number == lease.trial:
                closed.append(record)
                self.store.save_trial(record.model_copy(update={
                    "status": TrialStatus.INFRA_FAILED, "cause": TrialCause.CONTROLLER_DIED,
                    "detail": f"its worker stopped renewing lease {lease.id}: {lease.detail}",
                    "finished_at": time.time()}))
        if lease.trial is not None:
            # A result recorded before its worker died is told, not failed; only for a worker
            # known gone: one alive behind a partition records its trial lease_lost when its
            # release fails, and Optuna must not hold a result cleanslate's table does not.
            result = finished_result(self.store, self.spec.name, lease.trial) \
                if worker_gone(lease.worker) else None
            if result is not None:
                say(f"trial #{lease.trial} has a recorded result: telling Optuna its value")
                tell_stored(self.study, result, self.spec)
            else:
                with contextlib.suppress(Exception):
                    self.study.tell(lease.trial, state=optuna.trial.TrialState.FAIL)
        runs = [r for r in self.store.runs(study=self.spec.name)
                if (r.id == lease.run_id or (lease.trial is not None and r.trial == lease.trial))
                and (r.status.running or verdict_of(r.verdict_after) != Verdict.CLEAN)]
        if not runs:
            return closed
        executor = self.executor(lease.host)  # shared with this host's slots: not closed here
        slot = Slot(host=lease.host, gpus=lease.gpus, port=lease.port)
        for run in runs:
            say(f"cleaning up run {run.id} of the expired lease on {run.host}")
            report = None
            with contextlib.suppress(Exception):
                report = await stop_server(
                    executor, self.store, run, grace_s=min(self.spec.grace_s, 10.0),
                    gpu_backend=self.gpu_backend, verify_deadline_s=self.spec.verify_deadline_s,
                    cause=TrialCause.CONTROLLER_DIED,
                    exclusions=other_slots_markers(self.store, self.spec.name, lease.host,
                                                   slot))
            if report is None or verdict_of(report.verify) != Verdict.CLEAN:
                why = (f"run {run.id} of expired lease {lease.id} could not be torn down "
                       "and verified" + ("" if report is None else
                                         f" ({verdict_of(report.verify)})"))
                say(f"{lease.slot} is suspect: {why}")
                self.store.save_slot(SlotRecord(
                    study=self.spec.name, slot=lease.slot, host=lease.host, gpus=lease.gpus,
                    port=lease.port, state=SlotState.SUSPECT, reason=why,
                    findings=_errors(report.verify) if report is not None else ()))
        return closed

    def _slot_record(self, slot: Slot) -> SlotRecord | None:
        return next((r for r in self.store.slots(self.spec.name) if r.slot == slot.key), None)

    async def usable(self, slot: Slot, executor: Executor, spec: StudySpec,
                      exclusions: Exclusions, say: Callable[[str], None], end: SlotEnd) -> bool:
        """Whether the slot may take a trial: a suspect slot must verify clean first (checked
        up to ``retries + 1`` times, a poll apart); one that does not is quarantined."""
        record = self._slot_record(slot)
        if record is None or record.state != SlotState.SUSPECT:
            return True
        report: CheckReport | None = None
        for attempt in range(spec.retries + 1):
            say(f"{slot.key} is suspect ({record.reason}): verifying it clean")
            options = CheckOptions(
                scope=Scope(gpus=frozenset(slot.gpus) if slot.gpus is not None else None,
                            exclude_roots=frozenset({os.getpid()})),
                ports=(slot.port,), gpu_backend=self.gpu_backend, exclusions=exclusions,
                baseline=current_baseline())
            report = await check_hosts([executor], options)
            if report.verdict == Verdict.CLEAN:
                self.store.save_slot(record.model_copy(update={
                    "state": SlotState.OK, "updated_at": time.time(),
                    "reason": f"verified clean after: {record.reason}"}))
                return True
            if attempt < spec.retries:
                await self._wait()
        message = f"{slot.key} stayed {verdict_of(report)} after it was suspect"
        self.store.save_slot(record.model_copy(update={
            "state": SlotState.QUARANTINED, "reason": message, "findings": _errors(report),
            "updated_at": time.time()}))
        end.why, end.message, end.report = QUARANTINE, message, report
        return False

    def _back_to_ok(self, slot: Slot, host: str, record: TrialRecord) -> None:
        """A slot quarantined by an earlier controller that now verified clean before a trial
        is in service again: its record says so (and keeps the old reason)."""
        old = self._slot_record(slot)
        if old is not None and old.state == SlotState.QUARANTINED and \
                record.verdict_before == Verdict.CLEAN:
            self.store.save_slot(old.model_copy(update={
                "state": SlotState.OK, "updated_at": time.time(),
                "reason": f"clean again before trial {record.number} (was quarantined: "
                          f"{old.reason})"}))


# -- one source of truth for a result: cleanslate's table, told to Optuna ------------------------

#: User attribute of an Optuna trial added by :func:`tell_stored`: the number of the trial
#: (cleanslate's and Optuna's) whose recorded result it carries, that trial having been
#: failed in Optuna before its result could be told.
RESULT_OF_ATTR = "result_of_trial"


def told_value(record: TrialRecord, spec: StudySpec) -> float:
    """The value Optuna is told for a finished trial: its value, or for an infeasible one the
    worst (0 when maximizing, 1e12 when minimizing), a value kept from the levels below a
    crash included (the sampler is not drawn to a configuration that crashed)."""
    penalty = 0.0 if spec.objective.direction == "maximize" else 1e12
    feasible = record.status == TrialStatus.FEASIBLE
    return record.value if feasible and record.value is not None and \
        math.isfinite(record.value) else penalty


def tell_result(study: optuna.Study, trial: optuna.trial.Trial, record: TrialRecord,
                spec: StudySpec) -> None:
    """Tell Optuna a finished trial's result as cleanslate recorded it: feasible or not (a
    constraint the sampler reads), its status, cause, run and replicates as attributes, and
    :func:`told_value`. Raises what Optuna raises (a trial finished already)."""
    mark_feasible(trial, record.status == TrialStatus.FEASIBLE)
    trial.set_user_attr("status", record.status.value)
    if record.cause:
        trial.set_user_attr("cause", record.cause)
    if record.run_id:
        trial.set_user_attr("run_id", record.run_id)
    if record.replicates:
        # The sampler gets the mean; the measurements it is the mean of are kept beside it.
        trial.set_user_attr("replicates", [r.value for r in record.replicates])
        trial.set_user_attr("ci", [record.ci_low, record.ci_high])
    study.tell(trial, told_value(record, spec))


def finished_result(store: Store, study: str, number: int) -> TrialRecord | None:
    """Trial ``number``'s last record in cleanslate's table when it is a result (feasible or
    infeasible), else ``None``."""
    found = [t for t in store.trials(study) if t.number == number]
    return found[-1] if found and found[-1].status.finished else None


def tell_stored(study: optuna.Study, record: TrialRecord, spec: StudySpec) -> str:
    """Make Optuna hold the result cleanslate recorded for trial ``record.number``, whatever
    it holds now. ``RUNNING`` (its worker died before telling): told now, the same trial.
    ``COMPLETE``, or a trial added earlier for it: nothing to do. Finished otherwise (``FAIL``
    told by a recovery before this rule existed, or by one that did not know the result):
    Optuna refuses a second tell, so a new ``COMPLETE`` trial with its parameters and the
    recorded result is added, marked :data:`RESULT_OF_ATTR` = its number. Returns what was
    done: ``told``, ``added`` or ``agreed`` (``missing``: Optuna has no such trial)."""
    trials = study.get_trials(deepcopy=False)
    complete = optuna.trial.TrialState.COMPLETE
    if any(t.state == complete and t.user_attrs.get(RESULT_OF_ATTR) == record.number
           for t in trials):
        return "agreed"
    frozen = next((t for t in trials if t.number == record.number), None)
    if frozen is None:
        return "missing"
    if frozen.state == complete:
        return "agreed"
    if frozen.state == optuna.trial.TrialState.RUNNING:
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            tell_result(study, optuna.trial.Trial(study, frozen._trial_id), record, spec)
            return "told"
        # Finished meanwhile by another process: as it left it, or with a trial added below.
        frozen = study._storage.get_trial(frozen._trial_id)
        if frozen.state == complete:
            return "agreed"
    template = optuna.trial.create_trial(
        state=optuna.trial.TrialState.RUNNING, params=dict(frozen.params),
        distributions=dict(frozen.distributions),
        user_attrs={RESULT_OF_ATTR: record.number})
    added = optuna.trial.Trial(study, study._storage.create_new_trial(
        study._study_id, template_trial=template))
    tell_result(study, added, record, spec)
    return "added"


def reconcile_optuna(store: Store, study: optuna.Study, spec: StudySpec,
                     held: set[int | None]) -> dict[str, int]:
    """For every trial that is a result in cleanslate's table and not one in Optuna's, tell
    Optuna the recorded result (:func:`tell_stored`); trials in ``held`` (a live worker's
    lease: it tells them itself) are left alone. Returns how many were ``told`` and
    ``added``."""
    last: dict[int, TrialRecord] = {}
    for record in store.trials(spec.name):
        last[record.number] = record
    done = {t.number: t for t in study.get_trials(deepcopy=False)}
    counts = {"told": 0, "added": 0}
    for number, record in sorted(last.items()):
        frozen = done.get(number)
        if not record.status.finished or number in held or frozen is None or \
                frozen.state == optuna.trial.TrialState.COMPLETE:
            continue
        how = tell_stored(study, record, spec)
        if how in counts:
            counts[how] += 1
    return counts


def best_trial(trials: list[TrialRecord], spec: StudySpec) -> TrialRecord | None:
    """The feasible trial with the best value in the objective's direction, among those no
    race beat (:func:`cleanslate.tune.race.tie_set`)."""
    return tie_set(trials, spec).best


__all__ = ["LEASE_ATTR", "RESULT_OF_ATTR", "Fleet", "SlotEnd", "best_trial", "finished_result",
           "other_slots_markers", "reconcile_optuna", "tell_result", "tell_stored",
           "told_value", "worker_gone", "worker_id"]
