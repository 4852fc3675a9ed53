"""The launcher of the simulated engine: it spawns the workers, watches them and stops them.

``cleanslate sim serve`` runs :func:`serve` in the launcher process. It starts ``tp-size``
worker processes (:mod:`cleanslate.sim.worker`, named ``sim::scheduler_TP0`` ...) that hold the
simulated GPU memory, waits until every one reports ready, then opens the HTTP port. The
scheduler loop (:mod:`cleanslate.sim.engine`) and the HTTP server run in the launcher.

Lifecycle, as with real engines:
- SIGTERM / SIGINT of the launcher: it stops serving, SIGTERMs its workers, waits up to
  :data:`WORKER_GRACE_S` for them (a worker that ignores SIGTERM is left behind), exits 0.
- SIGKILL of the launcher: the workers stay alive (orphans holding memory); they use no
  parent-death signal.
- A worker that dies (a crash, a signal) makes the launcher stop the others and exit 1.
- The ``exit-after`` fault makes it stop by itself and exit 0, as a signal would.
- Startup failures (OOM, not enough memory for the KV cache, the port taken) exit 1.

The HTTP API it serves (and the ground-truth file it writes) is :mod:`cleanslate.sim.api`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import IO

from aiohttp import web

from cleanslate.sim import ledger
from cleanslate.sim.api import Api
from cleanslate.sim.engine import Engine
from cleanslate.sim.faults import Faults
from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
from cleanslate.sim.metrics import RequestStats, SimCollector, metrics_registry
from cleanslate.sim.model import CONTEXT_MIB, SimModel, SimSettings, auto_max_running_requests
from cleanslate.sim.telemetry import TelemetryWriter
from cleanslate.sim.worker import WorkerPlan

WORKER_GRACE_S = 3.0
LOAD_S = 0.2
SHM_PREFIX = "cleanslate-sim-"
BANNER = (
    "cleanslate sim: a SIMULATED inference engine (no GPU, no model weights; token text is "
    "synthetic). It exists for tests and demos."
)


@dataclass(frozen=True)
class ServeOptions:
    """Everything ``cleanslate sim serve`` was asked to do."""

    settings: SimSettings
    port: int = 30000
    host: str = "127.0.0.1"
    model_path: str = "cleanslate/sim-70b"
    served_model_name: str | None = None
    faults: Faults = field(default_factory=Faults)
    ground_truth: str | None = None
    stream_interval: int = 1
    base_gpu_id: int = 0
    log_interval_steps: int = 40
    #: ``False`` when ``--max-running-requests`` was not given: the sim then chooses the limit
    #: (:func:`~cleanslate.sim.model.auto_max_running_requests`) and ``/server_info`` says
    #: ``max_running_requests: null`` beside the ``effective_max_running_requests_per_dp``.
    max_running_requests_given: bool = True
    enable_metrics: bool = False
    enable_metrics_for_all_schedulers: bool = False
    trust_remote_code: bool = False
    log_level: str = "info"

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path


def log(message: str) -> None:
    sys.stderr.write(f"[{datetime.now():%Y-%m-%d %H:%M:%S}] {message}\n")
    sys.stderr.flush()

class _Worker:
    def __init__(self, rank: int, gpu: int, proc: asyncio.subprocess.Process) -> None:
        self.rank = rank
        self.gpu = gpu
        self.proc = proc


class Launcher:
    """One simulated server (see the module docstring)."""

    def __init__(self, opts: ServeOptions) -> None:
        self.opts = opts
        self.ledger_dir = os.environ.get(SIM_GPU_DIR_ENV) or None
        gpu_mib = opts.settings.gpu_memory_mib
        gpu_count = ledger.DEFAULT_GPUS
        if self.ledger_dir:
            config = ledger.read_config(self.ledger_dir)
            gpu_mib = int(config["memory_total_mib"])
            gpu_count = int(config["gpus"])
        self.gpu_count = gpu_count
        settings = replace(opts.settings, gpu_memory_mib=gpu_mib)
        if not opts.max_running_requests_given:
            settings = replace(settings,
                               max_running_requests=auto_max_running_requests(settings))
        self.model = SimModel(settings)
        self.workers: list[_Worker] = []
        self.engine: Engine | None = None
        self.shutting_down = False
        self.exit_code = 0
        self.done = asyncio.Event()
        self.sock: socket.socket | None = None
        self.shm_files: list[str] = []
        self.gt: IO[str] | None = None
        self._created = int(time.time())

    # --- start ---------------------------------------------------------------------------------
    def gpu_ids(self) -> list[int]:
        tp = self.model.s.tp_size
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible:
            ids = [int(x) for x in visible.split(",") if x.strip().lstrip("-").isdigit()]
        else:
            ids = list(range(self.gpu_count))
        chosen = ids[self.opts.base_gpu_id : self.opts.base_gpu_id + tp]
        if len(chosen) < tp or any(not 0 <= g < self.gpu_count for g in chosen):
            raise RuntimeError(
                f"CUDA error: invalid device ordinal (tp-size {tp} from base GPU "
                f"{self.opts.base_gpu_id} needs {tp} of the {self.gpu_count} simulated GPUs)"
            )
        return chosen

    async def run(self) -> int:
        opts = self.opts
        loop = asyncio.get_running_loop()
        log(BANNER)
        log(
            f"server_args: model_path={opts.model_path}, host={opts.host}, port={opts.port}, "
            f"{', '.join(f'{k}={v}' for k, v in self.model.s.to_dict().items())}, "
            f"faults={opts.faults.active() or 'none'}"
        )
        if not self.ledger_dir:
            log(f"WARNING: {SIM_GPU_DIR_ENV} is not set: simulated GPU memory is not recorded")
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            gpus = self.gpu_ids()
        except RuntimeError as exc:
            log(f"RuntimeError: {exc}")
            return 1
        model = self.model
        model.set_host(f"{socket.gethostname()}:gpus={','.join(str(g) for g in gpus)}")
        log(
            f"noise (simulation): run factor {model.run_factor:.4f} drawn from the "
            f"{model.noise_from}, host factor {model.host_factor:.4f} "
            f"(--host-noise {model.s.host_noise:g}, host key {model.host_key}), cold start x"
            f"{model.s.cold_start:g} prefill and x{model.s.cold_start_decode:g} decode over "
            f"{model.s.cold_start_steps} steps, drift sigma {model.s.drift:g}"
        )
        if opts.faults.shm_leftover:
            self._make_shm()
        if opts.ground_truth:
            self.gt = open(opts.ground_truth, "a", buffering=1, encoding="utf-8")  # noqa: SIM115

        ok = await self._start_workers(gpus)
        if not ok or self.shutting_down:
            code = self.exit_code if self.shutting_down else 1
            await self._stop_workers()
            log(f"Simulated server stopped during start-up (exit {code})")
            return code
        plan = self.model.memory_plan()
        self.engine = Engine(self.model, opts.faults, self._on_crash, log,
                             opts.log_interval_steps, on_exit=self._on_exit_fault)
        try:
            self.sock = self._bind()
        except OSError as exc:
            log(
                f"ERROR: [Errno {exc.errno}] error while attempting to bind on address "
                f"('{opts.host}', {opts.port}): {exc.strerror.lower() if exc.strerror else exc}"
            )
            await self._stop_workers()
            return 1
        if opts.faults.leave_port is not None:
            self._spawn_listener(opts.faults.leave_port)
        stats = registry = None
        if opts.enable_metrics:
            stats = RequestStats()
            registry = metrics_registry(SimCollector(
                self.engine, stats, model_name=opts.model_name, tp_size=self.model.s.tp_size,
                all_schedulers=opts.enable_metrics_for_all_schedulers,
                context_len=self.model.s.context_length))
        app = Api(
            model_name=opts.model_name,
            model_path=opts.model_path,
            stream_interval=opts.stream_interval,
            model=self.model,
            engine=self.engine,
            ground_truth=self.gt,
            created=self._created,
            server_info=server_args(opts, self.model.s),
            metrics=registry,
            stats=stats,
        ).app()
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.SockSite(runner, self.sock)
        await site.start()
        self.engine.start()
        self._watchers = [loop.create_task(self._watch(w)) for w in self.workers]
        telemetry: TelemetryWriter | None = None
        if self.ledger_dir:
            telemetry = TelemetryWriter(self.ledger_dir, gpus, self.engine, port=opts.port,
                                        throttle_mhz=opts.faults.throttle_clock, now=loop.time)
            telemetry_task = loop.create_task(telemetry.run())
        log(
            f"max_total_num_tokens={plan.kv_capacity_tokens}, "
            f"max_running_requests={self.model.s.max_running_requests}, "
            f"chunked_prefill_size={self.model.s.chunked_prefill_size}, "
            f"context_len={self.model.s.context_length}"
        )
        log(f"Uvicorn running on http://{opts.host}:{opts.port} (simulated engine)")
        log("The server is fired up and ready to roll! (simulation)")
        await self.done.wait()
        if telemetry is not None:
            telemetry_task.cancel()
            telemetry.remove()
        with contextlib.suppress(Exception):
            self.sock.close()
        await self._stop_workers()
        if self.shm_files and not opts.faults.shm_leftover:
            for path in self.shm_files:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        if self.gt is not None:
            self.gt.flush()
        log(f"Simulated server stopped (exit {self.exit_code})")
        return self.exit_code

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.opts.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.opts.host, self.opts.port))
            sock.listen(2048)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        return sock

    def _make_shm(self) -> None:
        for suffix in ("kv-cache", "nccl-0"):
            path = f"/dev/shm/{SHM_PREFIX}{os.getpid()}-{suffix}"
            try:
                with open(path, "wb") as fh:
                    fh.write(b"\0" * 65536)
                self.shm_files.append(path)
            except OSError as exc:
                log(f"WARNING: could not create {path}: {exc}")

    async def _start_workers(self, gpus: list[int]) -> bool:
        opts = self.opts
        plan = self.model.memory_plan()
        faults = opts.faults
        s = self.model.s
        for rank, gpu in enumerate(gpus):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cleanslate.sim.worker",
                "scheduler",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            worker_plan: WorkerPlan = {
                "rank": rank,
                "gpu": gpu,
                "ledger_dir": self.ledger_dir,
                "release_delay_s": faults.slow_release or 0.0,
                "load_s": LOAD_S + (faults.slow_start or 0.0),
                "gpu_memory_mib": s.gpu_memory_mib,
                "context_mib": CONTEXT_MIB,
                "weights_mib": plan.weights_mib,
                "static_pool_mib": plan.static_pool_mib,
                "kv_cache_mib": plan.kv_cache_mib,
                "kv_capacity_tokens": plan.kv_capacity_tokens,
                "graph_mib": plan.graph_mib,
                "workspace_mib": plan.fields["activation_mib"],
                "cuda_graph_max_bs": s.cuda_graph_max_bs,
                "oom": plan.oom_at_start or (faults.oom_at_start and rank == 0),
                "forced_oom": faults.oom_at_start and not plan.oom_at_start,
                "not_enough_memory": plan.not_enough_for_kv,
                "ignore_sigterm": faults.ignore_sigterm and rank == 0,
                "orphan_grandchild_mib": faults.orphan_grandchild if rank == 0 else None,
            }
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(worker_plan) + "\n").encode())
            await proc.stdin.drain()
            self.workers.append(_Worker(rank, gpu, proc))
        log(
            f"Started {len(self.workers)} simulated scheduler processes: "
            + ", ".join(
                f"sim::scheduler_TP{w.rank} (pid {w.proc.pid}, GPU {w.gpu})" for w in self.workers
            )
        )

        async def ready(w: _Worker) -> bool:
            assert w.proc.stdout is not None
            line = await w.proc.stdout.readline()
            return line.strip() == b"READY"

        waits = [asyncio.ensure_future(ready(w)) for w in self.workers]
        stop = asyncio.ensure_future(self.done.wait())
        pending = set(waits)
        while pending:
            finished, pending = await asyncio.wait(
                pending | {stop}, return_when=asyncio.FIRST_COMPLETED
            )
            pending.discard(stop)
            if stop in finished:
                for t in waits:
                    t.cancel()
                return False
            for t in finished:
                if t is stop:
                    continue
                if not t.result():
                    w = self.workers[waits.index(t)]
                    code = await w.proc.wait()
                    log(
                        f"Rank {w.rank} scheduler is dead (exit status {code}). "
                        "Please check if there are relevant logs."
                    )
                    self.exit_code = 1
                    for other in pending:
                        other.cancel()
                    stop.cancel()
                    return False
        stop.cancel()
        return True

    async def _watch(self, w: _Worker) -> None:
        code = await w.proc.wait()
        if self.shutting_down:
            return
        log("Received sigquit from a child process. It usually means the child failed.")
        log(
            f"sim::scheduler_TP{w.rank} (pid {w.proc.pid}) exited with status {code}; "
            "shutting down the simulated server"
        )
        self._shutdown(1)

    def _spawn_listener(self, port: int) -> None:
        import subprocess

        argv = [
            sys.executable,
            "-m",
            "cleanslate.sim.worker",
            "listener",
            "--port",
            str(port),
            "--host",
            self.opts.host,
        ]
        pass_fds: tuple[int, ...] = ()
        if port == self.opts.port and self.sock is not None:
            argv += ["--fd", str(self.sock.fileno())]
            pass_fds = (self.sock.fileno(),)
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        assert child.stdout is not None
        child.stdout.readline()  # the port is bound before the server reports ready
        child.stdout.close()
        log(f"Started a port holder in a new session (pid {child.pid}, port {port})")

    # --- stop ----------------------------------------------------------------------------------
    def _on_signal(self, sig: int) -> None:
        log(f"Received {signal.Signals(sig).name}; shutting down the simulated server")
        self._shutdown(0)

    def _shutdown(self, code: int) -> None:
        if not self.shutting_down:
            self.shutting_down = True
            self.exit_code = code
        self.done.set()

    def _on_exit_fault(self) -> None:
        # exit-after: the API server going away by itself with status 0, in-flight requests cut.
        log(f"Engine core gone after {self.opts.faults.exit_after} requests (simulated fault "
            "exit-after); the API server shuts down")
        self._shutdown(0)

    def _on_crash(self, batch: int) -> None:
        # The scheduler of rank 0 writes the traceback and dies; _watch then stops the rest.
        for w in self.workers:
            if w.rank == 0 and w.proc.stdin is not None:
                with contextlib.suppress(Exception):
                    w.proc.stdin.write(f"CRASH {batch}\n".encode())

    async def _stop_workers(self) -> None:
        self.shutting_down = True
        alive = [w for w in self.workers if w.proc.returncode is None]
        for w in alive:
            with contextlib.suppress(ProcessLookupError):
                w.proc.send_signal(signal.SIGTERM)
        if not alive:
            return
        waits = [asyncio.ensure_future(w.proc.wait()) for w in alive]
        _, pending = await asyncio.wait(waits, timeout=WORKER_GRACE_S)
        for w in alive:
            if w.proc.returncode is None:
                log(
                    f"WARNING: sim::scheduler_TP{w.rank} (pid {w.proc.pid}) did not exit "
                    f"within {WORKER_GRACE_S:.0f} s of SIGTERM; leaving it"
                )
        for t in pending:
            t.cancel()


def server_args(opts: ServeOptions, settings: SimSettings) -> dict[str, object]:
    """The server arguments as SGLang's ``/server_info`` spells them (``ServerArgs`` fields),
    from what the sim was started with; ``max_running_requests`` is ``None`` when it was not
    given (the limit in effect is the internal state's). Sim-only settings go under
    ``simulation``."""
    return {
        "model_path": opts.model_path,
        "tokenizer_path": opts.model_path,
        "served_model_name": opts.model_name,
        "host": opts.host,
        "port": opts.port,
        "tp_size": settings.tp_size,
        "dp_size": 1,
        "pp_size": 1,
        "mem_fraction_static": settings.mem_fraction_static,
        "max_running_requests": (settings.max_running_requests
                                 if opts.max_running_requests_given else None),
        "max_total_tokens": None,
        "chunked_prefill_size": settings.chunked_prefill_size,
        "context_length": settings.context_length,
        "disable_cuda_graph": settings.disable_cuda_graph,
        "cuda_graph_max_bs": settings.cuda_graph_max_bs,
        "disable_radix_cache": settings.disable_radix_cache,
        "schedule_policy": "fcfs",
        "page_size": 1,
        "random_seed": settings.seed,
        "base_gpu_id": opts.base_gpu_id,
        "stream_interval": opts.stream_interval,
        "decode_log_interval": opts.log_interval_steps,
        "trust_remote_code": opts.trust_remote_code,
        "log_level": opts.log_level,
        "enable_metrics": opts.enable_metrics,
        "enable_metrics_for_all_schedulers": opts.enable_metrics_for_all_schedulers,
        "enable_dp_attention": False,
        "api_key": None,
        "simulation": {
            "simulated": True,
            "time_scale": settings.time_scale,
            "gpu_memory_mib": settings.gpu_memory_mib,
            "faults": opts.faults.active() or [],
        },
    }


def serve(opts: ServeOptions) -> int:
    """Run the launcher until it is stopped; returns the process exit status."""
    launcher = Launcher(opts)
    return asyncio.run(launcher.run())
