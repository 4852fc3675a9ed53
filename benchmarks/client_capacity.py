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

# this client through its API (what ``cleanslate bench --no-live`` runs, without the CLI's imports)
OURS = r"""
import asyncio, sys
from pathlib import Path
from cleanslate.bench import BenchConfig, ClosedLoop, parse_workload, run_benchmark
url, conc, n, workload, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:6]
config = BenchConfig(url=url, model="m", endpoint="chat", workload=parse_workload(workload),
                     loads=(ClosedLoop(concurrency=conc),), num_prompts=n)
Path(out).write_text(asyncio.run(run_benchmark(config)).model_dump_json())
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
        with urllib.request.urlopen(self.url + "/stats", timeout=5) as resp:
            data = json.loads(resp.read())
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


def start_server(cpus: list[int], itl_ms: float = 0.0) -> Server:
    """One server process (multi-process servers would need per-process stats; keep one)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cleanslate.testing.fake_openai",
            "--port",
            "0",
            "--cpu",
            str(cpus[0]),
            "--itl-ms",
            str(itl_ms),
        ],
        stdout=subprocess.PIPE,
    )
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
    args = ap.parse_args()
    server_cpus = parse_cpus(args.server_cpus)
    os.sched_setaffinity(0, set(server_cpus))  # this harness stays off the client's core
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
