"""When a bench stops before its last level, and why, in the user's words.

Two things end a bench early (:func:`~cleanslate.bench.run_benchmark`):

* **the server died** during a level: the level carries a :class:`LevelCrash`. Who watches the
  server decides its cause: the caller's :data:`CrashCheck` (``bench --run`` reads the run's
  exit status and classifies its log with the engine's crash patterns, as a study does), else
  :func:`connection_crash`, which knows only what the client's connections showed;
* **every request of a level failed for one cause** (HTTP 422 on ``ignore_eos``, a wrong
  model name, nothing listening): the next level would fail the same way, so none is run and
  the result says the cause and the fix as options to give (:func:`one_cause`,
  :func:`fix_for`), never a class or a field of this package.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from cleanslate.bench._client import CONNECTION_ERRORS

if TYPE_CHECKING:
    from cleanslate.bench._models import BenchConfig, LevelCrash, LevelResult

#: Says after each level whether the server died during it (``None``: it did not, or cannot
#: tell). It must not raise; it may wait a few seconds for an exit status to be recorded.
CrashCheck = Callable[["LevelResult"], Awaitable["LevelCrash | None"]]

#: Error classes that mean the server was not there to answer (``aborted``: a request cut off
#: when its level ended early because the server stopped accepting connections).
GONE_ERRORS = CONNECTION_ERRORS | {"aborted"}

#: Characters of an error's detail quoted in an ending's text.
DETAIL_QUOTE = 160


def errors_text(level: LevelResult) -> str:
    """``258 failed requests (aborted: 255, connection_refused: 2)``."""
    kinds = ", ".join(f"{k}: {v}" for k, v in sorted(level.errors.items(),
                                                       key=lambda kv: (-kv[1], kv[0])))
    return f"{level.failed} failed request{'s' if level.failed != 1 else ''} ({kinds})"


#: Error classes of a request that never reached a server (nothing accepted its connection).
UNREACHED_ERRORS = frozenset({"connection_refused", "connection_error", "aborted"})


def answered(level: LevelResult) -> bool:
    """Whether a server took any request of the level: one completed, or one failed after its
    connection was accepted (reset mid-stream, an HTTP error, a timeout waiting for bytes)."""
    return bool(level.completed) or any(n and k not in UNREACHED_ERRORS
                                        for k, n in level.errors.items())


def connection_crash(level: LevelResult, *, served: bool) -> LevelCrash | None:
    """The crash the client's connections show: the level ended early because the server
    stopped accepting connections (not on a stop request), or every request it sent failed
    with a connection error. ``served``: the server took a request of this run before or in
    this level (:func:`answered`); a server that never did had not crashed, it was never
    reached (an ending of :func:`one_cause`). The cause is the commonest connection error other than
    ``aborted`` (the client's own cut), else ``aborted``."""
    from cleanslate.bench._models import LevelCrash

    if not served or level.partial_reason == "interrupted":
        return None
    gone = {k: v for k, v in level.errors.items() if k in GONE_ERRORS}
    all_gone = level.completed == 0 and level.failed > 0 and sum(gone.values()) == level.failed
    if not (level.partial or all_gone) or not gone:
        return None
    told = {k: v for k, v in gone.items() if k != "aborted"} or gone
    cause = max(sorted(told), key=lambda k: told[k])
    line = errors_text(level)
    if level.partial_reason:
        line = f"{level.partial_reason}; {line}"
    detail = level.error_details.get(cause)
    if detail:
        line += f"; first {cause}: {detail[:DETAIL_QUOTE]}"
    return LevelCrash(label=level.label, cause=cause, line=line, source="connections")


def one_cause(level: LevelResult) -> tuple[str, str] | None:
    """``(error class, its first detail)`` when no request of the level completed and every
    failure is of one class (``aborted`` requests of a level ended early not counted: they are
    the client's cut, not the server's answer), else ``None``."""
    if level.completed or not level.failed:
        return None
    kinds = {k: v for k, v in level.errors.items() if v}
    if level.partial and len(kinds) > 1:
        kinds.pop("aborted", None)
    if len(kinds) != 1:
        return None
    kind = next(iter(kinds))
    return kind, level.error_details.get(kind, "")


def fix_for(kind: str, detail: str, config: BenchConfig) -> str:
    """What to change when every request failed with ``kind`` (``detail``: the server's first
    error body or the exception), as options to give on the command line."""
    text = detail.lower()
    if kind in ("http_422", "http_400") and config.ignore_eos and (
            "ignore_eos" in text or "min_tokens" in text):
        return ("the server does not accept ignore_eos/min_tokens: run again with "
                "--no-ignore-eos (output lengths are then up to the model)")
    if kind == "http_400" and any(w in text for w in ("context", "too long", "maximum",
                                                       "max_tokens", "max_model_len")):
        return ("the prompts or answers are longer than the server takes: lower input_len "
                "or output_len in --workload")
    if kind == "http_404":
        return (f"the server does not serve model {config.model!r} on this path: check "
                f"--model (GET {config.url.rstrip('/')}/v1/models lists its names) and "
                f"--endpoint ({config.endpoint})")
    if kind in ("http_401", "http_403"):
        return "the server wants a key: give it with --api-key (or OPENAI_API_KEY)"
    if kind in CONNECTION_ERRORS:
        return (f"nothing accepts connections at {config.url}: check --url, or that the server "
                "is running (`cleanslate serve ... --detach`, then `bench --run ID`)")
    if kind in ("timeout", "deadline"):
        return ("no request ended in time: raise --read-timeout or --request-timeout, or "
                "lower the load")
    if kind.startswith("http_5") or kind == "server_error":
        return "the server failed every request: its log says why"
    return "see the first error above"


def ended_by_errors(level: LevelResult, config: BenchConfig) -> str | None:
    """The ending of a level whose requests all failed for one cause: ``every one of 50
    requests at c=1 failed with http_422 ({...ignore_eos...}): the server does not accept
    ...: run again with --no-ignore-eos ...``; ``None`` for any other level."""
    found = one_cause(level)
    if found is None:
        return None
    kind, detail = found
    quoted = f" ({detail[:DETAIL_QUOTE]})" if detail else ""
    count = level.errors.get(kind, level.failed)
    return (f"every one of {count} requests at {level.label} failed with {kind}{quoted}: "
            f"{fix_for(kind, detail, config)}")


__all__ = ["GONE_ERRORS", "UNREACHED_ERRORS", "CrashCheck", "answered", "connection_crash",
           "ended_by_errors", "errors_text", "fix_for", "one_cause"]
