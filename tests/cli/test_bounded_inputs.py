"""Every input bounded before use (issue 35): bad files and values exit 2 within 5 s, with a
message that names the file or option and never quotes the file's content, no traceback.

Each case is a real file (a FIFO, a link to one or to ``/dev/zero``, a folder, a 10 M-line
trace, a row at 1e15 ms, a 129 KiB CSV field...) given to ``bench`` or ``tune --check`` run in
this process (:func:`tests.cli.inproc.run_main`) under a 5 s ``SIGALRM``: a hang fails the
test instead of holding the suite. The files that hold text hold :data:`CANARY`, which no
message may repeat (a trace error once quoted the file's first line: a line of
``/etc/shadow``)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import pytest

from tests.cli.inproc import Exit, run_main

#: A secret-looking string the bad files hold; no error message may contain it.
CANARY = "root:$6$CANARY7f3e$hash:19000:0:99999:7:::"
#: Wall-clock limit of one bad input, seconds.
LIMIT_S = 5.0

BENCH = ("bench", "--url", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "1")
STUDY = ("name: s\nengine: sim\nmodel: sim\nspace: {fault: [null]}\nstrategy: grid\n"
         "concurrency: [1]\nrequests_per_level: 1\n")


class _TimedOut(Exception):
    pass


def _alarm(_sig: int, _frame: FrameType | None) -> None:
    raise _TimedOut


def _run(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
         *args: str) -> tuple[Exit, float]:
    """``cleanslate ARGS`` in this process, ended by SIGALRM after :data:`LIMIT_S`."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    start = time.monotonic()
    try:
        res = run_main(capsys, monkeypatch, *args)
    except _TimedOut:
        pytest.fail(f"hung for {LIMIT_S:g} s: {args}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return res, time.monotonic() - start


def _fifo(tmp: Path, name: str = "fifo") -> Path:
    path = tmp / name
    os.mkfifo(path)
    return path


def _link(tmp: Path, target: Path | str, name: str = "link") -> Path:
    path = tmp / name
    path.symlink_to(target)
    return path


def _write(tmp: Path, name: str, text: str | bytes) -> Path:
    path = tmp / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def _rows(*stamps_ms: float) -> str:
    return "".join(f'{{"timestamp": {t}, "input_length": 8, "output_length": 4}}\n'
                   for t in stamps_ms)


# --- the table: (id, build(tmp) -> argv, what the message must say) --------------------------
Build = Callable[[Path], tuple[str, ...]]


def _bench(*extra: str) -> tuple[str, ...]:
    return (*BENCH, *extra)


def _trace(path: Path, fmt: str = "jsonl") -> tuple[str, ...]:
    return _bench("--workload", f"trace:path={path},format={fmt}")


def _tune(tmp: Path, extra: str) -> tuple[str, ...]:
    study = _write(tmp, "study.yaml", STUDY + extra)
    return ("tune", str(study), "--check")


def _tune_replay(tmp: Path, rows: str) -> tuple[str, ...]:
    trace = _write(tmp, "trace.jsonl", rows)
    study = STUDY.replace("concurrency: [1]\n", "") + (
        f"replay: [1]\nworkload: {{kind: trace, path: {trace}}}\n")
    return ("tune", str(_write(tmp, "study.yaml", study)), "--check")


CASES: list[tuple[str, Build, str]] = [
    # files that are not regular files
    ("trace-fifo", lambda t: _trace(_fifo(t)), "FIFO"),
    ("trace-link-to-fifo", lambda t: _trace(_link(t, _fifo(t))), "FIFO"),
    ("trace-link-to-dev-zero", lambda t: _trace(_link(t, "/dev/zero")), "character device"),
    ("trace-folder", lambda t: _trace(t), "directory"),
    ("trace-missing", lambda t: _trace(t / "nope.jsonl"), "No such file"),
    ("dataset-fifo", lambda t: _bench("--dataset", str(_fifo(t))), "--dataset"),
    ("dataset-link-to-dev-zero", lambda t: _bench("--dataset", str(_link(t, "/dev/zero"))),
     "--dataset"),
    ("conversation-fifo", lambda t: _bench("--workload", f"conversation:path={_fifo(t)}"),
     "FIFO"),
    ("conversation-link-to-dev-zero",
     lambda t: _bench("--workload", f"conversation:path={_link(t, '/dev/zero')}"),
     "character device"),
    ("tokenizer-with-a-fifo",
     lambda t: (_fifo(t, "tokenizer.json"), _bench("--tokenizer", str(t)))[1], "FIFO"),
    ("baseline-fifo", lambda t: ("check", "--gpu-backend", "none", "--baseline",
                                 str(_fifo(t))), "FIFO"),
    ("study-fifo", lambda t: ("tune", str(_fifo(t, "study.yaml")), "--check"), "FIFO"),
    # sizes and counts, refused while reading or before anything runs
    ("trace-10M-lines", lambda t: _trace(_write(t, "big.jsonl", b"{}\n" * 10_000_000)),
     "more than 1,000,000 lines"),
    ("trace-row-at-1e15-ms", lambda t: _trace(_write(t, "far.jsonl", _rows(0, 1e15))),
     "a trace spans at most 30 days"),
    ("replay-of-two-days", lambda t: (*_trace(_write(t, "days.jsonl", _rows(0, 172_800_000))),
                                      "--replay", "1"),
     "--replay: replay would send for 172,800 s"),
    ("ramp-window-1e-9", lambda t: _bench("--ramp", "linear:start=1,end=2,duration=60,"
                                          "window=1e-9"), "more than 10,000 windows"),
    ("conversation-1000-turns-of-1M-tokens",
     lambda t: _bench("--workload", "conversation:turns=1000,input_len=1048576"),
     "at most 1,048,576"),
    ("conversation-file-history-too-long",
     lambda t: _bench("--workload", "conversation:turns=8,output_len=1000000,path=" + str(
         _write(t, "chat.json", '[{"conversations": [' + ", ".join(
             ['{"from": "human", "value": "hi there"}'] * 8) + "]}]"))),
     "reaches a history of"),
    ("azure-field-over-128KiB",
     lambda t: _trace(_write(t, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             f"2023-11-16 18:15:46.6,\"{'x' * 140_000}\",4\n"), "azure"),
     "larger than the csv module reads"),
    # content never quoted
    ("trace-of-shadow-lines-jsonl", lambda t: _trace(_write(t, "s.jsonl", CANARY + "\n")),
     "not JSON"),
    ("trace-of-shadow-lines-azure",
     lambda t: _trace(_write(t, "s.csv", CANARY + "\n" + CANARY + "\n"), "azure"),
     "has no column"),
    ("trace-timestamp-text",
     lambda t: _trace(_write(t, "ts.jsonl", f'{{"timestamp": "{CANARY}", "input_length": 8, '
                             '"output_length": 4}\n')), "is not a time"),
    ("trace-length-text",
     lambda t: _trace(_write(t, "len.jsonl", f'{{"timestamp": 0, "input_length": "{CANARY}", '
                             '"output_length": 4}\n')), "input_length is not a number"),
    ("azure-count-text",
     lambda t: _trace(_write(t, "n.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                             f"2023-11-16 18:15:46.6,{CANARY.replace(':', ';')},4\n"), "azure"),
     "ContextTokens is not a number"),
    # tune --check finds what the run would
    ("tune-trace-missing", lambda t: _tune(t, f"workload: {{kind: trace, path: {t}/no.jsonl}}\n"),
     "No such file"),
    ("tune-trace-folder", lambda t: _tune(t, f"workload: {{kind: trace, path: {t}}}\n"),
     "directory"),
    ("tune-trace-fifo", lambda t: _tune(t, f"workload: {{kind: trace, path: {_fifo(t)}}}\n"),
     "FIFO"),
    ("tune-dataset-link-to-dev-zero",
     lambda t: _tune(t, f"workload: {{kind: sharegpt, path: {_link(t, '/dev/zero')}}}\n"),
     "character device"),
    ("tune-trace-bad-row",
     lambda t: _tune(t, "workload: {kind: trace, path: " + str(_write(t, "b.jsonl", CANARY))
                     + "}\n"), "not JSON"),
    ("tune-replay-of-two-days", lambda t: _tune_replay(t, _rows(0, 172_800_000)),
     "at most 86,400 s"),
    ("tune-replicates-true", lambda t: _tune(t, "statistics: {replicates: true}\n"),
     "replicates is auto or a number"),
    ("tune-env-name-with-equals", lambda t: _tune(t, "env: {\"A=B\": x}\n"), "holds '='"),
    ("tune-budget-hours-inf", lambda t: _tune(t, "budget: {hours: .inf}\n"), "finite"),
    # options
    ("bench-replay-empty-item",
     lambda t: (*_trace(_write(t, "ok.jsonl", _rows(0, 10))), "--replay", "2,,4"),
     "--replay: item 2 of '2,,4' is empty"),
    ("check-host-empty", lambda t: ("check", "--gpu-backend", "none", "--host", ""),
     "--host: an empty host name"),
    ("clean-grace-nan", lambda t: ("clean", "--pid", "999999", "--grace", "nan"),
     "--grace: must be zero or a positive number of seconds, not nan"),
    ("clean-settle-past-deadline",
     lambda t: ("clean", "--pid", "999999", "--settle", "1e9", "--deadline", "60"),
     "--settle: 1e+09 s is longer than --deadline"),
    ("check-settle-past-deadline",
     lambda t: ("check", "--gpu-backend", "none", "--until-clean", "--settle", "1e9"),
     "--settle: 1e+09 s is longer than --deadline"),
    ("stop-deadline-inf", lambda t: ("stop", "run-x", "--deadline", "inf"),
     "--deadline: must be a positive number of seconds, not inf"),
]


@pytest.mark.parametrize(("build", "needle"), [(b, n) for _i, b, n in CASES],
                         ids=[i for i, _b, _n in CASES])
def test_a_bad_input_exits_2_quickly_naming_it_without_quoting_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        build: Build, needle: str) -> None:
    monkeypatch.chdir(tmp_path)
    args = build(tmp_path)
    res, took = _run(capsys, monkeypatch, *args)
    err = " ".join(res.err.split())  # rich wraps long lines
    assert res.code == 2, (res.out, res.err)
    assert needle in err, res.err
    assert "Traceback" not in res.err
    assert "CANARY" not in res.err + res.out
    assert took < LIMIT_S


def test_preparation_hears_sigterm_inside_an_event_loop() -> None:
    """Prompts built inside a loop that took SIGTERM for its own stop event (as ``bench`` and
    ``tune`` do): the signal interrupts the building within a second, not after it."""
    from cleanslate.bench import RandomWorkload, generate
    from cleanslate.inputs import Interrupted

    stopped = asyncio.Event()
    took: list[float] = []

    async def build() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stopped.set)
        try:
            sent = time.monotonic()
            threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
            with pytest.raises(Interrupted):
                # about 8 s of work (42 ms a prompt): 200 prompts of 100,000 tokens
                generate(RandomWorkload(input_len=100_000), 200, seed=1)
            took.append(time.monotonic() - sent)
            await asyncio.sleep(0.05)  # the loop's own handler runs too, once it can
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    asyncio.run(build())
    assert took and took[0] < 1.3
    assert stopped.is_set()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_interruptible_leaves_default_handlers_alone() -> None:
    from cleanslate.inputs import interruptible

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with interruptible():
        inside = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    assert inside == before == (signal.getsignal(signal.SIGTERM),
                                signal.getsignal(signal.SIGINT))

