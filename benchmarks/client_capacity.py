"""How many streamed tokens/s can a benchmark client sustain on one core?

A zero-delay streaming server (the fake OpenAI server, ``cleanslate.testing.fake_openai``: every
response is ``output_len`` pre-built chat events written as fast as the server can) runs pinned
to one CPU; each client in turn runs pinned to another CPU (its whole process tree:
``os.sched_setaffinity`` is inherited) against a fresh server, in the same run:

* ``cleanslate``: ``cleanslate bench`` with every metric computed;
* ``bare``: a bare aiohttp read loop over one session that computes nothing (the floor);
* ``aiperf`` and ``guidellm``: peer clients, when installed in ``--peers-dir`` (see
  ``--install-peers``; the folder is scratch space, never committed).

Tokens are counted by the server (``GET /stats``), so every client is measured the same way.
The steady window is from the first to the last token the server wrote; the client's CPU
seconds (its process tree, ``psutil``) are read at both ends of that window. Reported per
client and concurrency: tokens/s, CPU-s per 1,000 tokens, and tokens/s per fully used core
(1,000 / CPU-s per 1,000 tokens). If the server's core is saturated the tokens/s figure is the
server's limit, not the client's; the CPU figures stay valid. Finally, ITL accuracy: the
``cleanslate`` client's mean ITL against the server's own mean gap at ``--itl-ms`` (10 ms).

Usage: ``python benchmarks/client_capacity.py [--concurrency 64,256] [--requests 2000]``
(``--server-cpus 1-7 --client-cpu 0`` on a bigger host: one server process per listed core, so the
server is never the limit; on a 2-core machine the one server core usually is).

``--observe-side-by-side [--concurrency 256] [--pairs 6] [--together [--control-pairs N]]``:
only the observers' cost (issue 36 item 7): this client with its observers on (the default; the
server's ``/metrics`` answers a real vLLM 0.32 capture, ``--metrics-file``) and off, in
interleaved pairs or (``--together``) both at once on the client core from a start barrier; the
ratio on/off of tokens/s per busy client core with its interval (target: at least 0.97), the
same with both off (``--control-pairs``: the method's own bias), and what one scrape costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
PEERS = {"aiperf": "aiperf==0.13.0", "guidellm": "guidellm==0.8.1"}

# this client through its API (what ``cleanslate bench --no-live`` runs, without the CLI's imports);
# a 6th argument "off" turns the observers off (``--no-observe``), as the side-by-side mode does;
# a 7th names a folder: the client touches ready-<its PID> there as its level starts (after the
# server's configuration is read) and waits for "go" (the together mode's start barrier)
OURS = r"""
import asyncio, os, sys
CHILD = sys.argv.pop() if sys.argv[-1].startswith("\nimport") else ""
from pathlib import Path
import cleanslate.engines  # registers the engines' metric names, as cleanslate bench does
from cleanslate.bench import (BenchConfig, ClosedLoop, Harness, ObserveOptions,
                              parse_workload, run_benchmark)
url, conc, n, workload, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
# "off": no observer; "config": the configuration read before the first level, no scrape
observe = ObserveOptions(enabled=sys.argv[6:7] != ["off"], metrics=sys.argv[6:7] != ["config"],
                         interval_s=float(sys.argv[9]) if sys.argv[9:10] else 0.25)
config = BenchConfig(url=url, model="m", endpoint="chat", workload=parse_workload(workload),
                     loads=(ClosedLoop(concurrency=conc),), num_prompts=n, observe=observe)
harness = Harness()
if sys.argv[10:11] == ["thread"]:  # an idle second thread, as the observer's parse leaves one
    import threading
    idle = threading.Event()
    threading.Thread(target=idle.wait, daemon=True).start()
if sys.argv[8:9] and sys.argv[8] != "-":  # parse this metrics file first, as the read does
    from cleanslate.bench._server_config import parse_cache_config
    parse_cache_config(Path(sys.argv[8]).read_text())
