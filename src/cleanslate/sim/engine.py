"""The simulated scheduler: an SGLang-like continuous-batching loop in real time.

One asyncio task runs the loop; each iteration is one *step* whose duration comes from
:class:`~cleanslate.sim.model.SimModel`, waited with one timer for the whole batch:

1. **Prefill** (priority, as SGLang's default): while requests wait, fewer than
   ``max-running-requests`` run, and the KV cache has room for a waiting request's prompt plus
   a guess of its output, admit it; up to ``chunked-prefill-size`` prompt tokens go into one
   prefill step (a longer prompt is split over several steps). A request whose prompt is done
   gets its first token at the end of the step.
2. Otherwise **decode**: every running request gets one token (one more token of KV cache) at
   the end of the step. A request that reached its length finishes and frees its KV cache.

Admission is optimistic, as SGLang's: the guess of what a request will still write is
``new_token_ratio`` x its remaining ``max_tokens``, for the waiting request and for every
running one; the ratio starts at 0.7 and decays to 0.098 over 600 decode steps. When a decode
step finds fewer free KV tokens than running requests, the scheduler **retracts** requests
(those with the fewest generated tokens first, never the last one) until the rest have room
for 20 more steps: their KV cache is freed, they go back to the head of the queue and, once
admitted again, prefill their prompt and the tokens they had generated again (their stream
pauses; nothing already sent is lost); the ratio is raised to what the batch really needs
(see ``docs/sim-model.md``). Requests that do not fit wait in a FIFO queue (TTFT grows with the
queue).

**Prefix cache** (SGLang's radix cache, on by default; ``--disable-radix-cache`` turns it off):
a prompt whose leading words were seen before skips their prefill. :class:`PrefixCache` keeps
chained hashes of 16-word blocks of recent prompts (least recently used out first, as many
blocks as the KV cache holds tokens); a request's ``cached`` tokens are its longest run of
known leading blocks (at least one token is always prefilled), and the server reports them as
``usage.prompt_tokens_details.cached_tokens``. A benchmark that sends the same prompts at every
level would measure this cache, not the server.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from cleanslate.sim.faults import Faults
from cleanslate.sim.model import (
    CLIP_MAX_NEW_TOKENS,
    INIT_NEW_TOKEN_RATIO,
    MAX_SM_CLOCK_MHZ,
    MIN_NEW_TOKEN_RATIO,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    RETRACT_DECODE_STEPS,
    SimModel,
)
from cleanslate.sim.text import natural_length, next_state, token_of

#: The share of the SMs a prefill step keeps busy (compute-bound)...
PREFILL_SM_ACTIVE = 0.9
#: ... and a decode step's: a small batch reads the weights with few SMs busy; the share grows
#: with the batch until this many sequences saturate it.
SATURATING_BATCH = 256


def decode_sm_active(batch: int) -> float:
    """The share of SMs a decode step of ``batch`` sequences keeps busy (0.3 to 0.9)."""
    return 0.3 + 0.6 * min(1.0, batch / SATURATING_BATCH)

NAN_TOKEN_ID = -1
#: The token of a degenerate request (``degenerate-after``): ``!``.
DEGENERATE_TOKEN_ID = -2

#: Words per block of the prefix cache (SGLang's radix cache matches at page granularity).
PREFIX_BLOCK_WORDS = 16


class PrefixCache:
    """Chained hashes of the 16-word blocks of recent prompts (see the module docstring)."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_blocks = max(1, capacity_tokens // PREFIX_BLOCK_WORDS)
        self._blocks: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.hits = 0
        self.hit_tokens = 0

    def lookup_and_insert(self, text: str, prompt_tokens: int) -> int:
        """Tokens of ``text``'s prompt already cached (a multiple of the block size, below
        ``prompt_tokens``); the prompt's blocks are then cached (most recent)."""
        words = text.split()
        chain = 0
        matched = 0
        hashes: list[int] = []
        for start in range(0, len(words) - len(words) % PREFIX_BLOCK_WORDS, PREFIX_BLOCK_WORDS):
            chain = hash((chain, *words[start:start + PREFIX_BLOCK_WORDS]))
            hashes.append(chain)
        for h in hashes:
            if h not in self._blocks:
                break
            matched += 1
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
        cached = min(matched * PREFIX_BLOCK_WORDS, max(0, prompt_tokens - 1))
        if cached:
            self.hits += 1
            self.hit_tokens += cached
        return cached


