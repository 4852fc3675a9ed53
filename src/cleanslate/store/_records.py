"""What the store keeps: frozen records with a schema version, and the run record.

A record is a frozen pydantic model. Its nested documents are models too (a run's check
reports are :class:`~cleanslate.verdict.check.CheckReport`, its teardown a
:class:`~cleanslate.teardown.TeardownReport`); maps stay maps only where their keys are
data (flags, environment, phases). The JSON a record dumps is the JSON the store holds, key for
key, so stores written before records were typed read as they are.

Schema versions: the store writes every record with :data:`SCHEMA_VERSION` beside its fields
(``schema_version`` in the row's JSON). A row without one was written before versions were
recorded (version 1: the same JSON, untyped). To change the layout of a stored document, raise
:data:`SCHEMA_VERSION` and add to :data:`UPGRADES` the function that turns a document of the
previous version into the new one; a row of a newer version than this cleanslate knows is
refused (:class:`NewerSchemaError`), never guessed at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any, Self

from pydantic import Field, field_validator

from cleanslate.bench import ServerConfig
from cleanslate.errors import CleanslateError
from cleanslate.models import Frozen
from cleanslate.teardown import TeardownReport
from cleanslate.verdict.check import CheckReport

#: The layout of the documents this cleanslate writes. 1: before versions were recorded;
#: 2: records typed (the same JSON, with ``schema_version``); 3: a run may be ``launching``
#: (recorded before its supervisor starts), a status a reader of version 2 cannot parse;
#: 4: a trial's levels carry what watched them (``server_metrics``, ``gpu``) and a run its
#: ``server_config``, which a reader of version 3 would drop without a word; 5: a trial's
#: levels carry their bottleneck verdict (``bottleneck``), which a reader of version 4 refuses
#: as an unknown level key; 6: benches are recorded (``cs_benches``, :class:`BenchRecord`), which
#: a reader of version 5 would neither list nor keep; 7: a guided study's trial carries its lab
#: notebook entry (``guided``), which a reader of version 6 would drop without a word; 8: a guided
#: step may build on a reverted one (``guided.base``, ``guided.carried``), which a reader of
#: version 7 would drop, showing a change of two flags as a change of one.
SCHEMA_VERSION = 8

#: ``UPGRADES[n]`` turns a stored document of version ``n`` into one of version ``n + 1``.
#: Versions 1 -> 2 up to 7 -> 8 changed nothing in the JSON of older documents (3 added a
#: status value, 4, 5, 7 and 8 fields with defaults, 6 a table), so there is none yet.
UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {}


class NewerSchemaError(CleanslateError, ValueError):
    """A stored document of a schema version this cleanslate does not know (a newer one)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"a record of schema version {version} (this cleanslate reads up to "
                         f"{SCHEMA_VERSION})")
        self.version = version


class Record(Frozen):
    """A frozen record of the store.

    ``schema_version`` is the layout of the document the record was read from (1: written
    before versions were recorded); a record made in code has :data:`SCHEMA_VERSION`. It is not
    part of :meth:`model_dump` (a record's JSON in the CLI's documents keeps its keys): the store
    writes it beside the fields (:meth:`to_document`).

    :meth:`model_copy` with ``update`` validates the result like a new record (pydantic's does
    not): a check report given as its JSON document becomes a :class:`CheckReport`, a status
    string its enum, and a wrong value is a :class:`pydantic.ValidationError`.
    """

    schema_version: int = Field(default=SCHEMA_VERSION, ge=1, exclude=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None,
                   deep: bool = False) -> Self:
        copy = super().model_copy(deep=deep)
        if not update:
            return copy
        return self.model_validate({**dict(copy), **update})

    def to_document(self) -> dict[str, Any]:
        """The JSON the store holds: :meth:`model_dump` plus ``schema_version`` (always
        :data:`SCHEMA_VERSION`: the dump is in the current layout)."""
        return {**self.model_dump(mode="json"), "schema_version": SCHEMA_VERSION}

    @classmethod
    def from_document(cls, data: Mapping[str, Any]) -> Self:
        """The record a stored document holds, upgraded from its version (1 when it has none)
        to the current one. Raises :class:`NewerSchemaError` for a version above
        :data:`SCHEMA_VERSION` and :class:`pydantic.ValidationError` for a document that is not
        a valid record."""
        version = data.get("schema_version", 1)
        document = {**data, "schema_version": version}
        if isinstance(version, int) and not isinstance(version, bool):
            if version > SCHEMA_VERSION:
                raise NewerSchemaError(version)
            for step in range(version, SCHEMA_VERSION):
                if step in UPGRADES:
                    document = UPGRADES[step](document)
            document["schema_version"] = version
        return cls.model_validate(document)