if sys.argv[13:14] == ["inline"]:  # the observer parses its scrapes in the event loop
    import types
    from cleanslate.bench import _server_metrics
    async def inline(function, *args, **kwargs):
        return function(*args, **kwargs)
    _server_metrics.asyncio = types.SimpleNamespace(
        **{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    _server_metrics.asyncio.to_thread = inline
scraper = None
if sys.argv[12:13] == ["child"]:  # the engine-metrics observer in a child process of its own
    import subprocess
    scraper = subprocess.Popen([sys.executable, "-c", CHILD, url, sys.argv[9]])
if sys.argv[7:8]:  # a start barrier: say "ready" as the level starts, wait for "go"
    import time
    barrier, ready = Path(sys.argv[7]), []
    def wait_go():
        if not ready:
            ready.append(1)
            (barrier / f"ready-{os.getpid()}").touch()
            while not (barrier / "go").exists():
                time.sleep(0.001)
    if sys.argv[11:12] == ["level"]:  # at the level's clock, after its observers started
        import contextlib
        from cleanslate.bench import _runner
        held = _runner.collector_held
        @contextlib.contextmanager
        def at_level():
            wait_go()
            with held():
                yield
        _runner.collector_held = at_level
    else:  # as the level is announced, before its observers start
        harness = Harness(on_progress=lambda progress: wait_go())
try:
    Path(out).write_text(asyncio.run(run_benchmark(config, harness)).model_dump_json())
finally:
    if scraper is not None:
        scraper.kill()
        scraper.wait()
"""

# The engine-metrics observer alone, scraping every interval until killed (``--on-child``).
CHILD = r"""
import asyncio, sys
import cleanslate.engines
from cleanslate.bench._metric_names import registered_maps
from cleanslate.bench._server_metrics import MetricsObserver
async def main():
    observer = MetricsObserver(sys.argv[1], registered_maps(None), interval_s=float(sys.argv[2]))
    await observer.start()
    await asyncio.sleep(3600)
asyncio.run(main())
"""

BARE = r"""
import asyncio, sys, aiohttp, json
url, conc, n, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
async def main():
    body = json.dumps({"model": "m", "stream": True, "max_tokens": out_len,
                       "messages": [{"role": "user", "content": "hi " * 100}],
                       "stream_options": {"include_usage": True}}).encode()
    left = [n]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def worker():
            while left[0] > 0:
                left[0] -= 1
                async with s.post(url + "/v1/chat/completions", data=body,
                                  headers={"Content-Type": "application/json"}) as r:
                    while await r.content.readany():
                        pass
        await asyncio.gather(*(worker() for _ in range(conc)))
asyncio.run(main())
"""


def parse_cpus(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


@dataclass
class Server:
    procs: list[subprocess.Popen[bytes]]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> dict[str, float]:
        """The server's counters; asked up to 3 times (a server core shared with other work
        once took more than 5 s to answer, which ended a 40-pair run with a traceback)."""
        for attempt in range(3):
            try:
                with urllib.request.urlopen(self.url + "/stats", timeout=15) as resp:
                    data = json.loads(resp.read())
                break
            except OSError as exc:  # TimeoutError and URLError are OSErrors
                if attempt == 2:
                    raise SystemExit(f"the fake server at {self.url} did not answer /stats "
                                     f"three times ({exc}); run on a quieter machine") from None
        return {
            "tokens": data["tokens"],
            "requests": data["requests"],
            "mean_itl_s": data["mean_itl_s"] or 0.0,
        }

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()  # a multi-process server kills its workers on SIGTERM
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def start_server(cpus: list[int], itl_ms: float = 0.0, metrics: Path | None = None) -> Server:
    """One server process (multi-process servers would need per-process stats; keep one);
    ``metrics``: the file its ``GET /metrics`` answers (404 without)."""
    argv = [sys.executable, "-m", "cleanslate.testing.fake_openai", "--port", "0",
            "--cpu", str(cpus[0]), "--itl-ms", str(itl_ms)]
    if metrics is not None:
        argv += ["--metrics-file", str(metrics)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("READY"):
        raise RuntimeError(f"fake server did not start: {line!r}")
    return Server([proc], int(line.split()[1]))


def tree_cpu(proc: psutil.Process) -> float:
    total = 0.0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


@dataclass
class Measure:
    client: str
    concurrency: int
    tokens: float
    window_s: float
    cpu_s: float
    ok: bool
    note: str = ""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.window_s if self.window_s > 0 else 0.0

    @property
    def cpu_per_1k(self) -> float:
        return self.cpu_s / self.tokens * 1000 if self.tokens else float("nan")


def measure(
    name: str, argv: list[str], server: Server, client_cpu: int, concurrency: int, timeout: float
) -> Measure:
    def pin() -> None:
        os.sched_setaffinity(0, {client_cpu})

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, after the child exits)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin, env=env)
    ps = psutil.Process(proc.pid)
    start_tokens = server.stats()["tokens"]
    samples: list[tuple[float, float, float]] = []  # (time, tokens, client cpu)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        cpu = tree_cpu(ps)
        tokens = server.stats()["tokens"] - start_tokens
        samples.append((time.monotonic(), tokens, cpu))
        time.sleep(0.1)
    timed_out = proc.poll() is None
    if timed_out:
        proc.kill()
    proc.wait()
    final = server.stats()["tokens"] - start_tokens
    # steady window: first sample with tokens > 0 .. first sample that reached the final count
    moving = [s for s in samples if s[1] > 0]
    if len(moving) < 3:
        log.seek(0)
        tail = log.read()[-600:].decode(errors="replace")
        log.close()
        return Measure(name, concurrency, final, 0.0, 0.0, False, f"no steady window: {tail}")
    log.close()
    first = moving[0]
    last = next((s for s in moving if s[1] >= final), moving[-1])
    note = "timed out" if timed_out else ""
    if proc.returncode not in (0, None) and not timed_out:
        note = f"exit {proc.returncode}"
    return Measure(
        name,
        concurrency,
        last[1] - first[1],
        last[0] - first[0],
        last[2] - first[2],
        not timed_out,
        note,
    )


#: The share of each server's tokens cut from both ends of the together mode's common window.
TRIM = 0.1


def measure_together(runs: dict[str, list[str]], servers: dict[str, Server],
                     outputs: dict[str, Path], client_cpu: int, timeout: float,
                     barrier: Path | None = None) -> dict[str, dict[str, float]]:
    """Start every client of ``runs`` (name -> argv writing its result to ``outputs[name]``,
    driving ``servers[name]``) at once, all pinned to ``client_cpu``, so that the machine's
    other load weighs on each alike. Every 0.1 s, each server's token count and each client's
    CPU seconds (its process tree, threads included: an observer's scrapes count) are read;
    the figures are taken over the **common window**: the readings where every server has
    written more than :data:`TRIM` of its final count and less than ``1 - TRIM`` of it, so both
    clients share the core for all of it and neither is opening its connections or draining
    its last requests. ``barrier``: a folder the clients' argvs name (:data:`OURS`'s 7th
    argument): each stops as its level starts and all go at once. Without one, the client that
    starts later (after reading the server's configuration: 0.13 s) is the slower one: two
    clients with no observer, one started 0.15 s after the other, measured 0.921 [0.886,
    0.956] of each other (16 pairs), more than the observers' whole effect. Per name:
    ``tokens``, ``tok_s``, ``cpu_s`` of the common window, ``window_s``, and the level's own
    ``level_tok_s``."""
    def pin() -> None:
        os.sched_setaffinity(0, {client_cpu})

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    names = list(runs)
    base = {name: servers[name].stats()["tokens"] for name in names}
    procs = {name: subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    preexec_fn=pin, env=env)
             for name, argv in runs.items()}
    if barrier is not None:  # every client at its level's start, then all at once
        deadline = time.monotonic() + timeout
        while not all((barrier / f"ready-{p.pid}").exists() for p in procs.values()):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs.values()):
                for proc in procs.values():
                    proc.kill()
                    proc.wait()
                raise RuntimeError("a client never reached the start barrier")
            time.sleep(0.001)
        (barrier / "go").touch()
    handles = {name: psutil.Process(proc.pid) for name, proc in procs.items()}
    readings: list[tuple[float, dict[str, float], dict[str, float]]] = []
    switches: list[dict[str, tuple[int, int, int]]] = []
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        cpu = {name: tree_cpu(handles[name]) for name in names}
        tokens = {name: servers[name].stats()["tokens"] - base[name] for name in names}
        readings.append((time.monotonic(), tokens, cpu))
        switches.append({name: task_switches(handles[name].pid) for name in names})
        time.sleep(0.1)
    errors: dict[str, bytes] = {}
    for name, proc in procs.items():
        try:
            _, errors[name] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            _, errors[name] = proc.communicate()
        if proc.returncode != 0 or not outputs[name].exists():
            raise RuntimeError(f"{name} failed: {errors[name].decode(errors='replace')[-600:]}")
    final = {name: servers[name].stats()["tokens"] - base[name] for name in names}
    common = [r for r in readings
              if all(TRIM * final[name] < r[1][name] < (1 - TRIM) * final[name]
                     for name in names)]
    if len(common) < 3:
        raise RuntimeError(f"no common window of 3 readings ({len(common)}): the clients did "
                           "not overlap; more --requests")
    first, last = common[0], common[-1]
    at = {id(r): i for i, r in enumerate(readings)}
    sw0, sw1 = switches[at[id(first)]], switches[at[id(last)]]
    out: dict[str, dict[str, float]] = {}
    for name in names:
        level = json.loads(outputs[name].read_text())["levels"][0]
        made = last[1][name] - first[1][name]
        out[name] = {"tokens": made, "window_s": last[0] - first[0],
                     "tok_s": made / (last[0] - first[0]),
                     "cpu_s": last[2][name] - first[2][name],
                     "level_tok_s": level["output_throughput"],
                     # the main thread's context switches and the process's minor faults
                     "voluntary": sw1[name][0] - sw0[name][0],
                     "involuntary": sw1[name][1] - sw0[name][1],
                     "minor_faults": sw1[name][2] - sw0[name][2]}
    return out


def task_switches(pid: int) -> tuple[int, int, int]:
    """``(voluntary, involuntary)`` context switches of ``pid``'s main thread and the
    process's minor page faults; zeros once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0, 0, 0
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    minflt = int(stat.rsplit(")", 1)[1].split()[7])
    return (int(fields.get("voluntary_ctxt_switches", "0")),
            int(fields.get("nonvoluntary_ctxt_switches", "0")), minflt)


def client_argvs(
    url: str, concurrency: int, requests: int, out_len: int, peers: Path, work: Path
) -> dict[str, list[str]]:
    argv = {
        "cleanslate": [
            sys.executable,
            "-c",
            OURS,
            url,
            str(concurrency),
            str(requests),
            f"random:input_len=100,output_len={out_len}",
            str(work / f"cleanslate-{concurrency}.json"),
        ],
        "bare": [sys.executable, "-c", BARE, url, str(concurrency), str(requests), str(out_len)],
    }
    aiperf = peers / "aiperf" / "bin" / "aiperf"
    if aiperf.exists():
        argv["aiperf"] = [
            str(aiperf),
            "profile",
            "--model",
            "m",
            "--url",
            url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--concurrency",
            str(concurrency),
            "--request-count",
            str(requests),
            "--isl",
            "100",
            "--osl",
            str(out_len),
            "--tokenizer",
            str(work / "tok"),
            "--use-server-token-count",
            "--ui",
            "none",
            "--extra-inputs",
            "ignore_eos:true",
            "--random-seed",
            "0",
            "--artifact-dir",
            str(work / f"aiperf-{concurrency}"),
        ]
    guidellm = peers / "guidellm" / "bin" / "guidellm"
    if guidellm.exists():
        argv["guidellm"] = [
            str(guidellm),
            "run",
            # the model name doubles as the tokenizer directory (the server ignores it)
            "--backend",
            f"kind=openai_http,target={url},model={work / 'tok'}",
            "--profile",
            f"kind=concurrent,streams={concurrency}",
            "--constraint",
            f"kind=max_requests,count={requests}",
            "--data",
            f"kind=synthetic_text,prompt_tokens=100,output_tokens={out_len}",
            "--output",
            f"kind=json,path={work / f'guidellm-{concurrency}.json'}",
            "--disable-console-interactive",
        ]
    return argv


def install_peers(peers: Path) -> None:
    peers.mkdir(parents=True, exist_ok=True)
    for name, spec in PEERS.items():
        venv = peers / name
        if not (venv / "bin" / name).exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "-q", spec], check=True)


