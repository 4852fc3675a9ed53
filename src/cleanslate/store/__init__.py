"""The store: one SQLAlchemy URL for runs, studies, trials and their evidence.

A SQLite file ``./cleanslate.db`` by default, ``--store URL`` or ``CLEANSLATE_STORE`` otherwise
(PostgreSQL for fleets). Optuna's tables live in the same database; ours are prefixed ``cs_``.
Artifacts (logs) live in a folder beside the database (:func:`artifacts_root`).

The store never holds a secret: every record is redacted on the way in and again on the way out
(:meth:`Store.redacted`), a SQLite file is created with mode 0600 and the artifacts folder with
0700, and its URL is printed only through :func:`display_url` (no password).
"""

from __future__ import annotations

from cleanslate.store._store import (
    DEFAULT_STORE_URL,
    STORE_ENV,
    RunRecord,
    Store,
    TrialRecord,
    artifacts_root,
    display_url,
    resolve_store_url,
)

__all__ = [
    "DEFAULT_STORE_URL",
    "STORE_ENV",
    "RunRecord",
    "Store",
    "TrialRecord",
    "artifacts_root",
    "display_url",
    "resolve_store_url",
]
