"""Failures that are not the configuration's: when a study stops instead of recording a result.

A trial that fails because of its flags is a result (``infeasible``). Some failures do not
depend on the flags at all, and recording them as the flags' result would record every
configuration of the study infeasible, one launch each (the H200 study of issue 24 whose model
path did not exist: four trials, four ``python_exception``\\ s, "no feasible configuration").
:func:`systemic_failure` decides, from the study's trial records and the trial that just
ended, whether its failure is one of those:

- its cause is one of :data:`SYSTEMIC_CAUSES`: the model cannot be loaded (``model_load``),
  the engine's executable is missing (``engine_missing``), the port is held by another process
  (``port_in_use``). One such failure is enough.
- or the first three results of the study (in trial order, the one that just ended among
  them), whose configurations differ in their flags, failed with the same cause and the same
  text once numbers, paths, hexadecimal ids and addresses are replaced by placeholders
  (:func:`normalized`): the same line three times from three different command lines says the
  command line is not what fails. Causes that flags commonly produce with a text that does not
  name the flag (:data:`FLAG_CAUSES`: out of memory, every SLO missed) are left out of this
  rule.

:func:`stop_if_systemic` applies the decision in a fleet's slot: the trial is recorded
``infra_failed`` with cause ``not_the_configuration`` (the detail says why), its lease is given
back ``requeued``, the earlier trials of the same failure are re-marked the same way and their
leases re-queued (:meth:`~cleanslate.store.Store.requeue_results`), so that every one of those
configurations runs again when the study is resumed, and every slot of the process is stopped.
The study ends ``stopped_by="systemic"`` and is recorded with status ``error``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanslate.store import LeaseOutcome, LeaseRecord, TrialRecord, TrialStatus

if TYPE_CHECKING:
    import optuna

    from cleanslate.tune.fleet import Fleet, SlotEnd
    from cleanslate.tune.study import StudySpec

#: Why a slot's worker stopped (``SlotEnd.why``) and the study ended (``stopped_by``).
SYSTEMIC = "systemic"

#: The cause recorded on the trials of such a failure (their status: ``infra_failed``).
NOT_THE_CONFIGURATION = "not_the_configuration"

#: Causes that do not depend on the flags, and what each says.
SYSTEMIC_CAUSES: dict[str, str] = {
    "model_load": "the model cannot be loaded",
    "engine_missing": "the engine's executable cannot be started",
    "port_in_use": "the port is held by another process",
}

#: Causes left out of the same-text rule: the flags commonly produce them (a memory fraction
#: too high, a configuration too slow for the SLOs, or for a capacity objective's least probe)
#: with a text that does not name the flag.
FLAG_CAUSES = frozenset({"oom", "slo_miss", "nothing_passes"})

#: How many results, in trial order, must fail the same way.
SAME_TEXT_TRIALS = 3

_HEX = re.compile(r"\b(?:0x)?[0-9a-fA-F]*\d[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\b"
                  r"|\b(?:0x)?[0-9a-fA-F]*[a-fA-F][0-9a-fA-F]*\d[0-9a-fA-F]*\b")
_RUN_ID = re.compile(r"\br-\d{8}-\d{6}-[0-9a-f]{4}\b")
_PATH = re.compile(r"(?:~|\.{1,2})?(?:/[^\s'\"(),:;\[\]{}]+)+/?")
_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\blocalhost:\d+\b")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
_BLANKS = re.compile(r"\s+")


def normalized(text: str) -> str:
    """A failure's text as compared between trials: run ids, paths, addresses, hexadecimal
    words (ids, pointers, hashes) and numbers (PIDs, ports, times, sizes) replaced by
    placeholders, blanks collapsed. Flag names and words stay: two texts that differ only in
    a PID, a timestamp or a run folder compare equal; two that name different flags do not."""
    out = _RUN_ID.sub("<run>", text)
    out = _PATH.sub("<path>", out)
    out = _ADDRESS.sub("<addr>", out)
    out = _HEX.sub("<hex>", out)
    out = _NUMBER.sub("<n>", out)
    return _BLANKS.sub(" ", out).strip()


@dataclass(frozen=True)
class Systemic:
    """A failure that is not the configuration's: why (one line, for the user and the
    records), and the trial numbers it covers (the one that just ended last)."""

    reason: str
    trials: tuple[int, ...]


def _config(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _text(record: TrialRecord) -> str:
    return (record.detail or "").strip()


def systemic_failure(trials: Sequence[TrialRecord], record: TrialRecord) -> Systemic | None:
    """Whether ``record`` (a trial that just ended) failed for a reason its flags do not
    decide, given the study's other trial records ``trials`` (a record of the same number in
    it is replaced by ``record``); ``None`` when it is a result like any other (see the module
    docstring). Pure: reads only its arguments."""
    if record.status != TrialStatus.INFEASIBLE:
        return None
    cause = record.cause or ""
    line = _text(record)
    if cause in SYSTEMIC_CAUSES:
        return Systemic(
            reason=f"{SYSTEMIC_CAUSES[cause]} ({cause}), whatever the flags: "
                   f"{line or 'no line of the log says more'}",
            trials=(record.number,))
    results = sorted([t for t in trials if t.number != record.number and t.status.finished]
                     + [record], key=lambda t: t.number)[:SAME_TEXT_TRIALS]
    if len(results) < SAME_TEXT_TRIALS or record.number not in {t.number for t in results}:
        return None
    if any(t.status != TrialStatus.INFEASIBLE or t.cause != cause for t in results):
        return None
    if cause in FLAG_CAUSES or not line:
        return None
    if len({normalized(_text(t)) for t in results}) != 1:
        return None
    if len({_config(t.params) for t in results}) != len(results):
        return None  # the same configuration failing again says nothing of the others
    numbers = (*(t.number for t in results if t.number != record.number), record.number)
    return Systemic(
        reason=f"the first {len(results)} configurations (trials "
               f"{', '.join(str(n) for n in sorted(numbers))}), which differ in their flags, "
               f"failed the same way ({cause}): {line}",
        trials=numbers)


def stop_if_systemic(fleet: Fleet, trial: optuna.trial.Trial, lease: LeaseRecord,
                     record: TrialRecord, spec: StudySpec, say: Callable[[str], None],
                     end: SlotEnd) -> bool:
    """In a slot, after ``record``'s trial ended: when its failure is not the configuration's
    (:func:`systemic_failure`), record it and the earlier trials of the same failure
    ``infra_failed`` (``not_the_configuration``), give their leases back to the queue, stop
    every slot of ``fleet`` and set ``end`` (``why`` :data:`SYSTEMIC`, ``message`` the
    reason); returns whether it did. Otherwise nothing is changed."""
    if record.status != TrialStatus.INFEASIBLE:
        return False  # (no read of the store for a result that cannot be one)
    store = fleet.store
    found = systemic_failure(store.trials(spec.name), record)
    if found is None:
        return False
    detail = f"not the configuration's: {found.reason}"[:4000]
    store.save_trial(record.model_copy(update={
        "status": TrialStatus.INFRA_FAILED, "cause": NOT_THE_CONFIGURATION, "detail": detail}))
    fleet._fail(trial)
    store.release_lease(lease, LeaseOutcome.REQUEUED, detail)
    earlier = [t for t in store.trials(spec.name)
               if t.number in found.trials and t.number != record.number]
    for other in earlier:
        store.save_trial(other.model_copy(update={
            "status": TrialStatus.INFRA_FAILED, "cause": NOT_THE_CONFIGURATION,
            "detail": detail}))
    if earlier:
        store.requeue_results(spec.name, [fleet._key(t.params) for t in earlier], detail)
    say(f"stopping the study: {found.reason}")
    fleet.stop.set()
    end.why, end.message = SYSTEMIC, found.reason
    end.infra_failures += 1
    return True


__all__ = ["FLAG_CAUSES", "NOT_THE_CONFIGURATION", "SAME_TEXT_TRIALS", "SYSTEMIC",
           "SYSTEMIC_CAUSES", "Systemic", "normalized", "stop_if_systemic", "systemic_failure"]