def make_tokenizer(path: Path) -> None:
    """A word-level tokenizer made here (no download) for the peers that insist on one: one
    token per whitespace-separated word, the same count the fake and sim servers use, so
    ``--isl 256`` means 256 prompt tokens to the server as it does for this client."""
    if (path / "tokenizer.json").exists():
        return
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:  # only the peers need it
        return
    from cleanslate.bench._tokens import WORDS

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": 1000000,
                "unk_token": "[UNK]",
            }
        )
    )


def itl_accuracy(server_cpus: list[int], client_cpu: int, itl_ms: float, work: Path
                 ) -> dict[str, float]:
    server = start_server(server_cpus, itl_ms=itl_ms)
    try:
        out = work / "itl.json"
        argv = [
            sys.executable, "-c", OURS, server.url, "64", "256",
            "random:input_len=100,output_len=100,range_ratio=0.5", str(out),
        ]  # fmt: skip
        subprocess.run(
            argv,
            check=True,
            capture_output=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {client_cpu}),
        )
        client = json.loads(out.read_text())["levels"][0]["mean_itl_ms"]
        truth = server.stats()["mean_itl_s"] * 1000
    finally:
        server.stop()
    return {"gap_ms": itl_ms, "server_mean_ms": round(truth, 4),
            "client_mean_ms": round(client, 4),
            "error_pct": round((client - truth) / truth * 100, 3)}


