"""The store: one SQLAlchemy URL for runs, studies, trials and their evidence.

A SQLite file ``./cleanslate.db`` by default, ``--store URL`` or ``CLEANSLATE_STORE`` otherwise
(PostgreSQL for fleets). Optuna's tables live in the same database; ours are prefixed ``cs_``.
Artifacts (logs) live in a folder beside the database (:func:`artifacts_root`).
"""

from __future__ import annotations

from cleanslate.store._store import (
    DEFAULT_STORE_URL,
    STORE_ENV,
    RunRecord,
    Store,
    TrialRecord,
    artifacts_root,
    resolve_store_url,
)

__all__ = [
    "DEFAULT_STORE_URL",
    "STORE_ENV",
    "RunRecord",
    "Store",
    "TrialRecord",
    "artifacts_root",
    "resolve_store_url",
]
