"""cleanslate's simulated engine: ``python -m cleanslate sim serve --model-path M --port P``.

A real multi-process OpenAI-compatible server that needs no GPU (DESIGN section 8). Its flags
are SGLang-style (``tp-size``, ``mem-fraction-static``, ``disable-cuda-graph``,
``max-running-requests``, ``chunked-prefill-size``, ``fault: NAME[=ARG]``); its workers rename
themselves ``sim::scheduler_TP<n>``. ``python`` defaults to the interpreter running cleanslate,
which is the right one locally; for a remote host pass the executor's ``python``.
"""

from __future__ import annotations

import sys

from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._flags import Flags


@register_engine
class SimEngine(EngineAdapter):
    name = "sim"
    description = "cleanslate's simulated engine (a test double, not a real server)"
    default_port = 30000
    default_model_flag = "--model-path"
    reserved_flags = ("--port", "--host", "--model-path", "--model")
    leftovers = Leftovers(
        shm_globs=("cleanslate-sim-*",),
        process_names=("sim::scheduler_TP", "sim::grandchild", "sim::listener"),
        notes="faults on demand leave orphans, bound ports and /dev/shm files",
    )

    def __init__(self, *, python: str | None = None, **options: object) -> None:
        super().__init__(python=python or sys.executable, **options)  # type: ignore[arg-type]

    def default_launch(self) -> tuple[str, ...]:
        # `-m cleanslate.sim` loads only the simulated engine, not the whole CLI: faster start.
        return (self.python, "-m", "cleanslate.sim", "serve")

    def build_argv(
        self,
        model: str,
        port: int | None = None,
        flags: Flags | None = None,
        *,
        host: str | None = None,
    ) -> list[str]:
        """As the base class, but ``fault`` is repeated once per value (``--fault nan --fault
        slow-release=3``): the sim's option takes one fault per occurrence."""
        rest = dict(flags or {})
        faults = rest.pop("fault", None)
        argv = super().build_argv(model, port, rest, host=host)
        if faults is None or faults is False:
            return argv
        for fault in [faults] if isinstance(faults, str) else list(faults):  # type: ignore[arg-type]
            argv += ["--fault", str(fault)]
        return argv

