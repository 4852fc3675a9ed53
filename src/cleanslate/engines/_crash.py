"""Crash classification: regexes over an engine's log -> a cause and its root-cause line.

Causes (the ``CrashCause`` literal): ``oom``, ``nan``, ``python_exception``, ``cuda_error``,
``nccl_error``, ``port_in_use``, ``killed``, ``hang``, ``model_load`` (the model file is missing
or unreadable, or what the model names is not a model: Hugging Face's ``HFValidationError``,
``RepositoryNotFoundError``, ``LocalEntryNotFoundError``, "does not appear to have a file
named", "no file named ... found in directory", "is not a local folder and is not a valid model
identifier", "Unrecognized processing class in"), ``bad_argument`` (the engine rejected its
command line), ``engine_missing`` (the engine's executable could not be started: the run
supervisor's ``cleanslate: cannot start PROGRAM: [Errno 2] ...`` line, or the interpreter's
``python: No module named ENGINE`` of ``python -m ENGINE``).

A model-loading line outweighs a plain Python exception (``W_MODEL`` > ``W_EXCEPTION``): Hugging
Face raises its errors as exceptions (``huggingface_hub.errors.HFValidationError: Repo id must
be ...``, then ``OSError: ...``), and the H200 study of issue 24 recorded a missing model path as
``python_exception`` four times. A study stops on such a failure instead of recording it as the
configuration's (:mod:`cleanslate.tune._systemic`).

How the root-cause line is chosen: every line is matched against the patterns (the generic ones
below plus the engine's own); each pattern has a *weight*, and the line with the highest weight
wins, the earliest one on a tie. Weights encode specificity: an out-of-memory or NCCL line beats
a plain Python exception, a plain exception beats the wrapper exceptions that engines raise
*about* a failure elsewhere (vLLM's ``EngineDeadError``, ``Worker failed with error ...``), and a
bare "process died" line is used only when nothing says why. For the real vLLM log in
``tests/fixtures/vllm-cpu/crash_enginedead_first_request.log`` this picks the worker's
``RuntimeError: Unsupported CPU attention configuration ...``, not the later ``EngineDeadError``.

Log prefixes (``(Worker pid=1) ERROR 11-30 13:29:02 [file.py:1] ``, ``[2025-01-01 12:00:00 TP0] ``,
``sglang-1  | ``, ``[rank0]:``) are stripped before matching the Python exception pattern, so
only a line whose *message* starts with an exception name counts as one.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from cleanslate.models import Frozen

CrashCause = Literal[
    "oom", "nan", "python_exception", "cuda_error", "nccl_error", "port_in_use", "killed", "hang",
    "model_load", "bad_argument", "engine_missing",
]
CRASH_CAUSES: tuple[CrashCause, ...] = (
    "oom",
    "nan",
    "python_exception",
    "cuda_error",
    "nccl_error",
    "port_in_use",
    "killed",
    "hang",
    "model_load",
    "bad_argument",
    "engine_missing",
)


class Crash(Frozen):
    """A classified failure: the cause and the line of the log that shows it.

    ``line_number`` is 1-based in the text given to :func:`classify_log`; it is ``None`` when the
    cause came from the exit status and not from the log. ``pattern`` names the rule that matched.
    """

    cause: CrashCause
    line: str
    line_number: int | None
    pattern: str
    engine: str | None = None


@dataclass(frozen=True)
class CrashPattern:
    """One rule: ``regex`` searched in a log line (``on_message``: in the line less its prefix).

    A *wrapper* pattern marks a line that reports a failure raised elsewhere (vLLM's
    ``EngineDeadError: ... See stack trace (above) for the root cause``): on such a line, patterns
    of weight up to :data:`W_EXCEPTION` are replaced by the wrapper's own (lower) weight, so the
    exception it wraps, earlier in the log, is chosen as the root cause.
    """

    name: str
    cause: CrashCause
    regex: re.Pattern[str]
    weight: int
    on_message: bool = False
    wrapper: bool = False


def crash_pattern(
    name: str,
    cause: CrashCause,
    regex: str,
    weight: int,
    *,
    on_message: bool = False,
    wrapper: bool = False,
) -> CrashPattern:
    return CrashPattern(name, cause, re.compile(regex), weight, on_message, wrapper)


# Weights: see the module docstring. Higher is more specific.
W_PORT, W_OOM, W_CONFIG, W_NAN, W_MODEL, W_NCCL, W_CUDA, W_HANG = 90, 88, 86, 85, 84, 82, 80, 75
W_MISSING = 95  # the supervisor could not start the engine: nothing else in the log matters
W_EXCEPTION, W_KILLED, W_DIED, W_WRAPPER, W_TRACEBACK = 50, 40, 25, 20, 12

GENERIC_PATTERNS: tuple[CrashPattern, ...] = (
    # Every alternative below is exercised by a real log line in tests/engines/data/*.log,
    # quoted from the engine's public issues (the file names the issue).
    # -- port_in_use
    crash_pattern("errno-98", "port_in_use", r"(?i)\[Errno 98\]|address already in use", W_PORT),
    crash_pattern("llamacpp-bind", "port_in_use", r"couldn't bind HTTP server socket", W_PORT),
    # -- engine_missing (written by the run supervisor, cleanslate/launch/_supervise_script.py)
    crash_pattern("engine-not-started", "engine_missing",
                  r"^cleanslate: cannot start .*\[Errno (?:2|8|13)\]", W_MISSING),
    # the interpreter of ``python -m ENGINE`` without the engine installed (a module that a
    # flag needs, imported by the engine, is a ModuleNotFoundError: python_exception)
    crash_pattern("engine-module-missing", "engine_missing",
                  r"^\S*python[\w.]*: (?:No module named \S+$|Error while finding module "
                  r"specification for '[^']+' \(ModuleNotFoundError: )", W_MISSING),
    # -- model_load: Hugging Face's errors (transformers, huggingface_hub; vLLM and SGLang load
    # through them), real lines in tests/engines/data/model_load_*.log
    crash_pattern("hf-repo-id", "model_load",
                  r"\bHFValidationError\b|Repo id must be in the form '", W_MODEL),
    crash_pattern("hf-not-found", "model_load",
                  r"\b(?:RepositoryNotFoundError|RevisionNotFoundError|EntryNotFoundError"
                  r"|LocalEntryNotFoundError|GatedRepoError)\b", W_MODEL),
    crash_pattern("hf-offline", "model_load",
                  r"We couldn't connect to '?https?://[\w.-]*huggingface\.co", W_MODEL),
    crash_pattern("hf-missing-file", "model_load",
                  r"does not appear to have (?:a file|files) named"
                  r"|\bno file named \S.* found in directory\b", W_MODEL),
    crash_pattern("hf-not-a-model", "model_load",
                  r"is not a local folder and is not a valid model identifier"
                  r"|Unrecognized (?:processing class|model) in \S"
                  r"|Can't load (?:tokenizer|the configuration|config) for '"
                  r"|Invalid repository ID or local directory specified: ", W_MODEL),
    # -- oom
    crash_pattern(
        "cuda-oom",
        "oom",
        r"CUDA out of memory|CUDA error: out of memory|\bOutOfMemoryError\b"
        r"|cudaMalloc failed: out of memory",
        W_OOM,
    ),
    crash_pattern("host-oom", "oom", r"\[Errno 12\] Cannot allocate memory", W_OOM),
    crash_pattern(
        "kv-cache-oom",
        "oom",
        r"No available memory for the cache blocks"
        r"|Not enough memory\. Please try to increase --mem-fraction-static",
        W_OOM,
    ),
    # -- nan
    crash_pattern(
        "probability-nan",
        "nan",
        r"probability tensor contains either `?inf`?, `?nan`? or element < 0",
        W_NAN,
    ),
    # -- nccl_error (before cuda_error: "NCCL error: unhandled cuda error" is an NCCL failure)
    crash_pattern("nccl-error", "nccl_error", r"NCCL error", W_NCCL),
    # -- cuda_error
    crash_pattern(
        "cuda-error",
        "cuda_error",
        r"CUDA error: |device-side assert triggered|an illegal memory access was encountered",
        W_CUDA,
    ),
    # -- hang
    crash_pattern(
        "collective-timeout", "hang", r"Watchdog caught collective operation timeout", W_HANG
    ),
    # -- killed
    crash_pattern("shell-killed", "killed", r"(?:^|\s)Killed$", W_KILLED),
    crash_pattern("exit-minus-9", "killed", r"Exit code: -9\b", W_KILLED),
    # -- python_exception
    crash_pattern(
        "exception",
        "python_exception",
        r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception)|Error|Exception)(?::\s.*|:)?\s*$",
        W_EXCEPTION,
        on_message=True,
    ),
    crash_pattern(
        "traceback", "python_exception", r"Traceback \(most recent call last\):", W_TRACEBACK
    ),
)

# Prefixes that engines, Ray, docker compose and torch put before a log message.
_PREFIX = re.compile(
    r"""^(?:
        \s*[\w.-]+\s+\|\s                      # docker compose: "sglang-1  | "
      | \s*\((?:[^()]*?\bpid=\d+[^()]*)\)\s*  # "(Worker pid=1) ", "(VllmWorker rank=0 pid=2) "
      | \s*\[[^\]]*\]:?\s*                    # "[2025-01-01 12:00:00 TP0] ", "[rank0]:"
      | \s*(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)(?::|\s+\d\d-\d\d\s+[\d:.]+|\s+\d+)\s*
                                  # "ERROR 11-30 13:29:02 ", "ERROR:    ", "ERROR 56542 "
      | \s*\S+\.py:\d+\]\s*                   # "engine.py:157] " (old vLLM)
      | \s*\d{4}-\d\d-\d\d[ T][\d:.,]+\s+(?:\|\s*\w+\s*\|\s*\w+\s*\|\s*)?
                                              # "2023-12-12 19:38:39 | ERROR | stderr | "
    )+""",
    re.VERBOSE,
)


def log_message(line: str) -> str:
    """``line`` without the prefixes engines put before the message (see the module docstring)."""
    return _PREFIX.sub("", line, count=1).strip()


def _best_match(line: str, patterns: Sequence[CrashPattern]) -> CrashPattern | None:
    best: CrashPattern | None = None
    wrapper: CrashPattern | None = None
    message: str | None = None
    for pattern in patterns:
        if not pattern.wrapper and best is not None and pattern.weight <= best.weight:
            continue
        if pattern.wrapper and wrapper is not None:
            continue
        if pattern.on_message:
            if message is None:
                message = log_message(line)
            hit = pattern.regex.search(message)
        else:
            hit = pattern.regex.search(line)
        if not hit:
            continue
        if pattern.wrapper:
            wrapper = pattern
        else:
            best = pattern
    if wrapper is not None and (best is None or best.weight <= W_EXCEPTION):
        return wrapper
    return best


_FRAME = re.compile(r'^File "[^"]*", line \d+')


def classify_lines(
    lines: Iterable[str], patterns: Sequence[CrashPattern] = GENERIC_PATTERNS
) -> tuple[CrashPattern, int, str] | None:
    """The best-matching (pattern, 1-based line number, line) over ``lines``, or ``None``.

    Traceback frames (``File "...", line N``) and the source line printed under each are
    skipped: ``raise RuntimeError(f"NCCL error: {e}")`` is code, not the error.
    """
    ordered = sorted(patterns, key=lambda p: -p.weight)
    best: tuple[CrashPattern, int, str] | None = None
    after_frame = False
    for number, raw in enumerate(lines, start=1):
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        message = log_message(line)
        if _FRAME.match(message):
            after_frame = True
            continue
        if after_frame:
            after_frame = False
            continue
        found = _best_match(line, ordered)
        if found is not None and (best is None or found.weight > best[0].weight):
            best = (found, number, line.strip())
    return best


def classify_text(
    text: str,
    patterns: Sequence[CrashPattern] = GENERIC_PATTERNS,
    *,
    returncode: int | None = None,
    engine: str | None = None,
) -> Crash | None:
    """Classify a log ``text``; fall back on ``returncode`` (a negative one is a signal).

    Returns ``None`` when neither the log nor the exit status shows a failure. A process that
    exited on SIGKILL with nothing in its log is ``killed``; any other signal, or a non-zero exit
    without a recognised line, is not classified here (the caller knows whether it expected one).
    """
    found = classify_lines(text.splitlines(), patterns)
    if found is not None:
        pattern, number, line = found
        return Crash(
            cause=pattern.cause, line=line, line_number=number, pattern=pattern.name, engine=engine
        )
    if returncode is not None and returncode < 0 and -returncode == signal.SIGKILL:
        return Crash(
            cause="killed",
            line=f"process exited on signal {signal.Signals(-returncode).name}",
            line_number=None,
            pattern="returncode",
            engine=engine,
        )
    return None
