"""Documented caps on the sizes a benchmark (or a study's levels) may ask for.

Each cap is far above what a real measurement needs and far below what exhausts the client's
memory or never ends; ``docs/bench.md`` lists them with the memory each one bounds. They are
enforced by the pydantic models (:mod:`cleanslate.bench._models`,
:mod:`cleanslate.bench._workloads`), so the command line, study files and programmatic use get
the same errors.

Memory per input token held by the client, measured: 5.2 bytes of prompt text plus 5.2 bytes of
request body (JSON), built once per prompt before a level starts (about 10.4 bytes per token).
"""

from __future__ import annotations

#: Requests in flight per closed-loop level, or the cap of an open loop. Each slot is a task
#: and, once sending, a connection and a socket (about 10 KiB of client memory each).
MAX_CONCURRENCY = 100_000

#: Levels in one run (concurrencies or rates).
MAX_LEVELS = 256

#: Requests per level (``num_prompts``), warm-up requests, and the requests a duration-mode
#: level sends before it stops sending. A request's record (timestamps of every output token)
#: stays in memory until the level's statistics are computed.
MAX_NUM_PROMPTS = 1_000_000

#: Seconds of sending per level in duration mode (one day).
MAX_DURATION_S = 86_400.0

#: Tokens of one prompt's input or output length, prefix or suffix (1 Mi tokens).
MAX_LEN = 1 << 20

#: Distinct prefixes of the shared-prefix workload.
MAX_PREFIXES = 100_000

#: Input tokens of all the prompts of one level together (256 Mi tokens, about 2.8 GB of
#: client memory at 10.4 bytes per token): ``num_prompts x`` the longest prompt a workload
#: can generate.
MAX_PROMPT_TOKENS = 1 << 28

#: The lowest open-loop rate, requests per second (one request per 1000 s); ``inf`` is allowed.
MIN_RATE = 1e-3

#: Bounds of the gamma arrivals' shape.
MIN_BURSTINESS = 1e-3
MAX_BURSTINESS = 1e3

#: The longest timeout or deadline accepted, in seconds (about 11.6 days).
MAX_TIMEOUT_S = 1e6

#: The longest span of a trace file, first to last request (30 days: Azure's public traces
#: span one hour to one week); a timestamp beyond it is a unit mistake (microseconds written
#: as milliseconds) or a broken row, refused with its line before anything is sent. What a
#: replay level sends is bounded again by :data:`MAX_DURATION_S` after its window, sample and
#: speedups.
MAX_TRACE_SPAN_S = 30 * 86_400.0

#: The largest time scale of a trace replay (a workload's ``speedup=``, a replay level's).
MAX_REPLAY_SPEEDUP = 1e6

#: Per-request deadline when none is given: this floor plus :data:`DEADLINE_PER_TOKEN_S` per
#: output token asked for (a 128-token request may take 728 s from send to its last byte).
DEADLINE_FLOOR_S = 600.0
DEADLINE_PER_TOKEN_S = 1.0

#: Bytes one response may hold: this floor plus :data:`RESPONSE_BYTES_PER_TOKEN` per output
#: token asked for (a streamed event of one token is about 150-250 bytes; a response far
#: beyond that is a server that does not stop).
RESPONSE_BYTES_FLOOR = 1 << 20
RESPONSE_BYTES_PER_TOKEN = 16 << 10


def request_deadline_s(output_len: int, override: float | None = None) -> float:
    """Seconds from a request's send to its last byte: ``override`` when given, else
    :data:`DEADLINE_FLOOR_S` ``+`` :data:`DEADLINE_PER_TOKEN_S` ``x output_len``."""
    if override is not None:
        return override
    return DEADLINE_FLOOR_S + DEADLINE_PER_TOKEN_S * max(0, output_len)


def response_byte_cap(output_len: int) -> int:
    """The most bytes read from one response before it is failed as ``response_too_large``."""
    return RESPONSE_BYTES_FLOOR + RESPONSE_BYTES_PER_TOKEN * max(0, output_len)

#: Measurements of one level (``--repeats``).
MAX_REPEATS = 1_000
