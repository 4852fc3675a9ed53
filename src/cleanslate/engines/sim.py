"""cleanslate's simulated engine: ``python -m cleanslate sim serve --model-path M --port P``.

A real multi-process OpenAI-compatible server that needs no GPU (``docs/sim-model.md``). Its flags
are SGLang-style (``tp-size``, ``mem-fraction-static``, ``disable-cuda-graph``,
``max-running-requests``, ``chunked-prefill-size``, ``fault: NAME[=ARG]``); its workers rename
themselves ``sim::scheduler_TP<n>``. Like SGLang's adapter, it launches with
``--enable-metrics`` unless the flags say ``enable-metrics: false``. ``python`` defaults to the
interpreter running cleanslate, which is the right one locally; on a remote host the executor's
``python`` is used.

Its GPU memory is simulated: the workers record it in a ledger directory named by
``CLEANSLATE_SIM_GPU_DIR`` (:mod:`cleanslate.sim.ledger`), which the ``sim`` GPU backend reads.
:meth:`SimEngine.prepare_env` gives every run a ledger, and ``--gpu-backend auto`` reads that
ledger for the run's checks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from cleanslate.engines._base import EngineAdapter, Leftovers, register_engine
from cleanslate.engines._flags import Flags
from cleanslate.engines.sglang import ADVICE as SGLANG_ADVICE
from cleanslate.engines.sglang import METRICS as SGLANG_METRICS
from cleanslate.engines.sglang import RELAXERS as SGLANG_RELAXERS
from cleanslate.engines.sglang import metrics_args
from cleanslate.engines.signatures import ProcessSignature, any_of, program, python_module
from cleanslate.sim.ledger import SIM_GPU_DIR_ENV


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
    signature = ProcessSignature.compile(
        "sim",
        r"^sim::",
        any_of(program(r"cleanslate\s+sim\s+serve"),
               r"(?:^|\s)-m\s*cleanslate\s+sim\s+serve(?:\s|$)",
               python_module(r"cleanslate\.sim"), r"^sim::"),
        "cleanslate's simulated engine (a test double, not a real server)",
    )
    local_python = True
    gpu_backend = "sim"
    simulated = True
    # It serves SGLang's names (issue 36 item 5), when launched with --enable-metrics.
    metric_map = SGLANG_METRICS
    # and takes SGLang's flags, so SGLang's advice
    advice = SGLANG_ADVICE
    # and SGLang's relax table (its model crashes with a Python exception above the graph
    # limit, and runs out of memory at start, as the table's crash rows expect)
    relaxers = SGLANG_RELAXERS
    # and SGLang's /server_info, from its model's state; faults are not settings
    config_flavour = "sglang"
    config_ignore = ("fault",)

    def implied_args(self, flags: Flags | None) -> list[str]:
        """``--enable-metrics`` unless the flags name it (``enable-metrics: false``: no
        ``/metrics``), as SGLang's adapter; the sim has no DP attention, so never the
        all-schedulers flag."""
        return metrics_args(flags, all_schedulers=False)

    def default_launch(self) -> tuple[str, ...]:
        # `-m cleanslate.sim` loads only the simulated engine, not the whole CLI: faster start.
        return (self.python, "-m", "cleanslate.sim", "serve")

    @classmethod
    def prepare_env(cls, env: Mapping[str, str], artifacts: Path) -> dict[str, str]:
        """The user's ``env`` with the ledger every run of the sim needs: the one ``env`` names,
        else the one this process's environment names, else ``sim-gpus`` beside the artifacts
        (created when missing)."""
        directory = env.get(SIM_GPU_DIR_ENV) or os.environ.get(SIM_GPU_DIR_ENV) or str(
            artifacts / "sim-gpus")
        Path(directory).mkdir(parents=True, exist_ok=True)
        return {**env, SIM_GPU_DIR_ENV: directory}

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
