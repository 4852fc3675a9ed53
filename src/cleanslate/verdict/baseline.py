"""Baselines: what an idle host looked like, saved with ``check --save-baseline F``.

A baseline records, per GPU, the memory in use and the uncorrected ECC count when the host was
idle, the GPU set (UUIDs), the long-lived device-file holders (``nvidia-persistenced``, a DCGM
host engine), the ``/dev/shm`` names already present, and the kernel log position. It never
records processes as acceptable: an engine process is a stray whatever the baseline says.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from cleanslate.errors import InputError
from cleanslate.probe.snapshot import Snapshot

_HINT = "create one with `cleanslate check --save-baseline FILE`"


class BaselineGpu(BaseModel):
    model_config = ConfigDict(frozen=True)

    index: int
    uuid: str | None = None
    memory_used_mib: int | None = None
    ecc_uncorrected: int | None = None


class Baseline(BaseModel):
    model_config = ConfigDict(frozen=True)

    version: int = 1
    host: str
    saved_at: str
    gpu_backend: str
    gpus: tuple[BaselineGpu, ...] = ()
    device_holders: tuple[tuple[int, float], ...] = ()
    shm: tuple[str, ...] = ()
    kmsg_last_us: int | None = None

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> Baseline:
        create = {p.pid: p.create_time for p in snapshot.processes}
        return cls(
            host=snapshot.host,
            saved_at=snapshot.taken_at,
            gpu_backend=snapshot.gpu.backend,
            gpus=tuple(
                BaselineGpu(index=g.index, uuid=g.uuid, memory_used_mib=g.memory_used_mib,
                            ecc_uncorrected=g.ecc_uncorrected)
                for g in snapshot.gpu.gpus
            ),
            device_holders=tuple(
                (h.pid, create[h.pid]) for h in snapshot.device_holders if h.pid in create
            ),
            shm=tuple(e.name for e in snapshot.shm),
            kmsg_last_us=snapshot.kmsg_last_us,
        )

    def gpu(self, index: int) -> BaselineGpu | None:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        return None

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> Baseline:
        """Read a baseline file; a missing or malformed file is an :class:`InputError`."""
        try:
            text = path.read_text()
        except OSError as exc:
            raise InputError(f"cannot read baseline: {exc.strerror}", where=str(path),
                             hint=_HINT) from None
        try:
            return cls.model_validate(json.loads(text))
        except json.JSONDecodeError as exc:
            raise InputError(f"not JSON: {exc.msg}", where=f"{path}:{exc.lineno}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise InputError(f"not a cleanslate baseline: {loc}: {first['msg']}",
                             where=str(path), hint=_HINT) from None
