"""The launcher of the simulated engine: workers, the scheduler loop and the OpenAI-compatible API.

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
- Startup failures (OOM, not enough memory for the KV cache, the port taken) exit 1.

Endpoints: ``GET /health`` (200 while the process serves, even when the scheduler hangs),
``GET /health_generate`` (one token through the scheduler: 200, or 503 after 20 s),
``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions`` (``stream``, ``stream_options.include_usage``, ``max_tokens`` /
``max_completion_tokens``, ``min_tokens``, ``ignore_eos``, ``seed``). What they write (SSE
framing, chunks, usage, error bodies) is :mod:`cleanslate.wire`'s, as the fake server's is.

**Ground truth** (``--ground-truth FILE``): one JSON line per finished request, appended when it
ends (line-buffered)::

    {"id": "cmpl-sim-1-5", "endpoint": "completions", "stream": true, "status": "ok",
     "arrival": 1764504000.123456, "first_token": 1764504000.234567,
     "last_token": 1764504001.345678, "arrival_mono": 1234.5, "first_token_mono": 1234.6,
     "last_token_mono": 1235.7, "prompt_tokens": 1024, "completion_tokens": 128,
     "chunks": 128, "finish_reason": "length"}

``arrival`` is when the server began handling the request (body read); ``first_token`` /
``last_token`` are taken just before the first / last chunk *with content* is written to the
socket (for a non-streaming request both are the time the response is written). Times are wall
clock, epoch seconds (``time.time()``); the ``_mono`` fields are ``time.monotonic()``, the same
clock as any process on the same host uses. ``completion_tokens`` counts tokens;
``chunks`` counts content events (one token each unless the client lagged or
``--stream-interval`` > 1). ``status`` is ``ok``, ``aborted`` (the client went away) or
``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

from aiohttp import web

from cleanslate import wire
from cleanslate.sim import ledger
from cleanslate.sim.engine import NAN_TOKEN_ID, Engine, SimRequest
from cleanslate.sim.faults import Faults
from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
from cleanslate.sim.model import CONTEXT_MIB, SimModel, SimSettings
from cleanslate.sim.text import NAN_BYTES, VOCAB_BYTES, count_words, text_seed

WORKER_GRACE_S = 3.0
HEALTH_GENERATE_TIMEOUT_S = 20.0
LOAD_S = 0.2
SHM_PREFIX = "cleanslate-sim-"
BANNER = (
    "cleanslate sim: a SIMULATED inference engine (no GPU, no model weights; token text is "
    "synthetic). It exists for tests and demos."
)
OWNED_BY = "cleanslate-sim (simulation, not a real model)"
SERVER_HEADER = "cleanslate-sim (simulation)"


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

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path


def log(message: str) -> None:
    sys.stderr.write(f"[{datetime.now():%Y-%m-%d %H:%M:%S}] {message}\n")
    sys.stderr.flush()


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response(wire.http_error_body(status, message, kind), status=status)


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
        settings = SimSettings(**{**opts.settings.to_dict(), "gpu_memory_mib": gpu_mib})
        self.model = SimModel(settings)
        self.workers: list[_Worker] = []
        self.engine: Engine | None = None
        self.shutting_down = False
        self.exit_code = 0
        self.done = asyncio.Event()
        self.sock: socket.socket | None = None
        self.shm_files: list[str] = []
        self.gt: IO[str] | None = None
        self._ids = itertools.count(1)
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
        self.engine = Engine(self.model, opts.faults, self._on_crash, log, opts.log_interval_steps)
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
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health_generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.SockSite(runner, self.sock)
        await site.start()
        self.engine.start()
        self._watchers = [loop.create_task(self._watch(w)) for w in self.workers]
        log(
            f"max_total_num_tokens={plan.kv_capacity_tokens}, "
            f"max_running_requests={self.model.s.max_running_requests}, "
            f"chunked_prefill_size={self.model.s.chunked_prefill_size}, "
            f"context_len={self.model.s.context_length}"
        )
        log(f"Uvicorn running on http://{opts.host}:{opts.port} (simulated engine)")
        log("The server is fired up and ready to roll! (simulation)")
        await self.done.wait()
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
            worker_plan = {
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

    # --- HTTP ----------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200, headers={"Server": SERVER_HEADER})

    async def health_generate(self, request: web.Request) -> web.Response:
        """SGLang's deeper health check: one token through the scheduler, 503 after 20 s."""
        engine = self.engine
        assert engine is not None
        req = SimRequest(f"health-{next(self._ids)}", 1, 1, 0, True, 1)
        engine.submit(req, probe=True)
        try:
            while not req.finished:
                await asyncio.wait_for(req.next_tokens(), HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            return web.Response(status=503, text="the scheduler did not answer")
        finally:
            engine.finish(req)
        return web.Response(status=200, headers={"Server": SERVER_HEADER})

    async def models(self, request: web.Request) -> web.Response:
        body = wire.models_body(
            [
                {
                    "id": self.opts.model_name,
                    "created": self._created,
                    "owned_by": OWNED_BY,
                    "root": self.opts.model_path,
                    "max_model_len": self.model.s.context_length,
                }
            ]
        )
        return web.json_response(body, headers={"Server": SERVER_HEADER})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    def _prompt(self, body: dict[str, Any], chat: bool) -> tuple[int, str]:
        """(prompt tokens, the key that seeds the text); raises ValueError for bad input."""
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise ValueError("'messages' must be a non-empty list")
            n = 3
            parts: list[str] = []
            for m in messages:
                if not isinstance(m, dict):
                    raise ValueError("each message must be an object")
                content = m.get("content") or ""
                if isinstance(content, list):
                    content = " ".join(
                        str(c.get("text", "")) for c in content if isinstance(c, dict)
                    )
                text = str(content)
                parts.append(text)
                n += 3 + count_words(text)
            return n, "\n".join(parts)
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return max(1, count_words(prompt)), prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt), ",".join(map(str, prompt[:64]))
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return max(1, count_words(prompt[0])), prompt[0]
        raise ValueError("'prompt' must be a string or a list of token ids (one prompt)")

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        arrival, arrival_mono = time.time(), time.monotonic()
        engine = self.engine
        assert engine is not None
        try:
            body = json.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            prompt_tokens, key = self._prompt(body, chat)
        except ValueError as exc:
            return _error(400, f"invalid request: {exc}")
        model = body.get("model")
        if model not in (None, self.opts.model_name, self.opts.model_path):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        ctx = self.model.s.context_length
        default_max = 16 if not chat else max(1, ctx - prompt_tokens)
        max_new = body.get("max_completion_tokens") if chat else None
        if max_new is None:
            max_new = body.get("max_tokens")
        if max_new is None:
            max_new = default_max
        try:
            max_new = int(max_new)
            min_new = int(body.get("min_tokens") or 0)
        except (TypeError, ValueError):
            return _error(400, "max_tokens and min_tokens must be integers")
        if max_new < 1:
            return _error(400, f"max_tokens must be at least 1, got {max_new}.")
        if prompt_tokens + max_new > ctx:
            return _error(
                400,
                f"This model's maximum context length is {ctx} tokens. However, you requested "
                f"{prompt_tokens + max_new} tokens ({prompt_tokens} in the messages, {max_new} "
                "in the completion). Please reduce the length of the messages or completion.",
            )
        seed = body.get("seed")
        state = text_seed(self.model.s.seed, key, seed if isinstance(seed, int) else None)
        req = SimRequest(
            f"{'chatcmpl' if chat else 'cmpl'}-sim-{os.getpid()}-{next(self._ids)}",
            prompt_tokens,
            max_new,
            min_new,
            bool(body.get("ignore_eos", False)),
            state,
            self.opts.stream_interval,
        )
        if engine.prefix_cache is not None:
            req.cached = engine.prefix_cache.lookup_and_insert(key, prompt_tokens)
        if not engine.fits_ever(prompt_tokens, req.stop_at):
            return _error(
                400,
                f"the request needs {req.kv_tokens} tokens of KV cache but the simulated server "
                f"has {engine.kv_capacity} in total",
            )
        record: dict[str, Any] = {
            "id": req.rid,
            "endpoint": "chat/completions" if chat else "completions",
            "stream": bool(body.get("stream", False)),
            "status": "error",
            "arrival": arrival,
            "arrival_mono": arrival_mono,
            "first_token": None,
            "first_token_mono": None,
            "last_token": None,
            "last_token_mono": None,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": req.cached,
            "completion_tokens": 0,
            "chunks": 0,
            "finish_reason": None,
        }
        engine.submit(req)
        try:
            if body.get("stream"):
                so = body.get("stream_options")
                usage = isinstance(so, dict) and bool(so.get("include_usage"))
                return await self._stream(request, req, chat, usage, record)
            return await self._whole(req, chat, record)
        except (ConnectionError, asyncio.CancelledError):
            record["status"] = "aborted"
            raise
        finally:
            engine.finish(req)
            if self.gt is not None:
                self.gt.write(json.dumps(record) + "\n")

    async def _stream(
        self,
        request: web.Request,
        req: SimRequest,
        chat: bool,
        usage: bool,
        record: dict[str, Any],
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={
                "Content-Type": wire.EVENT_STREAM,
                "Cache-Control": "no-cache",
                "Server": SERVER_HEADER,
            }
        )
        await resp.prepare(request)
        chunks_of = wire.ChunkTemplate(
            req.rid, self.opts.model_name, chat=chat, created=int(time.time())
        )
        if chat:
            await resp.write(chunks_of.role())
        content = chunks_of.content
        vocab = VOCAB_BYTES
        chunks = 0
        first = True
        while True:
            toks, done = await req.next_tokens()
            if toks:
                text = b"".join(NAN_BYTES if t == NAN_TOKEN_ID else vocab[t] for t in toks)
                now = time.time()
                if first:
                    record["first_token"] = now
                    record["first_token_mono"] = time.monotonic()
                    first = False
                if done:
                    record["last_token"] = now
                    record["last_token_mono"] = time.monotonic()
                await resp.write(content(text, req.finish_reason if done else None))
                chunks += 1
            if done:
                break
        record["completion_tokens"] = req.generated
        record["chunks"] = chunks
        record["finish_reason"] = req.finish_reason
        out = chunks_of.usage(req.prompt_tokens, req.generated, self._cached(req)) if usage \
            else b""
        await resp.write(out + wire.DONE_EVENT)
        record["status"] = "ok"
        await resp.write_eof()
        return resp

    def _cached(self, req: SimRequest) -> int | None:
        """The request's cached prompt tokens for its usage (``None`` with the cache off)."""
        return None if self.engine is None or self.engine.prefix_cache is None else req.cached

    async def _whole(self, req: SimRequest, chat: bool, record: dict[str, Any]) -> web.Response:
        tokens: list[int] = []
        while True:
            toks, done = await req.next_tokens()
            tokens.extend(toks)
            if done:
                break
        text = b"".join(NAN_BYTES if t == NAN_TOKEN_ID else VOCAB_BYTES[t] for t in tokens)
        body = wire.whole_response(
            req.rid,
            self.opts.model_name,
            chat=chat,
            created=int(time.time()),
            text=text.decode(),
            finish_reason=req.finish_reason,
            prompt_tokens=req.prompt_tokens,
            completion_tokens=req.generated,
            cached_tokens=self._cached(req),
        )
        now, mono = time.time(), time.monotonic()
        record.update(
            first_token=now,
            first_token_mono=mono,
            last_token=now,
            last_token_mono=mono,
            completion_tokens=req.generated,
            chunks=1,
            finish_reason=req.finish_reason,
            status="ok",
        )
        return web.json_response(body, headers={"Server": SERVER_HEADER})


def serve(opts: ServeOptions) -> int:
    """Run the launcher until it is stopped; returns the process exit status."""
    launcher = Launcher(opts)
    return asyncio.run(launcher.run())