class RunStatus(StrEnum):
    """Where a run is: ``launching`` (recorded before its supervisor starts: no PIDs yet, its
    processes are found by its marker and its cgroup), ``starting`` (launched, not ready yet),
    ``ready`` (serving), then one of
    ``stopped`` (torn down on request), ``failed`` (did not start, or was torn down after an
    error) and ``crashed`` (exited by itself while serving)."""

    LAUNCHING = "launching"
    STARTING = "starting"
    READY = "ready"
    STOPPED = "stopped"
    FAILED = "failed"
    CRASHED = "crashed"

    @property
    def running(self) -> bool:
        """True while the run may have processes the store has not seen stopped."""
        return self in (RunStatus.LAUNCHING, RunStatus.STARTING, RunStatus.READY)


class RunRecord(Record):
    """A launched server as the store keeps it. Times are epoch seconds.

    ``pid`` is the engine's root process, ``supervisor_pid`` the process that started it (the
    child subreaper, locally); ``create_time`` fields guard against PID reuse. ``marker`` is the
    value of ``CLEANSLATE_RUN`` in the run's environment: every process of the run carries it.
    ``boot_id`` (``/proc/sys/kernel/random/boot_id``) and ``machine_id`` (``/etc/machine-id``)
    say which boot of which machine the PIDs belong to: a record from another boot or machine
    names no live process. ``cgroup`` is the run's own cgroup (v2) path when the host allowed
    one to be made, ``None`` otherwise; ``cgroup_id`` is that directory's inode number as the
    supervisor created it (a cgroup id: teardown acts on that very cgroup, no other of the same
    name). ``uid`` is the effective uid the supervisor ran as (the run's user, the owner of its
    cgroup); ``None`` in records made before it was kept. A ``launching`` record (saved before
    the supervisor starts) has no PIDs and no ``cgroup_id``; its ``cgroup`` is the path the
    supervisor is expected to create, its ``uid`` and host ids those read on the host just
    before the launch.

    ``verdict_before`` is the check before the launch, ``verdict_after`` the verification after
    the teardown (``None``: not verified). ``teardown`` is what the teardown did; its own
    ``verify`` is kept once, as ``verdict_after``, and is always ``None`` here.
    ``server_config`` is the configuration the engine said it runs with, read once it was
    ready, beside the flags asked for (``None``: not read, or a record from before it was).
    """

    id: str
    host: str
    engine: str
    model: str
    argv: tuple[str, ...]
    flags: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    marker: str
    port: int
    gpus: tuple[int, ...] | None = None
    url: str
    log_path: str
    artifacts_dir: str
    status: RunStatus = RunStatus.STARTING
    cause: str | None = None
    detail: str | None = None
    log_tail: str | None = None
    pid: int | None = None
    pgid: int | None = None
    sid: int | None = None
    create_time: float | None = None
    supervisor_pid: int | None = None
    supervisor_create_time: float | None = None
    started_at: float = Field(default_factory=time.time)
    ready_at: float | None = None
    stopped_at: float | None = None
    phases: dict[str, float] = Field(default_factory=dict)
    verdict_before: CheckReport | None = None
    verdict_after: CheckReport | None = None
    teardown: TeardownReport | None = None
    shm_before: tuple[str, ...] = ()
    study: str | None = None
    trial: int | None = None
    boot_id: str | None = None
    machine_id: str | None = None
    cgroup: str | None = None
    user: str | None = None
    uid: int | None = None
    cgroup_id: int | None = None
    server_config: ServerConfig | None = None

    @field_validator("teardown")
    @classmethod
    def _verified_once(cls, report: TeardownReport | None) -> TeardownReport | None:
        if report is not None and report.verify is not None:
            return report.model_copy(update={"verify": None})
        return report
