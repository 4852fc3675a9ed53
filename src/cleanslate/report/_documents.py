"""The JSON documents a report writes (``report --json``, ``tune --json``'s ``capacity``), as
TypedDicts: the keys and the types of their values, written down once.

A document is built by the function named in its docstring; ``tests/cli/test_json_keys.py``
holds the key paths the command line promises. These are ``typing_extensions`` TypedDicts so
that a pydantic model may hold one (``TuneDone.capacity``).
"""

from __future__ import annotations

from typing import Literal, NotRequired

from typing_extensions import TypedDict

from cleanslate.store import StudyStatus
from cleanslate.tune.factors import Scalar


class ProbeDocument(TypedDict):
    """One probe of a capacity search (:func:`~cleanslate.report._capacity.probe_document`)."""

    index: int
    label: str
    load: float
    verdict: str
    attainment: float | None
    ci_low: float | None
    ci_high: float | None
    target: float | None
    requests: int
    measurements: int
    output_throughput: float | None
    cause: str | None


class CapacityDocument(TypedDict):
    """The answer of one capacity search
    (:func:`~cleanslate.report._capacity.capacity_document`)."""

    capacity: float | None
    upper: float | None
    bracket: str
    summary: str
    dimension: Literal["concurrency", "rate"]
    tolerance: float
    stopped_by: str
    resolved: bool
    crash: str | None
    cliffs: list[str]
    unresolved: list[float]
    max_goodput: float | None
    probes: list[ProbeDocument]


class CapacityCells(TypedDict):
    """A capacity search's CSV cells of one trial (:func:`~cleanslate.report._capacity.
    csv_fields`; every cell ``None`` without a search)."""

    capacity: float | None
    capacity_upper: float | None
    capacity_bracket: str | None
    probes: int | None
    stopped_by: str | None
    crash: str | None
    unresolved: str | None
    cliffs: str | None


class DifferenceDocument(TypedDict):
    """Configuration ``b`` against ``a`` (:meth:`~cleanslate.report._stats.Difference.
    document`)."""

    diff: float | None
    ci_low: float | None
    ci_high: float | None
    method: str
    verdict: str
    significant: bool
    n_a: int
    n_b: int
    pairs: int
    too_few_measurements: bool


class SharedConfigDocument(TypedDict):
    """One configuration two studies ran, ``b``'s trial against ``a``'s
    (:meth:`~cleanslate.report._data.SharedConfig.document`)."""

    params: dict[str, Scalar]
    a: int
    b: int
    a_value: float | None
    b_value: float | None
    a_n: int
    b_n: int
    diff: float | None
    ci_low: float | None
    ci_high: float | None
    method: str
    verdict: str
    significant: bool
    n_a: int
    n_b: int
    pairs: int
    too_few_measurements: bool


class SlotDocument(TypedDict):
    """One slot of a study (:meth:`~cleanslate.report._data.SlotSummary.document`);
    ``findings`` are the JSON of :class:`~cleanslate.verdict.findings.Finding`."""

    slot: str
    host: str
    trials: int
    infra_failures: int
    state: str
    reason: str | None
    findings: list[dict[str, object]]


class ComparisonDocument(TypedDict):
    """A later study against the first (:func:`~cleanslate.report._export.
    comparisons_document`)."""

    a: str
    b: str
    note: str | None
    configurations: list[SharedConfigDocument]


class BestDocument(TypedDict):
    """A study's best trial (:func:`~cleanslate.report._export.best_document`)."""

    number: int
    params: dict[str, Scalar]
    value: float | None
    ci_low: float | None
    ci_high: float | None
    n_replicates: int | None
    confidence: float
    tied_with: list[int]
    undecided_with: list[int]
    best_level: str | None
    launch_command: str
    capacity: CapacityDocument | None


class HostEffectDocument(TypedDict):
    """One slot's effect on the objective, a ratio minus one with its interval."""

    effect: float
    ci_low: float | None
    ci_high: float | None
    n: int


class StudyStatisticsDocument(TypedDict):
    """A study's ``statistics:`` block with what the statistics ran and cost
    (:func:`~cleanslate.report._export.study_document`'s ``statistics``)."""

    replicates: Literal["auto"] | int
    tie_margin: float
    confidence: float
    max_replicates: int
    max_error_rate: float
    replicates_run: int
    gpu_s: float
    total_gpu_s: float
    share: float | None
    host_effects: dict[str, HostEffectDocument]


class MovedDocument(TypedDict):
    """Which bottleneck a change of an ablation moved: the verdict that bound the baseline
    and the one that bound the change (at each one's best level, else where it missed;
    ``None``: not recorded), and ``moved``, the line that says it with the objective's change
    and interval (``max-running-requests 64 -> 256: running_cap -> offered_load, +120.5 %
    [+110.2, +131.0]``)."""

    bottleneck_before: str | None
    bottleneck_after: str | None
    moved: str


class AblationDocument(MovedDocument):
    """One change of an ablation study against its baseline
    (:class:`~cleanslate.report._data.Effect`)."""

    factor: str
    baseline: Scalar
    value: Scalar
    trial: int
    change_pct: float | None
    better: bool | None
    cause: str | None
    significant: bool
    difference: DifferenceDocument | None


class StudyDocument(TypedDict):
    """One study (:func:`~cleanslate.report._export.study_document`). ``spec`` is the stored
    study file's JSON; each of ``trials`` a trial record's JSON with the keys
    :func:`~cleanslate.report._export._trial_document` adds, each of ``hosts`` a doctor
    snapshot's JSON with the host's name, machine, label and summary."""

    study: str
    status: StudyStatus
    engine: str
    simulated: bool
    objective: dict[str, str]
    spec: dict[str, object]
    elapsed_s: float | None
    best: BestDocument | None
    statistics: StudyStatisticsDocument
    trials: list[dict[str, object]]
    ablation: list[AblationDocument]
    slots: list[SlotDocument]
    hosts: list[dict[str, object]]
    #: ``strategy: guided`` only: the lab notebook, one entry per step with its trial
    guided: NotRequired[list[dict[str, object]]]


class ExportDocument(TypedDict):
    """``report --json``: every study, and with several the later ones against the first
    (:func:`~cleanslate.report._export.to_json`)."""

    studies: list[StudyDocument]
    comparisons: NotRequired[list[ComparisonDocument]]


__all__ = ["AblationDocument", "BestDocument", "CapacityCells", "CapacityDocument",
           "ComparisonDocument", "DifferenceDocument", "ExportDocument", "HostEffectDocument",
           "MovedDocument", "ProbeDocument", "SharedConfigDocument", "SlotDocument",
           "StudyDocument", "StudyStatisticsDocument"]
