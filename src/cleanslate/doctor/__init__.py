"""``cleanslate doctor``: why is this host slow, before the first benchmark (``docs/doctor.md``).

- :mod:`~cleanslate.doctor._doctor_script`: the stdlib-only host script (``nvidia-smi -q``,
  ``topo -m``, ``topo -p2p``, NVML through ``pynvml`` when the host has it, the environment),
  sent to the host's ``python3`` through the executor, locally or over SSH;
- :mod:`~cleanslate.doctor.parse`: pure parsers of ``nvidia-smi`` text;
- :mod:`~cleanslate.doctor.analyze`: the raw JSON to a :class:`HostDoctor` (devices, pairs,
  environment); :mod:`~cleanslate.doctor.logind`: systemd-logind's ``RemoveIPC=`` from its
  files, by systemd's precedence; :mod:`~cleanslate.doctor.findings`: what each reading means,
  with evidence;
- :mod:`~cleanslate.doctor.run`: :func:`doctor_hosts`, and ``--bandwidth`` with torch;
- :mod:`~cleanslate.doctor.snapshot`: the compact :class:`HostSnapshot` a study or a ``serve``
  run records of its host (:func:`snapshot_host`).

The names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.doctor.analyze import analyze
    from cleanslate.doctor.report import (
        Bandwidth,
        Device,
        DoctorFinding,
        DoctorReport,
        DoctorSeverity,
        Driver,
        Environment,
        HostDoctor,
        Measurement,
        Pair,
    )
    from cleanslate.doctor.run import doctor_host, doctor_hosts
    from cleanslate.doctor.snapshot import HostSnapshot, snapshot_host

__getattr__, __dir__ = lazy_exports(__name__, {
    "analyze": "cleanslate.doctor.analyze",
    "Bandwidth": "cleanslate.doctor.report",
    "Device": "cleanslate.doctor.report",
    "DoctorReport": "cleanslate.doctor.report",
    "Driver": "cleanslate.doctor.report",
    "Environment": "cleanslate.doctor.report",
    "DoctorFinding": "cleanslate.doctor.report",
    "HostDoctor": "cleanslate.doctor.report",
    "Measurement": "cleanslate.doctor.report",
    "Pair": "cleanslate.doctor.report",
    "DoctorSeverity": "cleanslate.doctor.report",
    "doctor_host": "cleanslate.doctor.run",
    "doctor_hosts": "cleanslate.doctor.run",
    "HostSnapshot": "cleanslate.doctor.snapshot",
    "snapshot_host": "cleanslate.doctor.snapshot",
})

__all__ = [
    "Bandwidth",
    "Device",
    "DoctorFinding",
    "DoctorReport",
    "DoctorSeverity",
    "Driver",
    "Environment",
    "HostDoctor",
    "HostSnapshot",
    "Measurement",
    "Pair",
    "analyze",
    "doctor_host",
    "doctor_hosts",
    "snapshot_host",
]