def ratios(results: list[Measure]) -> list[dict[str, Any]]:
    """Per concurrency: this client's tokens/s per busy core against each peer's, measured in
    the same run (> 1: this client needs less CPU per token)."""
    rows = []
    for conc in sorted({r.concurrency for r in results}):
        ours = next((r for r in results if r.client == "cleanslate" and r.concurrency == conc
                     and r.ok), None)
        for peer in ("aiperf", "guidellm", "bare"):
            other = next((r for r in results if r.client == peer and r.concurrency == conc
                          and r.ok), None)
            if ours is None or other is None:
                continue
            rows.append({"concurrency": conc, "anchor": peer,
                         "ours_tok_s_per_core": round(1000 / ours.cpu_per_1k),
                         "anchor_tok_s_per_core": round(1000 / other.cpu_per_1k),
                         "ratio": round(other.cpu_per_1k / ours.cpu_per_1k, 3),
                         "ours_tok_s": round(ours.tok_s), "anchor_tok_s": round(other.tok_s)})
    return rows


def scrape_cost(metrics: Path, scrapes: int = 200) -> dict[str, float]:
    """What one scrape of ``metrics`` (served by the fake server, on the server's core) costs
    the observer in this process: CPU ms and wall ms per scrape (fetch through aiohttp and
    parse into the vocabulary), and the CPU share of one core at the default period."""
    import asyncio

    import aiohttp

    from cleanslate.bench import MetricsObserver
    from cleanslate.bench._observe import DEFAULT_INTERVAL_S
    from cleanslate.engines import metric_maps

    server = start_server([os.sched_getaffinity(0).pop()], metrics=metrics)

    async def run() -> tuple[float, float]:
        async with aiohttp.ClientSession() as session:
            observer = MetricsObserver(server.url, metric_maps(), session=session)
            await observer.start(loop=False)  # the flavour is found; then timed
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(scrapes):
                await observer.sample()
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            assert all(s.error is None for s in observer.samples), observer.samples[-1].error
            await observer.stop()
        return cpu, wall

    try:
        cpu, wall = asyncio.run(run())
    finally:
        server.stop()
    cpu_ms, wall_ms = cpu / scrapes * 1000, wall / scrapes * 1000
    return {"scrapes": scrapes, "body_bytes": metrics.stat().st_size,
            "cpu_ms_per_scrape": round(cpu_ms, 3), "wall_ms_per_scrape": round(wall_ms, 3),
            "cpu_share_pct": round(cpu_ms / (DEFAULT_INTERVAL_S * 1000) * 100, 3)}


