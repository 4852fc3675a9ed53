"""Launch: one server started so that it can be found and ended, then watched until ready.

- :mod:`~cleanslate.launch.config`: the server file (:class:`ServeConfig`).
- :mod:`~cleanslate.launch.launcher`: the supervised launch (a new session under a supervisor
  that is the child subreaper, the ``CLEANSLATE_RUN`` marker in the environment, a log and a
  state file per run, a cgroup where the host allows one).
- :mod:`~cleanslate.launch.ready`: readiness and the run's log.
- :mod:`~cleanslate.launch.lifecycle`: the verified lifecycle, :func:`start_server` (preflight
  -> launch -> ready -> smoke) and :func:`stop_server` (teardown -> verify -> record).
- :mod:`~cleanslate.launch.foreground`: serving in the foreground until Ctrl-C or a crash.

The names below load on first use (the lifecycle needs the store, hence SQLAlchemy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cleanslate._lazy import lazy_exports

if TYPE_CHECKING:
    from cleanslate.launch.config import ServeConfig, load_serve_config
    from cleanslate.launch.foreground import (
        ForegroundEnd,
        ForegroundResult,
        serve_foreground,
        serve_in_foreground,
    )
    from cleanslate.launch.launcher import MARKER_ENV, LaunchError, LaunchRequest, launch
    from cleanslate.launch.lifecycle import (
        StartOutcome,
        adapter_for,
        run_exit_code,
        start_server,
        stop_server,
        verify_options,
    )
    from cleanslate.launch.ready import ReadyResult, log_tail, wait_ready

__getattr__, __dir__ = lazy_exports(__name__, {
    "ServeConfig": "cleanslate.launch.config",
    "load_serve_config": "cleanslate.launch.config",
    "ForegroundEnd": "cleanslate.launch.foreground",
    "ForegroundResult": "cleanslate.launch.foreground",
    "serve_foreground": "cleanslate.launch.foreground",
    "serve_in_foreground": "cleanslate.launch.foreground",
    "MARKER_ENV": "cleanslate.launch.launcher",
    "LaunchError": "cleanslate.launch.launcher",
    "LaunchRequest": "cleanslate.launch.launcher",
    "launch": "cleanslate.launch.launcher",
    "StartOutcome": "cleanslate.launch.lifecycle",
    "adapter_for": "cleanslate.launch.lifecycle",
    "run_exit_code": "cleanslate.launch.lifecycle",
    "start_server": "cleanslate.launch.lifecycle",
    "stop_server": "cleanslate.launch.lifecycle",
    "verify_options": "cleanslate.launch.lifecycle",
    "ReadyResult": "cleanslate.launch.ready",
    "log_tail": "cleanslate.launch.ready",
    "wait_ready": "cleanslate.launch.ready",
})

__all__ = [
    "MARKER_ENV",
    "ForegroundEnd",
    "ForegroundResult",
    "LaunchError",
    "LaunchRequest",
    "ReadyResult",
    "ServeConfig",
    "StartOutcome",
    "adapter_for",
    "launch",
    "load_serve_config",
    "log_tail",
    "run_exit_code",
    "serve_foreground",
    "serve_in_foreground",
    "start_server",
    "stop_server",
    "verify_options",
    "wait_ready",
]