class SimRequest:
    """One request inside the scheduler. Token ids are vocabulary indices; ``-1`` is NaN, ``-2``
    the ``!`` of a degenerate request."""

    __slots__ = (
        "cached",
        "degenerate",
        "finish_reason",
        "finished",
        "generated",
        "held",
        "interval",
        "kv_tokens",
        "max_new",
        "pending",
        "prefilled",
        "prompt_tokens",
        "rid",
        "state",
        "stop_at",
        "waiter",
    )

    def __init__(
        self,
        rid: str,
        prompt_tokens: int,
        max_new: int,
        min_new: int,
        ignore_eos: bool,
        state: int,
        interval: int = 1,
    ) -> None:
        self.rid = rid
        self.prompt_tokens = prompt_tokens
        self.max_new = max_new
        natural = natural_length(state)
        if ignore_eos or natural >= max_new:
            self.stop_at = max_new
            self.finish_reason = "length"
        else:
            self.stop_at = max(natural, min(min_new, max_new))
            self.finish_reason = "length" if self.stop_at >= max_new else "stop"
        self.state = state
        self.kv_tokens = prompt_tokens + self.stop_at  # what it needs at most, at the end
        self.held = 0  # KV tokens it holds now (prompt and generated tokens once admitted)
        self.prefilled = 0
        self.cached = 0
        self.generated = 0
        self.pending: list[int] = []
        self.waiter: asyncio.Future[None] | None = None
        self.finished = False
        self.interval = max(1, interval)
        self.degenerate = False

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next_tokens(self) -> tuple[list[int], bool]:
        """Wait for new tokens; returns them and whether the request is finished."""
        while not self.pending and not self.finished:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        toks, self.pending = self.pending, []
        return toks, self.finished