def prime(url: str) -> None:
    """Read the configuration of the server at ``url`` from this process, as the client with
    its observers on does before its first level (the same requests, another client)."""
    import asyncio

    from cleanslate.bench._server_config import read_server_config
    asyncio.run(read_server_config(None, url))


def ratio_text(iv: dict[str, Any]) -> str:
    """``mean [low, high]`` (the mean alone without an interval)."""
    if iv.get("low") is None or iv.get("high") is None:
        return f"{iv['mean']:.3f}"
    return f"{iv['mean']:.3f} [{iv['low']:.3f}, {iv['high']:.3f}]"


def observe_side_by_side(args: argparse.Namespace, work: Path,
                         report: Callable[[str], None]) -> dict[str, Any]:
    """The client's capacity with its observers on (the default: the engine-metrics observer
    scraping the fake server's ``/metrics``, a real vLLM capture, every 250 ms) and off
    (``observe`` disabled), at one concurrency, in ``args.pairs`` pairs of runs; each pair
    runs both on fresh servers, the order alternating from pair to pair. Per pair: the ratio
    on/off of tokens/s per busy client core (the client's capacity) and of tokens/s; their
    means with 95 % Student-t intervals over the pairs."""
    from cleanslate.stats import t_interval

    server_cpus = parse_cpus(args.server_cpus)
    conc = int(args.concurrency.split(",")[-1])
    workload = f"random:input_len=100,output_len={args.output_len}"
    pairs: list[dict[str, Any]] = []
    for i in range(args.pairs):
        pair: dict[str, Any] = {}
        if args.together:
            servers = {mode: start_server(server_cpus, metrics=args.metrics_file)
                       for mode in ("off", "on")}
            outputs = {mode: work / f"t-{mode}-{i}.json" for mode in ("off", "on")}
            barrier = work / f"barrier-{i}"
            barrier.mkdir()
            # --control: the "on" client observes nothing either (the method's own bias)
            flags = {"off": "config" if args.off_reads_config else "off",
                     "on": "off" if args.control else "config" if args.on_child else "on"}
            if args.prime_off:  # the off client's server answers the configuration read too
                prime(servers["off"].url)
            try:
                got = measure_together({
                    mode: [sys.executable, "-c", OURS, servers[mode].url, str(conc),
                           str(args.requests), workload, str(outputs[mode]), flags[mode],
                           str(barrier),
                           str(args.metrics_file) if mode == "off" and args.off_parses
                           else "-", str(args.observe_interval),
                           "thread" if mode == "off" and args.off_thread else "-",
                           "level" if args.barrier_at_level else "announce",
                           "child" if mode == "on" and args.on_child else "-",
                           "inline" if mode == "on" and args.on_inline else "-", CHILD]
                    for mode in ("off", "on")}, servers, outputs, args.client_cpu, args.timeout,
                    barrier)
            finally:
                for server in servers.values():
                    server.stop()
            for mode, fig in got.items():
                seen = json.loads(outputs[mode].read_text())["levels"][0].get(
                    "server_metrics") or {}
                pair[mode] = {"ok": fig["cpu_s"] > 0, "note": "together",
                              "tok_s": round(fig["tok_s"]),
                              "tok_s_per_core": round(fig["tokens"] / fig["cpu_s"]),
                              "cpu_per_1k": fig["cpu_s"] / fig["tokens"] * 1000,
                              "window_s": round(fig["window_s"], 2),
                              "level_tok_s": round(fig["level_tok_s"]),
                              "scrapes": seen.get("samples", 0),
                              "failed_scrapes": seen.get("failed_scrapes", 0),
                              "flavour": seen.get("flavour"),
                              **{k: fig[k] for k in ("voluntary", "involuntary",
                                                     "minor_faults")}}
            report(f"pair {i + 1} together: off {pair['off']['tok_s_per_core']:,} on "
                   f"{pair['on']['tok_s_per_core']:,} tok/s per busy core "
                   f"(tok/s {pair['off']['tok_s']:,} / {pair['on']['tok_s']:,}; context "
                   "switches voluntary/involuntary, minor faults: off "
                   f"{pair['off']['voluntary']}/{pair['off']['involuntary']}, "
                   f"{pair['off']['minor_faults']}; on {pair['on']['voluntary']}/"
                   f"{pair['on']['involuntary']}, {pair['on']['minor_faults']})")
        for mode in () if args.together else ("off", "on") if i % 2 == 0 else ("on", "off"):
            server = start_server(server_cpus, metrics=args.metrics_file)
            out = work / f"observe-{mode}-{i}.json"
            argv = [sys.executable, "-c", OURS, server.url, str(conc), str(args.requests),
                    workload, str(out), mode]
            try:
                res = measure(f"observe-{mode}", argv, server, args.client_cpu, conc,
                              args.timeout)
            finally:
                server.stop()
            seen = {}
            if out.exists():
                level = json.loads(out.read_text())["levels"][0]
                seen = level.get("server_metrics") or {}
            usable = res.ok and res.tokens > 0 and res.cpu_s > 0
            pair[mode] = {"ok": usable, "note": res.note, "tok_s": round(res.tok_s),
                          "tok_s_per_core": round(1000 / res.cpu_per_1k) if usable else 0,
                          "cpu_per_1k": res.cpu_per_1k, "scrapes": seen.get("samples", 0),
                          "failed_scrapes": seen.get("failed_scrapes", 0),
                          "flavour": seen.get("flavour"), "unreadable": seen.get("unreadable")}
            report(f"pair {i + 1} {mode:>3}: {res.tok_s:>9,.0f} tok/s  "
                   f"{pair[mode]['tok_s_per_core']:>9,} tok/s per busy core  scrapes "
                   f"{seen.get('samples', 0)} ({seen.get('flavour')}, failed "
                   f"{seen.get('failed_scrapes', 0)})  {res.note}")
        if pair["on"]["ok"] and pair["off"]["ok"]:
            pair["capacity_ratio"] = pair["off"]["cpu_per_1k"] / pair["on"]["cpu_per_1k"]
            pair["throughput_ratio"] = pair["on"]["tok_s"] / pair["off"]["tok_s"]
        pairs.append(pair)
    done = [p for p in pairs if "capacity_ratio" in p]
    summary: dict[str, Any] = {"concurrency": conc, "requests": args.requests,
                               "method": ("together" if args.together else "interleaved")
                               + (", control (both off)" if args.control else "")
                               + (", the off client reads the configuration"
                                  if args.off_reads_config else "")
                               + (", the off client parses" if args.off_parses else "")
                               + (", the off client has an idle thread" if args.off_thread
                                  else "")
                               + f", observe interval {args.observe_interval} s",
                               "output_len": args.output_len, "pairs": pairs,
                               "metrics_file": args.metrics_file.name,
                               "target": 0.97}
    for key in ("capacity_ratio", "throughput_ratio"):
        if done:
            iv = t_interval([p[key] for p in done])
            summary[key] = {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}
    summary["scrape_cost"] = scrape_cost(args.metrics_file)
    cap, thr = summary.get("capacity_ratio"), summary.get("throughput_ratio")
    if cap and thr:
        report(f"c={conc}, {len(done)} pairs: observers on/off, tok/s per busy core "
               f"{ratio_text(cap)}, tok/s {ratio_text(thr)} (95 %; target >= 0.97)")
    cost = summary["scrape_cost"]
    report(f"one scrape of {cost['body_bytes']:,} bytes: {cost['cpu_ms_per_scrape']:.2f} ms CPU, "
           f"{cost['wall_ms_per_scrape']:.2f} ms wall; every 250 ms: {cost['cpu_share_pct']:.2f} %"
           " of a core")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--requests", type=int, default=2000, help="requests per client and level")
    ap.add_argument("--output-len", type=int, default=200)
    ap.add_argument("--clients", default="cleanslate,bare,aiperf,guidellm")
    ap.add_argument("--server-cpus", default="0", help="one server process per CPU: 0 or 2-7")
    ap.add_argument("--client-cpu", type=int, default=1)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per client run")
    ap.add_argument("--peers-dir", type=Path, default=REPO / "scratch" / "bench-peers")
    ap.add_argument("--install-peers", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the results here too")
    ap.add_argument("--observe-side-by-side", action="store_true",
                    help="only the observers' cost: this client with them on and off, "
                         "--pairs pairs at the last --concurrency")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--together", action="store_true",
                    help="side by side: run each pair's two clients at the same time on the "
                         "client core (each with its own server), measured over their common "
                         "window; the machine's other load then weighs on both alike")
    for flag, what in (
            ("--control", "both clients with the observers off, the method's own bias (an A/A "
                          "test); the ratio should hold 1.0"),
            ("--prime-off", "before each pair, this harness reads the off client's server's "
                            "configuration as the on client does (its server then has "
                            "answered the same requests)"),
            ("--off-parses", "the off client parses the metrics file's cache configuration "
                             "before its run, as the on client's configuration read does "
                             "(no request)"),
            ("--off-thread", "the off client starts an idle second thread before its "
                             "level, as the on client's parse in a worker thread does"),
            ("--off-reads-config", "the off client reads the server's configuration before "
                                   "its first level, as the on client does (its requests and "
                                   "the parse), and scrapes nothing"),
            ("--on-child", "the on client reads the server's configuration but scrapes "
                           "nothing itself: a child process of its own scrapes the server's "
                           "metrics every interval (the scrapes' cost out of the client's "
                           "process, still in its CPU)"),
            ("--on-inline", "the on client's observer parses each scrape in its event loop, "
                            "not in a worker thread"),
            ("--barrier-at-level", "the start barrier where the level's clock starts, after "
                                   "its observers have started (their baseline scrape), not "
                                   "as the level is announced before them")):
        ap.add_argument(flag, action="store_true", help=f"with --together: {what}")
    ap.add_argument("--observe-interval", type=float, default=0.25,
                    help="with --together: the observers' sampling period (seconds)")
    ap.add_argument("--control-pairs", type=int, default=0,
                    help="with --together: then this many pairs of --control")
    ap.add_argument("--metrics-file", type=Path,
                    default=REPO / "tests" / "fixtures" / "engine-metrics" / "vllm-0.32-after.txt",
                    help="what the server's /metrics answers in the side-by-side mode")
    args = ap.parse_args()
    server_cpus = parse_cpus(args.server_cpus)
    os.sched_setaffinity(0, set(server_cpus))  # this harness stays off the client's core
    if args.observe_side_by_side:
        with tempfile.TemporaryDirectory(prefix="cleanslate-observe-") as tmp:
            summary = observe_side_by_side(args, Path(tmp), lambda s: print(s, flush=True))
            if args.together and args.control_pairs:
                (Path(tmp) / "control").mkdir()
                control = argparse.Namespace(**{**vars(args), "control": True,
                                                "pairs": args.control_pairs})
                print("control: both clients with the observers off", flush=True)
                summary["control"] = observe_side_by_side(
                    control, Path(tmp) / "control", lambda s: print(s, flush=True))
        if args.json is not None:
            args.json.write_text(json.dumps(summary, indent=1))
        return
    if args.install_peers:
        install_peers(args.peers_dir)
    wanted = args.clients.split(",")
    results: list[Measure] = []
    report: Callable[[str], None] = lambda s: print(s, flush=True)  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="cleanslate-capacity-") as tmp:
        work = Path(tmp)
        make_tokenizer(work / "tok")
        for conc in (int(c) for c in args.concurrency.split(",")):
            for name in wanted:
                server = start_server(server_cpus)
                try:
                    argvs = client_argvs(
                        server.url, conc, args.requests, args.output_len, args.peers_dir, work
                    )
                    if name not in argvs:
                        report(f"{name}: not installed in {args.peers_dir} (--install-peers)")
                        continue
                    res = measure(name, argvs[name], server, args.client_cpu, conc, args.timeout)
                finally:
                    server.stop()
                results.append(res)
                report(
                    f"{name:>10} c={conc:<4} {res.tok_s:>9,.0f} tok/s  "
                    f"{res.cpu_per_1k:.4f} CPU-s/1k tok  "
                    f"{1000 / res.cpu_per_1k if res.cpu_per_1k == res.cpu_per_1k else 0:>9,.0f}"
                    f" tok/s per busy core  {res.note}"
                )
        itl = itl_accuracy(server_cpus, args.client_cpu, args.itl_ms, work)
        report(f"ITL at a {itl['gap_ms']:g} ms gap (c=64, 50-150 tokens): server mean "
               f"{itl['server_mean_ms']:.3f} ms, cleanslate mean {itl['client_mean_ms']:.3f} ms, "
               f"error {itl['error_pct']:+.2f}%")
    compared = ratios(results)
    for row in compared:
        report(f"c={row['concurrency']}: cleanslate {row['ours_tok_s_per_core']:,} tok/s per "
               f"busy core, {row['anchor']} {row['anchor_tok_s_per_core']:,}: "
               f"ratio {row['ratio']:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "measures": [{**dataclasses.asdict(r), "tok_s": round(r.tok_s),
                          "cpu_per_1k": r.cpu_per_1k} for r in results],
            "ratios": compared, "itl": itl}, indent=1))


if __name__ == "__main__":
    main()
