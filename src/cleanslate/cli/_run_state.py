"""Whether a recorded run's server is still there, read from its supervisor: when it ended,
with which status, and why (its log classified with the engine's crash patterns).

``bench --run`` refuses a run whose server had exited; ``stop`` and ``clean --run`` say so
beside their verdict. Every reading goes through the launch room's readers
(:func:`~cleanslate.launch.run_exit_code`, :func:`~cleanslate.launch.ready.run_state`,
:func:`~cleanslate.launch.ready.classify_run_log`): the state and log are read only from the
run's own folder, and the log's line is scrubbed of the run's secrets and printed as text.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from cleanslate.errors import InputError
from cleanslate.models import FrozenStrict

if TYPE_CHECKING:
    from cleanslate.engines import EngineAdapter
    from cleanslate.hosts import Executor
    from cleanslate.store import RunRecord


def clock(epoch_s: float | None) -> str:
    """``12:03:10``: an epoch time on this machine's clock (``?`` when unknown)."""
    return "?" if epoch_s is None else time.strftime("%H:%M:%S", time.localtime(epoch_s))


class ServerExit(FrozenStrict):
    """A run's server that ended by itself: when (``exited_at``, epoch seconds, as its
    supervisor recorded it; ``None``: not recorded), its ``exit_status`` (negative: killed by
    that signal; ``None``: not recorded, the supervisor is gone too), its ``cause`` (the log's
    ``python_exception``, ``oom``..., else ``killed``/``exited`` from the status) and the
    evidence (``line``), and where the cause was read (``source``)."""

    exited_at: float | None
    exit_status: int | None
    cause: str
    line: str
    source: Literal["log", "exit_status", "process_table"]

    def describe(self) -> str:
        """``crashed at 12:03:10, exit status 1, python_exception: AttributeError: ...``."""
        status = ("exit status not recorded" if self.exit_status is None
                  else f"exit status {self.exit_status}")
        return f"crashed at {clock(self.exited_at)}, {status}, {self.cause}: {self.line}"


def engine_adapter(engine: str) -> EngineAdapter | None:
    """The run's engine adapter, for its crash patterns (``None``: an engine that needs its
    launch options, ``command``: the exit status says why)."""
    from cleanslate.engines import engine_class

    try:
        return engine_class(engine)()
    except (InputError, TypeError):
        return None


async def server_exit(executor: Executor, run: RunRecord,
                      artifacts: Path | None) -> ServerExit | None:
    """How the run's server ended, when its supervisor recorded an exit status (0 included:
    a server that should be serving and is not crashed, whatever its status); ``None`` while
    none is recorded. ``artifacts``: the store's artifacts folder for a run of this machine."""
    from cleanslate.launch.lifecycle import describe_exit
    from cleanslate.launch.ready import classify_run_log, run_state

    state = await run_state(executor, run, artifacts=artifacts)
    code = None if state is None else state.get("exit_code")
    if not isinstance(code, int) or isinstance(code, bool):
        return None
    when = state.get("exited_at") if state is not None else None
    exited_at = float(when) if isinstance(when, int | float) and not isinstance(when, bool) \
        else None
    adapter = engine_adapter(run.engine)
    found = None if adapter is None else await classify_run_log(
        executor, adapter, run, returncode=code, artifacts=artifacts)
    if found is not None:
        return ServerExit(exited_at=exited_at, exit_status=code, cause=found[0],
                          line=found[1], source="log")
    cause, line = describe_exit(code)
    return ServerExit(exited_at=exited_at, exit_status=code, cause=cause, line=line,
                      source="exit_status")


__all__ = ["ServerExit", "clock", "engine_adapter", "server_exit"]