class Engine:
    """The scheduler loop. ``on_crash(batch_size)`` is called once when the server must die;
    ``on_exit()`` once when it must shut down by itself with status 0 (``exit-after``)."""

    def __init__(
        self,
        model: SimModel,
        faults: Faults,
        on_crash: Callable[[int], None],
        log: Callable[[str], None] | None = None,
        log_interval_steps: int = 40,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        self.log = log
        self.log_interval_steps = log_interval_steps
        self._decode_steps = 0
        self._log_tokens = 0
        self._log_t0 = 0.0
        self.faults = faults
        self.on_crash = on_crash
        self.on_exit = on_exit
        self.exiting = False
        plan = model.memory_plan()
        self.kv_capacity = plan.kv_capacity_tokens
        self.kv_free = plan.kv_capacity_tokens
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self._ratio_decay = ((INIT_NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO)
                             / NEW_TOKEN_RATIO_DECAY_STEPS)
        self.retracted = 0  # retractions since start (a request retracted twice counts twice)
        self.retracted_input_tokens = 0  # their prompt tokens, summed over retractions
        self.retracted_output_tokens = 0  # the tokens they had generated, summed likewise
        # What a /metrics scrape reads (docs/sim-model.md, "Metrics"): the requests admitted
        # into the prefill step now running (neither waiting nor running until it ends), the
        # generation rate and retractions over the last decode-log window, and the prefix
        # cache's hit rate over the last prefill step, as SGLang's scheduler reports them.
        self.prefilling: list[SimRequest] = []
        self.gen_throughput = 0.0
        self.window_retracted = 0
        self._retracted_at_window = 0
        self.cache_hit_rate = 0.0
        self.max_running = max(1, model.s.max_running_requests)
        self.chunk = model.chunk_tokens()
        self.prefix_cache: PrefixCache | None = (
            None if model.s.disable_radix_cache else PrefixCache(plan.kv_capacity_tokens))
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.partial: SimRequest | None = None
        self.inflight = 0
        self.admitted = 0
        self.completed = 0
        self.hung = False
        self.crashed = False
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # What the simulated GPUs' telemetry is made of (cleanslate.sim.telemetry): seconds
        # spent in steps, those weighted by how much of the GPU a step keeps busy, the step in
        # progress, and the tokens prefilled and generated.
        self.busy_s = 0.0
        self.active_s = 0.0
        self._step: tuple[float, float, float] | None = None  # (start, seconds, weight)
        self.prefill_tokens = 0
        self.decode_tokens = 0
        #: a throttled clock (``throttle-clock``) makes every step this much longer
        self.slowdown = (MAX_SM_CLOCK_MHZ / faults.throttle_clock
                         if faults.throttle_clock else 1.0)

    # --- requests ----------------------------------------------------------------------------
    def submit(self, req: SimRequest, probe: bool = False) -> None:
        """Queue a request. A ``probe`` (``/health_generate``) does not count for the faults."""
        self.inflight += 1
        if probe:
            self.waiting.append(req)
            self._wake.set()
            return
        self.admitted += 1
        if self.faults.hang_after is not None and self.admitted > self.faults.hang_after:
            self.hung = True
        limit = self.faults.crash_at_concurrency
        if limit is not None and self.inflight > limit:
            self._crash(self.inflight)
        degenerate = self.faults.degenerate_after
        req.degenerate = degenerate is not None and self.admitted > degenerate
        exit_after = self.faults.exit_after
        if exit_after is not None and self.admitted > exit_after and not self.exiting:
            self.exiting = True
            if self.on_exit is not None:
                self.on_exit()
        self.waiting.append(req)
        self._wake.set()

    def finish(self, req: SimRequest) -> None:
        """Called by the HTTP layer when a request ends (completed, aborted or disconnected)."""
        self.inflight -= 1
        if not req.finished:
            # Aborted: drop it wherever it is and give its KV cache back.
            req.finished = True
            req.finish_reason = "abort"
            if req in self.waiting:
                self.waiting.remove(req)
            elif req is self.partial:
                self.partial = None
            elif req in self.running:
                self.running.remove(req)
            self._release(req)

    def _crash(self, batch: int) -> None:
        if not self.crashed:
            self.crashed = True
            self.on_crash(batch)

    def fits_ever(self, prompt_tokens: int, output_tokens: int) -> bool:
        return prompt_tokens + output_tokens <= self.kv_capacity

    def _release(self, req: SimRequest) -> None:
        self.kv_free += req.held
        req.held = 0

    def _future(self, req: SimRequest) -> float:
        """The KV tokens a request is guessed to still need: ratio x its remaining max_tokens
        (at most 4096 of them, as SGLang clips the estimate)."""
        return min(CLIP_MAX_NEW_TOKENS, max(0, req.max_new - req.generated)) * self.new_token_ratio

    def _retract(self) -> None:
        """Free KV cache for the next decode steps by sending requests back to the queue."""
        order = sorted(self.running, key=lambda r: (r.generated, -r.prompt_tokens), reverse=True)
        retracted: list[SimRequest] = []
        first = True
        while len(order) > 1 and (
            first or self.kv_free < len(order) * RETRACT_DECODE_STEPS
        ):
            first = False
            req = order.pop()
            self._release(req)
            req.prefilled = 0
            retracted.append(req)
        if not retracted:
            return
        self.running = [r for r in self.running if r not in retracted]
        # Back to the head of the queue: they arrived before anyone who waits.
        self.waiting.extendleft(reversed(retracted))
        self.retracted += len(retracted)
        self.retracted_input_tokens += sum(r.prompt_tokens for r in retracted)
        self.retracted_output_tokens += sum(r.generated for r in retracted)
        decoded = sum(r.generated for r in order)
        max_new = sum(r.max_new for r in order) or 1
        old = self.new_token_ratio
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(order)) / max_new)
        if self.log is not None:
            self.log(f"KV cache pool is full. Retract requests. #retracted_reqs: "
                     f"{len(retracted)}, #new_token_ratio: {old:.4f} -> "
                     f"{self.new_token_ratio:.4f}")

    # --- loop --------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        model = self.model
        last_end = loop.time()
        nan_above = self.faults.nan  # NaN while more than this many requests are in flight
        while True:
            nan = nan_above is not None and self.inflight > nan_above
            if self.hung or self.crashed:
                await asyncio.Event().wait()  # forever: a hang (or a dying server)
            if not self.waiting and not self.running and self.partial is None:
                self._wake.clear()
                await self._wake.wait()
                last_end = loop.time()
                continue
            now = loop.time()
            start = last_end if now - last_end < 0.005 else now

            prefill_tokens, done_prompts = self._build_prefill()
            if prefill_tokens:
                step = self.slowdown * model.noisy_seconds(model.prefill_step_ms(prefill_tokens),
                                                           prefill=True)
                last_end = start + step
                self.prefilling = done_prompts
                self._step = (start, step, PREFILL_SM_ACTIVE)
                try:
                    await asyncio.sleep(max(0.0, last_end - loop.time()))
                finally:
                    self.prefilling = []
                    self._end_step()
                self.prefill_tokens += prefill_tokens
                if self.hung or self.crashed:
                    continue
                for req in done_prompts:
                    if req.finished:  # aborted during the step: give its KV cache back
                        self._release(req)
                        continue
                    self.running.append(req)
                    self._emit(req, nan)
                self._reap()
                continue

            if self.kv_free < len(self.running):
                self._retract()
            batch = len(self.running)
            if model.crashes_at_batch(batch):
                self._crash(batch)
                continue
            context = 0
            for req in self.running:
                context += req.prompt_tokens + req.generated
                req.held += 1  # this step's token
            self.kv_free -= batch
            self.new_token_ratio = max(MIN_NEW_TOKEN_RATIO,
                                       self.new_token_ratio - self._ratio_decay)
            step = self.slowdown * model.noisy_seconds(model.decode_step_ms(batch, context))
            last_end = start + step
            self._step = (start, step, decode_sm_active(batch))
            try:
                await asyncio.sleep(max(0.0, last_end - loop.time()))
            finally:
                self._end_step()
            self.decode_tokens += batch
            if self.hung or self.crashed:
                continue
            for req in self.running:
                self._emit(req, nan)
            self._decode_steps += 1
            self._log_tokens += batch
            if self._decode_steps % self.log_interval_steps == 0:
                self._log_decode(loop.time(), batch, context)
            self._reap()

    def _end_step(self) -> None:
        if self._step is not None:
            _, seconds, weight = self._step
            self.busy_s += seconds
            self.active_s += seconds * weight
            self._step = None

    def busy_at(self, now: float) -> tuple[float, float]:
        """Seconds spent in steps since the start, and those weighted by the share of the
        GPU's SMs a step keeps busy, up to ``now`` (loop time; the step in progress counted
        up to ``now``)."""
        busy, active = self.busy_s, self.active_s
        if self._step is not None:
            start, seconds, weight = self._step
            part = min(seconds, max(0.0, now - start))
            busy += part
            active += part * weight
        return busy, active

    def _log_decode(self, now: float, batch: int, context: int) -> None:
        """Close a decode-log window: its generation rate (tokens/s, the ``gen_throughput``
        gauge) and retractions, and the log line when the engine logs."""
        elapsed = now - self._log_t0 if self._log_t0 else 0.0
        rate = self._log_tokens / elapsed if elapsed > 0 else 0.0
        self.gen_throughput = rate
        self.window_retracted = self.retracted - self._retracted_at_window
        self._retracted_at_window = self.retracted
        self._log_t0 = now
        self._log_tokens = 0
        if self.log is None:
            return
        usage = (self.kv_capacity - self.kv_free) / self.kv_capacity if self.kv_capacity else 0.0
        self.log(
            f"Decode batch. #running-req: {batch}, #token: {context}, token usage: {usage:.2f}, "
            f"gen throughput (token/s): {rate:.2f}, #queue-req: {len(self.waiting)}"
        )

    def num_running(self) -> int:
        """Requests holding a batch slot now: the running batch, those admitted into the
        prefill step in progress, and a prompt being prefilled in chunks (at most
        ``max-running-requests``; the admission test counts the same three)."""
        return len(self.running) + len(self.prefilling) + (self.partial is not None)

    def num_used_tokens(self) -> int:
        """KV cache tokens held now (prompts admitted, tokens generated)."""
        return self.kv_capacity - self.kv_free

    def _emit(self, req: SimRequest, nan: bool) -> None:
        req.state = state = next_state(req.state)
        req.pending.append(NAN_TOKEN_ID if nan else DEGENERATE_TOKEN_ID if req.degenerate
                           else token_of(state))
        req.generated += 1
        if req.generated >= req.stop_at:
            req.finished = True
            req._wake()
        elif len(req.pending) >= req.interval:
            req._wake()

    def _reap(self) -> None:
        if any(r.finished for r in self.running):
            keep = []
            for req in self.running:
                if req.finished:
                    self._release(req)
                    self.completed += 1
                else:
                    keep.append(req)
            self.running = keep

    def _build_prefill(self) -> tuple[int, list[SimRequest]]:
        """Pick the next prefill step: (prompt tokens in it, requests whose prompt completes).
        A request's prompt here is its prompt plus what it had generated before a retraction."""
        budget = self.chunk
        tokens = 0
        done: list[SimRequest] = []
        req = self.partial
        if req is not None:
            take = min(budget, req.prompt_tokens + req.generated - req.prefilled)
            req.prefilled += take
            tokens += take
            budget -= take
            if req.prefilled >= req.prompt_tokens + req.generated:
                self.partial = None
                done.append(req)
            else:
                return tokens, done
        future = sum(self._future(r) for r in self.running)
        future += sum(self._future(r) for r in done)
        hit = fed = 0
        while self.waiting and budget > 0:
            if len(self.running) + len(done) + (self.partial is not None) >= self.max_running:
                break
            req = self.waiting[0]
            fill = req.prompt_tokens + req.generated
            alone = not self.running and not done and self.partial is None
            if fill > self.kv_free or (
                not alone and fill + self._future(req) > self.kv_free - future
            ):
                break
            self.waiting.popleft()
            self.kv_free -= fill
            req.held = fill
            future += self._future(req)
            # A cached prefix is not computed again: only the rest of the prompt is prefilled.
            take = min(budget, fill - req.cached)
            hit += req.cached
            fed += fill
            req.prefilled = req.cached + take
            tokens += take
            budget -= take
            if req.prefilled >= fill:
                done.append(req)
            else:
                self.partial = req
                break
        if fed:
            # As SGLang's gauge: the share of the prompt tokens admitted in this step that the
            # prefix cache held.
            self.cache_hit_rate = hit / fed
        return tokens, done
