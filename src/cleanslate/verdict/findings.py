"""Findings and verdicts: the value objects the rules produce."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field

from cleanslate.errors import ExitCode
from cleanslate.models import Frozen
from cleanslate.probe.snapshot import Gpu, ShmSpace


class Verdict(StrEnum):
    """CLEAN, DIRTY or UNKNOWN. UNKNOWN is never reported as CLEAN."""

    CLEAN = "clean"
    DIRTY = "dirty"
    UNKNOWN = "unknown"

    @property
    def exit_code(self) -> ExitCode:
        """0 clean, 1 dirty, 3 unknown."""
        return {"clean": ExitCode.OK, "dirty": ExitCode.FAILED,
                "unknown": ExitCode.UNKNOWN}[self.value]

    @staticmethod
    def worst(verdicts: list[Verdict]) -> Verdict:
        """DIRTY beats UNKNOWN beats CLEAN; no verdicts at all is UNKNOWN."""
        if not verdicts:
            return Verdict.UNKNOWN
        if Verdict.DIRTY in verdicts:
            return Verdict.DIRTY
        if Verdict.UNKNOWN in verdicts:
            return Verdict.UNKNOWN
        return Verdict.CLEAN


class Severity(StrEnum):
    """``error`` makes a host DIRTY, ``unknown`` makes it UNKNOWN, ``warning`` is shown but does
    not change the verdict (unless ``--strict``), ``info`` appears only in JSON."""

    ERROR = "error"
    UNKNOWN = "unknown"
    WARNING = "warning"
    INFO = "info"


class FindingKind(StrEnum):
    STRAY_PROCESS = "stray_process"
    GPU_MEMORY_HELD = "gpu_memory_held"
    GPU_PROCESS = "gpu_process"
    DEVICE_FILE_HOLDER = "device_file_holder"
    ZOMBIE = "zombie"
    D_STATE = "d_state"
    PORT_IN_USE = "port_in_use"
    SHM_LEFTOVER = "shm_leftover"
    #: ``/dev/shm`` has too little space or too few inodes free, whatever fills it.
    SHM_LOW_SPACE = "shm_low_space"
    GPU_HEALTH = "gpu_health"
    GPU_COUNT_CHANGED = "gpu_count_changed"
    PROBE_ERROR = "probe_error"
    #: Processes or files the probe could not read (environments, open files, hidden PIDs).
    UNREADABLE = "unreadable"
    #: A listening socket that was not there at the baseline (any port).
    NEW_LISTENER = "new_listener"
    #: A process started since the baseline.
    NEW_PROCESS = "new_process"
    #: An engine process seen after the host had read clean (``--until-clean``).
    RESPAWNED = "respawned"


#: Characters of a process's command line a finding's message quotes.
COMMAND_SHOWN = 120


def shown_command(command: str) -> str:
    """A command line as a finding's message quotes it: at most :data:`COMMAND_SHOWN`
    characters, ``...`` where it was cut."""
    return command if len(command) <= COMMAND_SHOWN else command[:COMMAND_SHOWN - 3] + "..."


class Finding(Frozen):
    """One reason a host is not (or may not be) a clean slate, with its evidence."""

    kind: FindingKind
    severity: Severity
    message: str
    gpu: int | None = None
    pid: int | None = None
    port: int | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)

    def brief(self, limit: int = 100) -> str:
        """The message on one line of at most ``limit`` characters, without the command line
        of the process it names (its PID and name stay: ``port 30917 is bound (127.0.0.1) by
        PID 18320 `python3```). The command is known from the evidence (``cmdline``); a
        finding without one keeps its text, cut at ``limit``."""
        text = self.message
        cmdline = self.evidence.get("cmdline")
        if isinstance(cmdline, list):
            command = " ".join(str(a) for a in cmdline) if cmdline else \
                f"[{self.evidence.get('comm')}]"
            text = text.replace(f" ({shown_command(command)})", "", 1)
        text = " ".join(text.split())
        return text if len(text) <= limit else text[:limit - 3] + "..."


class HostVerdict(Frozen):
    """The verdict on one host: the ``hosts[]`` entry of ``check --json``. ``shm``: the size
    and free space of its ``/dev/shm`` (``None``: not read)."""

    host: str
    verdict: Verdict
    gpu_backend: str
    gpus: tuple[Gpu, ...] = ()
    findings: tuple[Finding, ...] = ()
    probed_at: str
    probe_elapsed_s: float
    shm: ShmSpace | None = None

    @property
    def problems(self) -> list[Finding]:
        """Findings that are shown to a person (everything but ``info``)."""
        return [f for f in self.findings if f.severity != Severity.INFO]
