"""Running levels: closed and open loops over one shared connection pool, with liveness.

Contract of :func:`run_level`: it returns a :class:`LevelResult` and never raises for anything
the server does (refused connections, resets, HTTP errors, malformed streams, timeouts are
counted by type). Every request the level sends ends in its records, completed or failed by a
class (whatever was raised on its path; ``aborted`` when the level ended with it in flight), and
no request of a level is in flight after its result is made: the result's ``sent`` is
``completed + failed`` (:mod:`cleanslate.bench._summary` checks it). The level ends early, with
``partial=True``, when

* the server stops accepting connections: any connection-class error, or no byte received from
  any request for ``stall_timeout_s`` while requests are in flight, triggers a TCP connect probe
  of the server (1 s timeout); a failed probe ends the level at once (in-flight requests are
  cancelled and counted as ``aborted``), so a server that dies ends the level within a few
  seconds;
* ``stop`` (an :class:`asyncio.Event` the caller owns, e.g. set on Ctrl-C) is set.

Each request ends within its deadline (``BenchConfig.request_timeout_s``, by default derived
from its output length), so a server that streams forever ends a level too; a duration-mode
level stops sending after :data:`~cleanslate.bench._limits.MAX_NUM_PROMPTS` requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import math
import time
import zlib
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from time import perf_counter
from urllib.parse import urlsplit

import aiohttp
import numpy as np

from cleanslate import __version__
from cleanslate.bench import _keepalive as keepalive
from cleanslate.bench import _metrics as m
from cleanslate.bench._arrivals import iter_offsets
from cleanslate.bench._bottleneck import diagnosed
from cleanslate.bench._client import (
    CONNECTION_ERRORS,
    TEXT_CHARS,
    RequestBuilder,
    RequestRecord,
    aborted_record,
    failed_record,
    printable,
    send_request,
)
from cleanslate.bench._context import fit_config
from cleanslate.bench._conversation import (
    ConversationWorkload,
    History,
    conversations,
    history_text,
    history_tokens,
)
from cleanslate.bench._ending import answered, connection_crash, ended_by_errors
from cleanslate.bench._limits import MAX_NUM_PROMPTS
from cleanslate.bench._models import (
    AnyLoad,
    BenchConfig,
    BenchResult,
    ClosedLoop,
    LevelResult,
    OpenLoop,
    ReplayLoad,
)
from cleanslate.bench._observe import (
    Harness,
    LevelContext,
    LevelEnd,
)
from cleanslate.bench._observers import start_all, stop_all
from cleanslate.bench._ramp import RampLoad
from cleanslate.bench._repeats import combine, target_reached
from cleanslate.bench._server_config import ServerConfig, read_server_config
from cleanslate.bench._summary import LevelRun, level_result
from cleanslate.bench._tokens import HFTokenizer, Tokenizer
from cleanslate.bench._trace import TraceWorkload, expected_cached, trace_info
from cleanslate.bench._workloads import Prompt, generate
from cleanslate.hosts.forward import connector_for, open_connection


@dataclass
class LevelProgress:
    """Live counters of the running level, read by the live view (never by the metrics)."""

    label: str
    total: int | None
    duration_s: float | None
    target_rate: float | None
    t_start: float = field(default_factory=perf_counter)
    sent: int = 0
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    output_tokens: int = 0
    chunks: list[int] = field(default_factory=lambda: [0])
    errors: Counter[str] = field(default_factory=Counter)
    first_send: float | None = None
    last_send: float | None = None
    finished: bool = False
    #: the level's running observers: the live view asks those with a ``latest()`` for their
    #: newest reading (``bench._live.live_readings``)
    watching: tuple[object, ...] = ()

    def achieved_rate(self) -> float:
        if self.first_send is None or self.last_send is None or self.sent < 2:
            return 0.0
        span = self.last_send - self.first_send
        return (self.sent - 1) / span if span > 0 else 0.0


ProgressHook = Callable[[LevelProgress], None]


#: Requests of a level whose text is kept and checked (:mod:`cleanslate.outputs`): the first
#: :data:`SAMPLE_FIRST`, then every :data:`SAMPLE_EVERY`-th, at most :data:`SAMPLE_MAX`.
SAMPLE_FIRST, SAMPLE_EVERY, SAMPLE_MAX = 4, 16, 32

#: Characters of an answer a conversation keeps to send back in its next turn (an answer of
#: 16 Ki tokens, at about 4 characters each).
MAX_ANSWER_CHARS = 1 << 16


def sampled(index: int) -> bool:
    """Whether the ``index``-th request sent in a level (from 0) is one of its output samples."""
    if index < SAMPLE_FIRST:
        return True
    return index % SAMPLE_EVERY == 0 and SAMPLE_FIRST + index // SAMPLE_EVERY <= SAMPLE_MAX


class _Level:
    """State of one running level."""

    def __init__(
        self,
        config: BenchConfig,
        load: AnyLoad,
        session: aiohttp.ClientSession,
        builder: RequestBuilder,
        tokenizer: Tokenizer | None,
        prompts: list[Prompt],
        progress: LevelProgress,
        stop: asyncio.Event | None,
    ) -> None:
        self.config = config
        self.load = load
        self.session = session
        self.builder = builder
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.progress = progress
        self.stop = stop
        self.records: list[RequestRecord] = []
        self.abort = asyncio.Event()
        self.abort_reason: str | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._probing = False
        self.capped = False
        self.reference: LevelResult | None = None
        split = urlsplit(builder.url)
        self.host = split.hostname or "127.0.0.1"
        self.port = split.port or (443 if split.scheme == "https" else 80)
        self.talking = isinstance(config.workload, ConversationWorkload)
        # Built before the clock starts; a conversation's are built from its history as it runs.
        self.bodies = [] if self.talking else [builder.body(p) for p in prompts]
        self.sent_order: list[int] = []
        self.uses = [0] * len(prompts)  # times each prompt was sent in this level
        self.t0 = perf_counter()
        self.deadline = (self.t0 + config.duration_s if config.duration_s is not None
                         else math.inf)

    def prompt_iter(self) -> Iterator[int]:
        """Indices of the prompts to send: ``num_prompts`` of them, or cycling until the
        deadline in duration mode (at most ``MAX_NUM_PROMPTS`` requests: every request's record
        is kept until the level ends)."""
        n = len(self.prompts)
        if self.config.duration_s is None:
            yield from range(n)
        else:
            for i in range(MAX_NUM_PROMPTS):
                yield i % n
            self.capped = True

    def end(self, reason: str) -> None:
        if self.abort_reason is None:
            self.abort_reason = reason
        self.abort.set()

    async def one(self, idx: int, *, scheduled: float | None = None,
                  history: History | None = None) -> tuple[RequestRecord, str | None]:
        """Send prompt ``idx`` now and record it: its record, and with ``history`` (the
        conversation so far, ending with this prompt's message) the answer's whole text.
        ``scheduled``: when the load meant to send it (``perf_counter`` seconds): the record's
        lag is the difference."""
        prompt = self.prompts[idx]
        prog = self.progress
        now = perf_counter()
        sample = sampled(prog.sent)
        prog.sent += 1
        prog.in_flight += 1
        if prog.first_send is None:
            prog.first_send = now
        prog.last_send = now
        self.sent_order.append(idx)
        cycle = self.uses[idx]
        self.uses[idx] = cycle + 1
        request = prompt
        try:
            if history is None and cycle == 0:
                body = self.bodies[idx]
            elif history is None:  # sent before in this level: a new start, or a cache hit
                request = replace(prompt, text=salted(prompt.text, cycle))
                body = self.builder.body(request)
            else:
                request, body = self.turn_request(prompt, history)
            rec = await send_request(
                self.session,
                self.builder,
                request,
                body,
                tokenizer=self.tokenizer,
                on_chunk=prog.chunks,
                keep_text=sample or history is not None,
                text_limit=TEXT_CHARS if history is None else MAX_ANSWER_CHARS,
            )
        except Exception as exc:  # send_request raises nothing; building the request may
            rec = failed_record(request, now, exc)
        except BaseException:  # cancelled (the level ended early) or the process is ending
            record = aborted_record(request, now)
            record.turn = prompt.turn
            self.records.append(record)
            prog.in_flight -= 1
            prog.failed += 1
            prog.errors["aborted"] += 1
            raise
        rec.turn = prompt.turn
        if scheduled is not None:
            rec.lag_s = max(0.0, now - scheduled)
        answer = rec.text
        if not sample:  # only the sampled texts are the level's output checks
            rec.text = None
        elif answer is not None:
            rec.text = answer[:TEXT_CHARS]
        prog.in_flight -= 1
        self.records.append(rec)
        if rec.error is None:
            prog.done += 1
            prog.output_tokens += rec.output_tokens
        else:
            prog.failed += 1
            prog.errors[rec.error] += 1
            if rec.error in CONNECTION_ERRORS:
                self.check_server()
        return rec, answer

    def turn_request(self, prompt: Prompt, history: History) -> tuple[Prompt, bytes]:
        """The request of a conversation's next turn: its whole history, counted."""
        count = history_tokens(history, self.tokenizer)
        if self.builder.endpoint == "completions":
            text = history_text(history)
            request = replace(prompt, text=text, input_tokens=count)
            return request, self.builder.body(request)
        request = replace(prompt, input_tokens=count)
        return request, self.builder.body(request, history)

    def check_server(self) -> None:
        """Start a liveness probe unless one is running."""
        if self._probing or self.abort.is_set():
            return
        self._probing = True
        task = asyncio.get_running_loop().create_task(self._probe())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _probe(self) -> None:
        try:
            fut = open_connection(self.builder.url, self.host, self.port)
            _reader, writer = await asyncio.wait_for(fut, timeout=1.0)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        except (OSError, TimeoutError) as exc:
            self.end(f"server unreachable at {self.host}:{self.port} ({type(exc).__name__})")
        finally:
            self._probing = False

    async def watchdog(self) -> None:
        """Probe the server when nothing arrives for ``stall_timeout_s``; honour ``stop``."""
        last_chunks = -1
        last_change = perf_counter()
        while not self.abort.is_set():
            await asyncio.sleep(0.25)
            if self.stop is not None and self.stop.is_set():
                self.end("interrupted")
                return
            chunks = self.progress.chunks[0]
            now = perf_counter()
            if chunks != last_chunks or self.progress.in_flight == 0:
                last_chunks, last_change = chunks, now
            elif now - last_change > self.config.stall_timeout_s:
                last_change = now
                self.check_server()

    def due(self) -> bool:
        """Whether the level still sends."""
        return not self.abort.is_set() and perf_counter() < self.deadline

    async def closed(self, concurrency: int) -> None:
        it = self.prompt_iter()

        async def worker() -> None:
            for idx in it:
                if not self.due():
                    return
                await self.one(idx)

        await together(worker() for _ in range(concurrency))

    async def wait_until(self, when: float) -> None:
        """Sleep until ``when`` (``perf_counter`` seconds). A plain sleep: a level that ends
        early cancels its whole body (:meth:`run`), and a timer costs the loop less than a
        wait for the abort event with a timeout (a task each), which showed in the lag of a
        200 req/s schedule."""
        delay = when - perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)

    async def scheduled(self, times: Iterator[tuple[float, Callable[[float], Awaitable[object]]]],
                        cap: int | None) -> None:
        """Start each ``(offset, send)`` at ``t0 + offset`` (an open loop), at most ``cap`` in
        flight (a due send waits for a free slot; its lag counts the wait)."""
        sem = asyncio.Semaphore(cap) if cap else None
        t0 = perf_counter()

        async def guarded(send: Callable[[float], Awaitable[object]], when: float) -> None:
            try:
                await send(when)
            finally:
                if sem is not None:
                    sem.release()

        # One task group: a level ended early cancels every send in flight (each counted as
        # aborted) before its result is made, and none outlives the level.
        async with asyncio.TaskGroup() as group:
            for offset, send in times:
                when = t0 + offset
                await self.wait_until(when)
                if not self.due():
                    break
                if sem is not None:
                    await sem.acquire()
                    if not self.due():
                        sem.release()
                        break
                group.create_task(guarded(send, when))

    def sends(self, offsets: Iterator[float], indices: Iterator[int] | None = None
              ) -> Iterator[tuple[float, Callable[[float], Awaitable[object]]]]:
        """``(offset, send)`` of the level's prompts (``indices``, by default
        :meth:`prompt_iter`'s) at ``offsets``."""
        for offset, idx in zip(offsets, indices or self.prompt_iter(), strict=False):
            yield offset, functools.partial(self._send_at, idx)

    async def _send_at(self, idx: int, when: float) -> None:
        await self.one(idx, scheduled=when)

    async def open(self, load: OpenLoop) -> None:
        offsets = iter_offsets(load, seed=self.config.seed)  # endless; prompts bound it
        await self.scheduled(self.sends(offsets), load.max_concurrency)

    async def replay(self, load: ReplayLoad) -> None:
        """The trace's requests at their own times (divided by the level's ``speedup``); the
        replay ends with the scheduled ones."""
        timed = itertools.takewhile(lambda p: p.at_s is not None, self.prompts)
        offsets = ((p.at_s or 0.0) / load.speedup for p in timed)
        await self.scheduled(self.sends(offsets), load.max_concurrency)

    async def ramp(self, load: RampLoad) -> None:
        """A concurrency ramp's users, each sending only in its span; or a rate ramp's
        arrivals (:mod:`cleanslate.bench._ramp`)."""
        if load.of == "rate":
            offsets = iter(load.offsets(self.config.seed, MAX_NUM_PROMPTS))
            await self.scheduled(self.sends(offsets, self.cycled()), None)
            return
        it = self.cycled()

        async def user(span: tuple[float, float]) -> None:
            await self.wait_until(self.t0 + span[0])
            for idx in it:
                if not self.due() or perf_counter() >= self.t0 + span[1]:
                    return
                await self.one(idx)

        spans = [span for i in range(load.max_concurrency or 1)
                 if (span := load.user_span(i)) is not None]
        await together(user(span) for span in spans)

    def cycled(self) -> Iterator[int]:
        """The prompts' indices over and over (a level bounded by time), at most
        ``MAX_NUM_PROMPTS`` of them."""
        n = len(self.prompts)
        for i in range(MAX_NUM_PROMPTS):
            yield i % n
        self.capped = True

    async def converse(self, load: ClosedLoop | OpenLoop) -> None:
        """Conversations instead of requests: a closed loop's users each run one after the
        other; an open loop starts one at each arrival (:mod:`cleanslate.bench._conversation`)."""
        talks = conversations(self.prompts)
        order: Iterator[list[int]] = (
            (talks[i % len(talks)] for i in range(MAX_NUM_PROMPTS))
            if self.config.duration_s is not None else iter(talks))
        if isinstance(load, ClosedLoop):
            async def user() -> None:
                for talk in order:
                    if not self.due():
                        return
                    await self.talk(talk)

            await together(user() for _ in range(load.concurrency))
            return
        offsets = iter_offsets(load, seed=self.config.seed)
        starts = ((offset, functools.partial(self._talk_at, talk))
                  for offset, talk in zip(offsets, order, strict=False))
        await self.scheduled(starts, load.max_concurrency)

    async def _talk_at(self, talk: list[int], when: float) -> None:
        await self.talk(talk, scheduled=when)

    async def talk(self, talk: list[int], *, scheduled: float | None = None) -> None:
        """One conversation: each turn carries the history and the answers so far; a failed
        turn ends it."""
        spec = self.config.workload
        think = spec.think_time_s if isinstance(spec, ConversationWorkload) else 0.0
        system = self.prompts[talk[0]].system
        history: History = [("system", system)] if system is not None else []
        cycle = self.uses[talk[0]]
        for n, idx in enumerate(talk):
            if not self.due():
                return
            text = self.prompts[idx].text
            history.append(("user", salted(text, cycle) if n == 0 and cycle else text))
            rec, answer = await self.one(idx, scheduled=scheduled if n == 0 else None,
                                         history=history)
            if rec.error is not None:
                return
            history.append(("assistant", answer or ""))
            if think > 0 and n + 1 < len(talk):
                await self.wait_until(perf_counter() + think)

    def body(self) -> Coroutine[object, object, None]:
        """What this level runs, by its load and workload."""
        load = self.load
        if self.talking and isinstance(load, ClosedLoop | OpenLoop):
            return self.converse(load)
        if isinstance(load, ReplayLoad):
            return self.replay(load)
        if isinstance(load, RampLoad):
            return self.ramp(load)
        if isinstance(load, ClosedLoop):
            return self.closed(load.concurrency)
        return self.open(load)

    async def run(self) -> None:
        self.t0 = perf_counter()
        if isinstance(self.load, RampLoad):
            self.deadline = self.t0 + self.load.duration_s
        body = self.body()
        main = asyncio.get_running_loop().create_task(body)
        dog = asyncio.get_running_loop().create_task(self.watchdog())
        aborted = asyncio.get_running_loop().create_task(self.abort.wait())
        try:
            await asyncio.wait({main, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (main, dog, aborted, *self.tasks):
                task.cancel()
            await asyncio.gather(main, dog, aborted, *self.tasks, return_exceptions=True)
        if main.done() and not main.cancelled() and (exc := main.exception()) is not None:
            # a fault of the client's own loop, not of a request (each is counted where it
            # ends): the level says so instead of passing for whole
            while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
                exc = exc.exceptions[0]
            self.end(f"client error: {printable(f'{type(exc).__name__}: {exc}')}")


async def together(coros: Iterable[Coroutine[object, object, None]]) -> None:
    """Run ``coros`` (a level's users or workers) as one task group: cancelled together when
    the level ends early, and one that raises cancels the others, so that no request of a
    level is still in flight, or sent, after its result is made."""
    async with asyncio.TaskGroup() as group:
        for coro in coros:
            group.create_task(coro)


def salted(text: str, cycle: int) -> str:
    """A prompt sent again in one level (a level bounded by time that went through its
    prompts, a ramp), with the round's number first: a different first token, so a server's
    prefix cache (which matches from the first token) cannot serve it from the last round."""
    return f"{cycle}: {text}"


def make_session(config: BenchConfig) -> aiohttp.ClientSession:
    """The one connection pool of a run: keep-alive, no connection limit; a read that waits
    longer than ``read_timeout_s`` fails the request as ``timeout`` (each request's total
    deadline is enforced by :func:`~cleanslate.bench._client.send_request`)."""
    # A forwarded base URL (a remote run) is reached over its private Unix socket.
    connector = connector_for(config.url, limit=0, ttl_dns_cache=300)
    timeout = aiohttp.ClientTimeout(
        total=None, sock_read=config.read_timeout_s, sock_connect=10.0
    )
    return aiohttp.ClientSession(connector=connector, timeout=timeout,
                                 trace_configs=[keepalive.trace_config()])


def load_tokenizer(path: str | None) -> Tokenizer | None:
    return HFTokenizer(path) if path else None


_levels_measuring = 0


@contextlib.contextmanager
def collector_held() -> Iterator[None]:
    """Keep Python's full garbage collection out of a measured level. A collection of the
    oldest generation walks every object this process holds; in a tuning process (its store,
    models, the engines' adapters) that took 70-90 ms on an idle 2-core machine and 150-250 ms
    on a loaded one, a pause of every stream at once that a 1-second level measured as a
    configuration 14-30 % slower than itself. Before the first of the levels measuring at once
    the heap is collected and frozen (:func:`gc.freeze`), so a collection during the level
    visits only what the level allocates; the last one to end unfreezes it."""
    global _levels_measuring
    if _levels_measuring == 0:
        gc.collect()
        gc.freeze()
    _levels_measuring += 1
    try:
        yield
    finally:
        _levels_measuring -= 1
        if _levels_measuring == 0:
            gc.unfreeze()


async def run_level(
    config: BenchConfig,
    load: AnyLoad,
    harness: Harness | None = None,
    *,
    prompts: list[Prompt] | None = None,
    warmup: int = 0,
    reference: LevelResult | None = None,
) -> LevelResult:
    """Run one level of ``config`` at ``load`` and measure it once, with ``config.seed``
    (:func:`run_repeats` measures it ``config.repeats`` times).

    ``harness``: the run's pool, tokenizer, live-view hook, stop event and observers
    (:class:`~cleanslate.bench._observe.Harness`; a pool is made and closed here when it has
    none). ``reference``: the run's first level, whose sampled outputs tell whether this
    level's went bad under load (:func:`cleanslate.outputs.level_verdict`); ``None`` for the
    first level. ``prompts``: the level's prompts (generated from ``config.workload`` and the
    level's own seed, :func:`level_seed`, when not given). ``warmup``: requests sent and
    discarded before the level.
    """
    harness = harness or Harness()
    tokenizer = harness.tokenizer
    if tokenizer is None and config.tokenizer:
        tokenizer = load_tokenizer(config.tokenizer)
    num_prompts = config.prompts_for(load)
    if prompts is None:
        prompts = generate(config.workload, num_prompts,
                           seed=level_seed(config.seed, load.label), tokenizer=tokenizer)
    if harness.session is None:
        async with make_session(config) as own:
            return await run_level(config, load, harness.with_session(own, tokenizer),
                                   prompts=prompts, warmup=warmup, reference=reference)
    result, _samples = await _measure(config, load, harness.with_session(harness.session,
                                                                         tokenizer),
                                      prompts, warmup, reference)
    return result


def level_end(load: AnyLoad, records: list[RequestRecord]) -> LevelEnd:
    """The window an observer summarizes: a closed loop's steady window, else (and when it
    has none) first send to last receive."""
    if not records:
        return LevelEnd(window=None, level_span=None, output_tokens=0, completed=0)
    span = m.window(records)
    steady_span = (m.steady_window(records, load.concurrency)
                   if isinstance(load, ClosedLoop) else None)
    done = [r for r in records if r.ok]
    return LevelEnd(window=steady_span or span, level_span=span,
                    output_tokens=sum(r.output_tokens for r in done), completed=len(done))


async def _measure(
    config: BenchConfig,
    load: AnyLoad,
    harness: Harness,
    prompts: list[Prompt],
    warmup: int,
    reference: LevelResult | None,
    *,
    tag: str | None = None,
) -> tuple[LevelResult, dict[str, np.ndarray]]:
    """One measurement of a level: its result and its per-request latency samples (ms).
    ``harness.session`` is set. ``tag``: what the live view and the observers' artifacts
    call it (the level's label by default)."""
    session = harness.session
    assert session is not None
    tokenizer = harness.tokenizer
    builder = RequestBuilder(
        config.url,
        config.model,
        config.endpoint,
        ignore_eos=config.ignore_eos,
        extra_body=config.extra_body,
        api_key=config.api_key,
        deadline_s=config.request_timeout_s,
    )
    if warmup:
        await _warmup(session, builder, prompts, warmup, load, tokenizer, config)
    progress = LevelProgress(
        label=tag or load.label,
        total=None if config.duration_s is not None else len(prompts),
        duration_s=config.duration_s,
        target_rate=load.rate if isinstance(load, OpenLoop) else None,
    )
    if harness.on_progress is not None:
        harness.on_progress(progress)
    # the observers' baselines are taken before the level sends its first request
    failures: list[str] = []
    observers = await start_all(harness, LevelContext(progress.label, load, config, session),
                                failures)
    progress.watching = tuple(observers)
    level: _Level | None = None
    try:
        with collector_held():  # before the level: its clock starts when it is made
            level = _Level(config, load, session, builder, tokenizer, prompts, progress,
                           harness.stop)
            level.reference = reference
            cpu0, wall0 = time.process_time(), perf_counter()
            await level.run()
            cpu_s, wall_s = time.process_time() - cpu0, perf_counter() - wall0
    except BaseException:
        with contextlib.suppress(Exception):
            await stop_all(observers, level_end(load, level.records if level else []))
        raise
    observed = await stop_all(observers, level_end(load, level.records), failures)
    progress.finished = True
    latency = m.samples_ms(level.records)
    expected = (expected_cached([prompts[i] for i in level.sent_order])
                if isinstance(config.workload, TraceWorkload) else None)
    run = LevelRun(config=config, records=level.records, capped=level.capped,
                   tokenized=level.tokenizer is not None, reference=level.reference,
                   abort_reason=level.abort_reason, t0=level.t0, expected_cached=expected,
                   sent=progress.sent)
    if isinstance(load, ReplayLoad | RampLoad):  # their schedule decides: what was sent
        count = len(level.sent_order)
    else:
        count = len(prompts) if config.duration_s is None else 0
    result = level_result(run, load, cpu_s, wall_s, count, latency)
    if observed:
        for seen in observed:
            harness.keep(progress.label, seen)
        result = result.model_copy(update={seen.key: seen.summary for seen in observed})
    if failures:
        result = result.model_copy(update={"warnings": (*result.warnings, *failures)})
    return result, latency


async def run_repeats(
    config: BenchConfig,
    load: AnyLoad,
    harness: Harness | None = None,
    *,
    warmup: int = 0,
    reference: LevelResult | None = None,
) -> LevelResult:
    """Measure one level ``config.max_repeats`` times, back to back, and combine the repeats
    (:func:`cleanslate.bench._repeats.combine`: means with Student-t intervals, pooled
    percentiles with bootstrap intervals, each repeat kept under ``repeats``).

    Repeat ``r`` (from 0) uses the seed ``config.seed + r`` for its prompts and arrivals (so
    repeat 0 is what one measurement is, and no repeat's prompts are in the server's prefix
    cache from the one before). With ``config.target_ci_pct`` it stops once three or more
    repeats give an output-throughput interval within that percent of the mean. A partial
    repeat (the server died, Ctrl-C) ends the repeats. ``warmup`` requests go before the first
    repeat only; ``harness`` and ``reference`` are as for :func:`run_level` (``None``: the
    first repeat is its own reference for the later ones)."""
    harness = harness or Harness()
    tokenizer = harness.tokenizer
    if tokenizer is None and config.tokenizer:
        tokenizer = load_tokenizer(config.tokenizer)
    if harness.session is None:
        async with make_session(config) as own:
            return await run_repeats(config, load, harness.with_session(own, tokenizer),
                                     warmup=warmup, reference=reference)
    harness = harness.with_session(harness.session, tokenizer)
    results: list[LevelResult] = []
    samples: list[dict[str, np.ndarray]] = []
    for r in range(config.max_repeats):
        seed = config.seed + r
        cfg = config if r == 0 else config.model_copy(update={"seed": seed})
        prompts = generate(config.workload, config.prompts_for(load),
                           seed=level_seed(seed, load.label), tokenizer=tokenizer)
        ref = reference if reference is not None else (results[0] if results else None)
        tag = load.label if config.max_repeats == 1 else (
            f"{load.label} repeat {r + 1}/{config.max_repeats}")
        result, sample = await _measure(cfg, load, harness, prompts,
                                        warmup if r == 0 else 0, ref, tag=tag)
        results.append(result)
        samples.append(sample)
        if result.partial:
            break
        if config.target_ci_pct is not None and target_reached(
                [x.output_throughput for x in results], config.target_ci_pct):
            break
    return combine(results, samples, max_error_rate=config.max_error_rate, seed=config.seed,
                   target_pct=config.target_ci_pct)


def level_seed(seed: int, label: str) -> int:
    """The seed of one level's prompts: each level (and the warmup, ``label="warmup"``) gets
    prompts of its own, so a server's prefix cache (SGLang's radix cache, vLLM's prefix caching,
    llama.cpp's prompt cache, all on by default) cannot serve a level from the previous one.
    The same ``seed`` and level give the same prompts in every trial of a study."""
    return zlib.crc32(f"{seed}/{label}".encode())


async def _warmup(
    session: aiohttp.ClientSession,
    builder: RequestBuilder,
    prompts: list[Prompt],
    n: int,
    load: AnyLoad,
    tokenizer: Tokenizer | None,
    config: BenchConfig,
) -> None:
    slots = load.concurrency if isinstance(load, ClosedLoop) else (load.max_concurrency or n)
    sem = asyncio.Semaphore(max(1, min(slots, n)))
    # Prompts of its own: warming up on the level's prompts would put them in the cache.
    prompts = generate(config.workload, min(n, len(prompts)) or 1,
                       seed=level_seed(config.seed, "warmup"), tokenizer=tokenizer)

    async def one(i: int) -> None:
        async with sem:  # send_request never raises and ends within its deadline
            p = prompts[i % len(prompts)]
            await send_request(session, builder, p, builder.body(p), tokenizer=tokenizer)

    await asyncio.gather(*(one(i) for i in range(n)))


async def read_config_once(harness: Harness, session: aiohttp.ClientSession,
                           config: BenchConfig) -> ServerConfig | None:
    """The server's configuration in effect, read once before a run's first level over its
    pool: by ``harness.read_config`` (an adapter's, with the flags asked), else from a bare
    URL (:func:`~cleanslate.bench._server_config.read_server_config`: the flavour from what
    answers, nothing asked). ``None`` when the run observes nothing (``--no-observe``)."""
    if config.observe is None or not config.observe.enabled:
        return None
    if harness.read_config is not None:
        return await harness.read_config(session, config.url)
    return await read_server_config(session, config.url)


async def run_benchmark(
    config: BenchConfig,
    harness: Harness | None = None,
) -> BenchResult:
    """Run every level of ``config`` in order over one connection pool, each
    ``config.max_repeats`` times (:func:`run_repeats`), watched by ``harness``'s observers.

    Levels after a partial one are not run (the server is gone or the run was interrupted),
    nor after one where the server crashed (its ``crash``: ``harness.check_crash``, else what
    the connections showed) or whose requests all failed for one cause; the result's
    ``ended_early`` says which, with the fix (:mod:`cleanslate.bench._ending`).
    """
    harness = harness or Harness()
    started = datetime.now(UTC)
    cpu0, wall0 = time.process_time(), perf_counter()
    tokenizer = harness.tokenizer or load_tokenizer(config.tokenizer)
    levels: list[LevelResult] = []
    warnings: list[str] = []
    ended_early: str | None = None
    async with contextlib.AsyncExitStack() as stack:
        session = harness.session
        if session is None:
            session = await stack.enter_async_context(make_session(config))
        run = harness.with_session(session, tokenizer)
        server_config = await read_config_once(harness, session, config)
        config, fit = await fit_config(config, run, server_config)  # before any request
        for i, load in enumerate(config.loads):
            first = levels[0] if levels else None
            level = await run_repeats(
                config,
                load,
                run,
                warmup=config.warmup if i == 0 else 0,
                reference=(first.repeats[0] if first is not None and first.repeats
                           else first),
            )
            level = diagnosed(level, levels, server_config, config.observe.engine,
                              workload=config.workload, max_error_rate=config.max_error_rate)
            served = answered(level) or any(answered(lv) for lv in levels)
            crash = (await harness.check_crash(level) if harness.check_crash is not None
                     else connection_crash(level, served=served))
            if crash is not None:
                level = level.model_copy(update={"crash": crash})
            levels.append(level)
            if harness.on_level is not None:
                harness.on_level(level)
            ending = crash.describe() if crash is not None else ended_by_errors(level, config)
            if level.partial or ending is not None:
                ended_early = ending
                skipped = len(config.loads) - i - 1
                if skipped:
                    warnings.append(f"{skipped} level(s) not run after "
                                    + ("a partial level" if ending is None else level.label))
                break
    spec = config.workload
    return BenchResult(
        trace=(trace_info(spec, tokenizer=tokenizer, fit=fit)
               if isinstance(spec, TraceWorkload) else None),
        version=__version__,
        started_at=started.isoformat(timespec="seconds").replace("+00:00", "Z"),
        finished_at=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        url=config.url,
        model=config.model,
        endpoint=config.endpoint,
        backend="openai" if config.endpoint == "completions" else "openai-chat",
        workload=config.workload,
        seed=config.seed,
        tokenizer=config.tokenizer,
        slo=config.slo,
        warmup=config.warmup,
        num_prompts=config.num_prompts,
        duration_s=config.duration_s,
        levels=tuple(levels),
        partial=any(lv.partial for lv in levels),
        client_cpu_s=time.process_time() - cpu0,
        client_wall_s=perf_counter() - wall0,
        warnings=tuple(warnings),
        max_repeats=config.max_repeats,
        target_ci_pct=config.target_ci_pct,
        max_error_rate=config.max_error_rate,
        limits=config.limits,
        observe=config.observe,
        server_config=server_config,
        ended_early=ended_early,
    )
