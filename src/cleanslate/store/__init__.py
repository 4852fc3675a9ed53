"""The store: one SQLAlchemy URL for runs, studies, trials and their evidence.

A SQLite file ``./cleanslate.db`` by default, ``--store URL`` or ``CLEANSLATE_STORE`` otherwise
(PostgreSQL for fleets). Optuna's tables live in the same database; ours are prefixed ``cs_``.
Artifacts (logs) live in a folder beside the database (:func:`artifacts_root`).

What crosses the store is a frozen record with a schema version: :class:`RunRecord`,
:class:`TrialRecord`, :class:`StudyRecord`, :class:`LeaseRecord`, :class:`SlotRecord`,
:class:`HostRecord` (a host's doctor snapshot), :class:`BenchRecord` (a ``bench``)
(``_records``, ``_trials``, ``_leases``, ``_hosts``, ``_benches``), their statuses
:class:`StrEnum` values. Other packages import these names from here, never from the private
modules. The JSON a record dumps is the JSON a row holds.

The store never holds a secret: every record is redacted on the way in and again on the way out
(:meth:`Store.redacted`), a SQLite file is created with mode 0600 and the artifacts folder with
0700, and its URL is printed only through :func:`display_url` (no password).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports
from cleanslate.store._leases import (
    Claim,
    LeaseOutcome,
    LeaseRecord,
    LeaseState,
    SlotRecord,
    SlotState,
    config_key,
)
from cleanslate.store._records import (
    SCHEMA_VERSION,
    NewerSchemaError,
    Record,
    RunRecord,
    RunStatus,
)
from cleanslate.store._store import (
    DEFAULT_STORE_URL,
    STORE_ENV,
    Store,
    artifacts_root,
    display_url,
    resolve_store_url,
    study_digest,
)

if TYPE_CHECKING:
    from cleanslate.store._benches import BenchKind, BenchRecord, bench_url, new_bench_id
    from cleanslate.store._hosts import HostRecord, local_machine
    from cleanslate.store._trials import (
        GuidedStep,
        LevelVerdict,
        Race,
        Replicate,
        StudyRecord,
        StudyStatus,
        TrialCause,
        TrialRecord,
        TrialStatus,
        level_metric,
        trial_bottlenecks,
    )

# A trial's levels need the benchmark client, which the commands that read only runs
# (``check``, ``stop``) never load: the names of ``_trials`` load when first used.
__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(("GuidedStep", "LevelVerdict", "Race", "Replicate", "StudyRecord",
                     "StudyStatus",
                     "TrialCause", "TrialRecord", "TrialStatus", "level_metric",
                     "trial_bottlenecks"),
                    "cleanslate.store._trials"),
    **dict.fromkeys(("HostRecord", "local_machine"), "cleanslate.store._hosts"),
    **dict.fromkeys(("BenchKind", "BenchRecord", "bench_url", "new_bench_id"),
                    "cleanslate.store._benches")})


__all__ = [
    "DEFAULT_STORE_URL",
    "SCHEMA_VERSION",
    "STORE_ENV",
    "BenchKind",
    "BenchRecord",
    "Claim",
    "GuidedStep",
    "HostRecord",
    "LeaseOutcome",
    "LeaseRecord",
    "LeaseState",
    "LevelVerdict",
    "NewerSchemaError",
    "Race",
    "Record",
    "Replicate",
    "RunRecord",
    "RunStatus",
    "SlotRecord",
    "SlotState",
    "Store",
    "StudyRecord",
    "StudyStatus",
    "TrialCause",
    "TrialRecord",
    "TrialStatus",
    "artifacts_root",
    "bench_url",
    "config_key",
    "display_url",
    "level_metric",
    "local_machine",
    "new_bench_id",
    "resolve_store_url",
    "study_digest",
    "trial_bottlenecks",
]
