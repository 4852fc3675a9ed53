"""The server's context, found before a trace is sent, so that no row is sent that the server
must refuse (``docs/bench.md``, "Traces": "Fitting the server's context").

A request whose prompt plus output exceeds the context a server serves is answered HTTP 400
(vLLM, SGLang, the sim) or cut (llama.cpp's slot); a trace of long prompts replayed against a
short context failed 31 of 47 requests so. :func:`fit_trace` finds the context, in this order,
and fits the trace's rows to it (:func:`cleanslate.bench._trace.fit_rows`):

1. ``context=`` of the trace workload (the user's word);
2. the caller's :attr:`~cleanslate.bench._observe.Harness.context` (a run record that knows
   what the server was launched with);
3. the configuration in effect read before the first level (:class:`ServerConfig`):
   ``max_model_len`` (vLLM's ``GET /v1/models``), ``context_length`` (SGLang's and the sim's
   ``GET /server_info``), ``n_ctx_slot`` (llama.cpp's ``GET /props``: one slot's context);
4. the server's answers read now, over the run's pool: ``GET /v1/models`` ``max_model_len``
   (vLLM, SGLang, the sim, the fake server with ``--max-model-len``), else ``GET /props``
   ``default_generation_settings.n_ctx`` (llama.cpp, whose ``/v1/models`` gives only the
   model's training context);
5. the tokenizer's ``model_max_length`` (when it is a real bound, not the library's
   "unbounded" sentinel).

Unknown: nothing is fitted, and that is said once. What a server answers is someone else's
text: read within :data:`~cleanslate.bench._server_config.MAX_BODY_BYTES`, over connections
of their own (never pooled, as the configuration reading), never followed, never raising.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cleanslate.bench._server_config import (
    TIMEOUT_S,
    ServerConfig,
    _unpooled,
    fetch_body,
    parse_json_object,
    parse_models,
)
from cleanslate.bench._trace import (
    TraceFit,
    TraceWorkload,
    fit_rows,
    nothing_fits,
    read_trace,
    select,
)

if TYPE_CHECKING:
    import aiohttp

    from cleanslate.bench._models import BenchConfig
    from cleanslate.bench._observe import Harness
    from cleanslate.bench._tokens import Tokenizer

#: A tokenizer's ``model_max_length`` above this is the library's "no bound" sentinel
#: (transformers writes 1e30), not a context.
MAX_TOKENIZER_CONTEXT = 10_000_000
#: Settings of a :class:`ServerConfig` that are a request's context, in the order read.
CONFIG_KEYS = ("max_model_len", "context_length", "n_ctx_slot")


@dataclass(frozen=True, slots=True)
class KnownContext:
    """A context known before the server is asked: ``tokens`` (prompt plus output) and
    ``source`` (words for people: ``run 3f2a's record``)."""

    tokens: int
    source: str


def from_config(config: ServerConfig | None) -> KnownContext | None:
    """The context in ``config``'s settings in effect (:data:`CONFIG_KEYS`), or ``None``."""
    if config is None:
        return None
    for key in CONFIG_KEYS:
        value = config.in_effect.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            where = config.sources.get(key, "the server's configuration")
            return KnownContext(value, where if where.endswith(key) else f"{where} {key}")
    return None


def from_tokenizer(tok: Tokenizer | None) -> KnownContext | None:
    """The tokenizer's ``model_max_length`` when it is a bound (see
    :data:`MAX_TOKENIZER_CONTEXT`), or ``None``."""
    value = getattr(tok, "model_max_length", None)
    if isinstance(value, int) and not isinstance(value, bool) and 1 < value <= \
            MAX_TOKENIZER_CONTEXT:
        return KnownContext(value, "the tokenizer's model_max_length")
    return None


def _props_context(doc: dict[str, Any]) -> int | None:
    settings = doc.get("default_generation_settings")
    value = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 1:
        return value
    return None


async def read_context(session: aiohttp.ClientSession | None, base_url: str,
                       *, timeout_s: float = 2 * TIMEOUT_S) -> KnownContext | None:
    """The context the server at ``base_url`` answers: ``GET /v1/models`` ``max_model_len``,
    else ``GET /props`` ``default_generation_settings.n_ctx``; ``None`` when neither says
    it. Over connections of its own to where ``session`` connects (the SSH forward of a
    remote run included), never pooled; never raises except on cancellation."""
    import aiohttp

    from cleanslate.hosts.forward import same_connector

    base = base_url.rstrip("/")
    if session is None or not _unpooled(session):
        connector = same_connector(session.connector if session else None, force_close=True)
        async with aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as own:
            return await read_context(own, base_url, timeout_s=timeout_s)
    try:
        async with asyncio.timeout(timeout_s):
            text, _why = await fetch_body(session, base + "/v1/models")
            doc, _why = parse_json_object(text) if text is not None else (None, None)
            if doc is not None:
                got = parse_models(doc)
                value = got.values.get("max_model_len")
                if isinstance(value, int):
                    return KnownContext(value, "GET /v1/models max_model_len")
            text, _why = await fetch_body(session, base + "/props")
            doc, _why = parse_json_object(text) if text is not None else (None, None)
            n_ctx = _props_context(doc) if doc is not None else None
            if n_ctx is not None:
                return KnownContext(n_ctx, "GET /props default_generation_settings.n_ctx")
    except TimeoutError:
        return None
    return None


async def find_context(spec: TraceWorkload, *, known: KnownContext | None,
                       server_config: ServerConfig | None,
                       session: aiohttp.ClientSession | None, base_url: str,
                       tokenizer: Tokenizer | None) -> KnownContext | None:
    """The context ``spec``'s rows are fitted to, in the module docstring's order."""
    if spec.context is not None:
        return KnownContext(spec.context, "context= of the trace workload")
    if known is not None:
        return known
    found = from_config(server_config)
    if found is None:
        found = await read_context(session, base_url)
    return found or from_tokenizer(tokenizer)


def _unknown_source(spec: TraceWorkload, tokenizer: Tokenizer | None) -> str:
    told = "no context= option, GET /v1/models has no max_model_len, GET /props no n_ctx"
    return told + ("" if tokenizer is not None else ", no --tokenizer")


async def fit_trace(spec: TraceWorkload, *, known: KnownContext | None,
                    server_config: ServerConfig | None,
                    session: aiohttp.ClientSession | None, base_url: str,
                    tokenizer: Tokenizer | None,
                    say: Callable[[str], None] | None = None
                    ) -> tuple[TraceWorkload, TraceFit]:
    """``spec`` with its context set (as found by :func:`find_context`) and what fitting its
    selected rows to it does, said through ``say`` before anything is sent. An
    :class:`~cleanslate.errors.InputError` when no row fits (exit 2, before any request)."""
    found = await find_context(spec, known=known, server_config=server_config,
                               session=session, base_url=base_url, tokenizer=tokenizer)
    rows = select(spec, read_trace(spec))
    if found is None:
        fit = TraceFit(mode=spec.fit, context=None, rows=len(rows),
                       source=_unknown_source(spec, tokenizer))
        if say is not None:
            say(fit.line())
        return spec, fit
    fitted_spec = spec.model_copy(update={"context": found.tokens})
    fitted = fit_rows(fitted_spec, rows, tokenizer)
    fit = TraceFit(mode=spec.fit, context=found.tokens, source=found.source, rows=len(rows),
                   dropped=fitted.dropped, clipped=fitted.clipped, over=fitted.over)
    if rows and not fitted.rows:
        raise nothing_fits(fitted_spec, len(rows))
    if say is not None:
        say(fit.line())
    return fitted_spec, fit


async def fit_config(config: BenchConfig, harness: Harness,
                     server_config: ServerConfig | None
                     ) -> tuple[BenchConfig, TraceFit | None]:
    """``config`` with its trace workload fitted to the server's context (:func:`fit_trace`,
    with the harness's pool, tokenizer, :attr:`~Harness.context` and :attr:`~Harness.on_note`),
    and the fit; ``config`` itself and ``None`` for any other workload."""
    spec = config.workload
    if not isinstance(spec, TraceWorkload):
        return config, None
    fitted, fit = await fit_trace(spec, known=harness.context, server_config=server_config,
                                  session=harness.session, base_url=config.url,
                                  tokenizer=harness.tokenizer, say=harness.on_note)
    return config.model_copy(update={"workload": fitted}), fit


__all__ = [
    "CONFIG_KEYS",
    "MAX_TOKENIZER_CONTEXT",
    "KnownContext",
    "find_context",
    "fit_config",
    "fit_trace",
    "from_config",
    "from_tokenizer",
    "read_context",
]
