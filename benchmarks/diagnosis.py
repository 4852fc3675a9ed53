"""The bottleneck verdict against the sim's known truth: a confusion matrix over many cells.

A *cell* is one configuration of the simulated engine at one concurrency. For each seed and
configuration the script starts a real ``cleanslate sim serve --enable-metrics`` (its own noise:
``--noise-seed SEED``, with the default drift, cold start and step noise), benchmarks its levels
in ascending order with the observers on (the engine's metrics and the simulated GPUs'
telemetry, sampled every 0.1 s: a level's steady window is about 1.2 s), takes each level's
verdict from :func:`cleanslate.bench.diagnose` with the levels before it, the configuration in
effect and the workload (as ``run_benchmark`` sets ``LevelResult.bottleneck``; each level is
its own run here, because its request count is sized to its own throughput) and compares it
with :func:`cleanslate.sim.model.binding_constraint` for that cell. Each configuration runs at
the time scale that keeps its busiest level near 2,000 output tokens/s (0.25 to 1), so the
machine's two cores serve and measure it without falling behind the model.

Printed: the confusion matrix (truth x verdict, and the verdicts' confidence), the accuracy of
the clear verdicts (target >= 95 %), the clear verdicts that confuse ``running_cap`` with
``compute`` or ``kv_capacity`` (target 0), the share of ``unknown`` (target <= 10 %), and every
cell whose verdict differs from the truth, with its evidence.

A throttled cell (the ``throttle-clock`` fault) is correct when the verdict is ``throttled``,
or when it is the constraint beneath the throttle with ``throttled`` in ``also`` (the rules
list a throttled GPU beside what else they saw).

    python benchmarks/diagnosis.py [--seeds 1 2 3] [--json benchmarks/results/diagnosis.json]
    python benchmarks/diagnosis.py --quick        # the CI subset: a few cells, one seed

Runs in private PID, network and mount namespaces (root; ``_isolate.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cleanslate.engines  # noqa: F401  (registers the engines' metric maps and advice)
from _isolate import ROOT, reexec_isolated
from cleanslate.bench import (
    BenchConfig,
    ClosedLoop,
    LevelResult,
    ObserveOptions,
    RandomWorkload,
    run_benchmark,
)
from cleanslate.bench._bottleneck import Bottleneck, diagnose
from cleanslate.bench._server_config import ServerConfig
from cleanslate.sim.model import (
    MAX_SM_CLOCK_MHZ,
    Binding,
    SimModel,
    SimSettings,
    auto_max_running_requests,
    binding_constraint,
    cycle_throughput,
    settings_from_flags,
)

MODEL = "cleanslate/sim-70b"
#: Every level's steady window lasts about this long (seconds of wall clock, by the model's
#: throughput): its clients plus the requests they finish in it (``Config.prompts``).
LEVEL_S = 1.2
#: The busiest level of a configuration runs near this many output tokens/s (wall clock).
TARGET_TOK_S = 2000.0
#: The observers' sampling period (s): the default 0.25 leaves 4-5 samples in a 1.2 s level.
OBSERVE_S = 0.1


@dataclass(frozen=True)
class Config:
    """One server of the grid: SGLang-spelled ``flags``, the workload (``prefix`` tokens of
    one shared prefix, then ``input_len`` fresh ones; ``output_len`` out), the levels it is
    benchmarked at (ascending: a crash ends the server, so a crashing level comes last) and the
    ``throttle-clock`` fault (MHz) when set."""

    name: str
    flags: dict[str, object]
    input_len: int
    output_len: int
    levels: tuple[int, ...]
    prefix: int = 0
    throttle: int | None = None

    @property
    def time_scale(self) -> float:
        """``--time-scale``: what keeps the busiest level near :data:`TARGET_TOK_S` output
        tokens/s of wall clock (the machine's two cores then serve and measure it without
        falling behind the model), within 0.25 to 1 (faster, the sim's own per-step CPU would
        stretch its steps: ``docs/sim-model.md``)."""
        model = SimModel(self.settings(0, 1.0))
        prompt = self.prefix + self.input_len
        peak = max(cycle_throughput(model, max(1, self.truth(c, 1.0).batch), prompt,
                                    self.output_len, self.prefix / prompt) * 1000
                   for c in self.levels)
        if self.throttle is not None:
            peak *= self.throttle / MAX_SM_CLOCK_MHZ
        return round(min(1.0, max(0.25, peak / TARGET_TOK_S)), 2)

    def settings(self, seed: int, time_scale: float | None = None) -> SimSettings:
        """The settings in effect (``max-running-requests`` chosen by the sim when absent)."""
        s = replace(settings_from_flags(self.flags), noise_seed=seed,
                    time_scale=self.time_scale if time_scale is None else time_scale)
        if "max-running-requests" not in self.flags:
            s = replace(s, max_running_requests=auto_max_running_requests(s))
        return s

    def prompts(self, c: int) -> int:
        """Requests of the level at ``c``: its clients plus what the model says they finish
        in :data:`LEVEL_S` of wall clock (the steady window), between 2 and 5 per client (the
        bench's default is 5) and at least 20."""
        prompt = self.prefix + self.input_len
        model = SimModel(self.settings(0))
        tok_per_ms = cycle_throughput(model, max(1, self.truth(c).batch), prompt,
                                      self.output_len, self.prefix / prompt)
        if self.throttle is not None:
            tok_per_ms *= self.throttle / MAX_SM_CLOCK_MHZ
        per_s = tok_per_ms * 1000 / self.output_len / self.time_scale
        return max(20, min(5 * c, max(2 * c, c + round(per_s * LEVEL_S))))

    def truth(self, c: int, time_scale: float | None = None) -> Binding:
        prompt = self.prefix + self.input_len
        return binding_constraint(self.settings(0, time_scale), prompt, self.output_len, c,
                                  prefix_share=self.prefix / prompt, throttle_mhz=self.throttle)

    def argv(self, port: int, seed: int) -> list[str]:
        out = [sys.executable, "-m", "cleanslate.sim", "serve", "--port", str(port),
               "--model-path", MODEL, "--enable-metrics", "--noise-seed", str(seed),
               "--time-scale", str(self.time_scale)]
        for key, value in self.flags.items():
            if value is True:
                out.append(f"--{key}")
            elif value is not False:
                out += [f"--{key}", str(value)]
        if self.throttle is not None:
            out += ["--fault", f"throttle-clock={self.throttle}"]
        return out


SHORT = {"input_len": 64, "output_len": 16}
#: The grid: 20 configurations, 65 cells. Each varies one or two flags of the sim (cap,
#: memory fraction, CUDA-graph size, chunk, CUDA graphs off, tp, lengths, a shared prefix, the
#: throttle fault); the levels are chosen off the truth's boundaries (``--truth`` prints each
#: cell's truth and whether it is ``borderline``: none is).
GRID: tuple[Config, ...] = (
    Config("cap64", {"max-running-requests": 64}, **SHORT, levels=(4, 16, 256)),
    Config("cap32-eager", {"max-running-requests": 32, "disable-cuda-graph": True}, **SHORT,
           levels=(2, 8, 128, 512)),
    Config("cap128-bs128", {"max-running-requests": 128, "cuda-graph-max-bs": 128}, **SHORT,
           levels=(8, 32, 256)),
    Config("cap16-tp2", {"max-running-requests": 16, "tp-size": 2}, **SHORT,
           levels=(1, 4, 64, 256)),
    Config("cap48-long", {"max-running-requests": 48}, 512, 32, levels=(4, 128, 256)),
    Config("long-out", {"max-running-requests": 64, "cuda-graph-max-bs": 64}, 128, 48,
           levels=(2, 8, 128)),
    Config("mem-tiny", {"mem-fraction-static": 0.57, "max-running-requests": 256}, 512, 64,
           levels=(2, 8, 32, 64)),
    Config("mem-small-long", {"mem-fraction-static": 0.6, "max-running-requests": 128},
           2048, 32, levels=(1, 2, 32, 64)),
    Config("mem-mid", {"mem-fraction-static": 0.65, "max-running-requests": 256}, 1024, 32,
           levels=(2, 96, 192)),
    Config("kv-tp2", {"mem-fraction-static": 0.35, "tp-size": 2, "max-running-requests": 128},
           1024, 32, levels=(1, 4, 96)),
    Config("graph-crash", {"max-running-requests": 256, "cuda-graph-max-bs": 32}, **SHORT,
           levels=(4, 16, 128)),
    Config("graph-crash-default", {}, **SHORT, levels=(8, 32, 256)),
    Config("prefill-heavy", {"max-running-requests": 128, "chunked-prefill-size": 2048},
           2048, 16, levels=(8, 16, 32, 48)),
    Config("prefill-heavy-tp2", {"tp-size": 2, "max-running-requests": 128}, 4096, 16,
           levels=(8, 48, 96)),
    Config("chunk1024", {"max-running-requests": 128, "chunked-prefill-size": 1024}, 1024, 16,
           levels=(1, 16, 32, 64)),
    Config("eager-compute", {"disable-cuda-graph": True, "max-running-requests": 256}, 1536,
           16, levels=(1, 2, 16, 64)),
    Config("prefix-shared", {"max-running-requests": 32}, 64, 16, prefix=2048,
           levels=(4, 16, 256)),
    Config("throttle-cap", {"max-running-requests": 32}, **SHORT, throttle=900,
           levels=(4, 128, 512)),
    Config("throttle-open", {"max-running-requests": 128, "cuda-graph-max-bs": 128}, **SHORT,
           throttle=700, levels=(4, 32)),
    Config("throttle-kv", {"mem-fraction-static": 0.57, "max-running-requests": 256}, 512, 64,
           throttle=1200, levels=(4, 32)),
)
#: The CI subset (``tests/bench/test_diagnosis_sim.py``): one cell per verdict the engine's
#: metrics make clear, and the throttle.
QUICK: tuple[Config, ...] = (
    Config("cap64", {"max-running-requests": 64}, **SHORT, levels=(2, 8, 256)),
    Config("mem-tiny", {"mem-fraction-static": 0.57, "max-running-requests": 256}, 512, 16,
           levels=(32,)),
    Config("graph-crash", {"max-running-requests": 256, "cuda-graph-max-bs": 32}, **SHORT,
           levels=(128,)),
    Config("throttle-cap", {"max-running-requests": 32}, **SHORT, throttle=900,
           levels=(96,)),
)


class Server:
    """One sim server started by this script, in the script's ledger, ended by its PID."""

    def __init__(self, config: Config, seed: int, ledger: str, log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": ledger,
               "CLEANSLATE_RUN": f"diagnosis-{uuid.uuid4().hex[:12]}"}
        self._log = open(log, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(config.argv(self.port, seed), env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        self.tp = int(config.flags.get("tp-size", 1))  # type: ignore[call-overload]

    def wait_ready(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the sim exited {self.proc.returncode} before it was ready")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the sim was not ready in 30 s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cell:
    config: str
    seed: int
    concurrency: int
    truth: str
    beneath: str
    borderline: str | None
    verdict: str
    confidence: str
    also: tuple[str, ...]
    rule: str
    evidence: tuple[str, ...]
    missing: tuple[str, ...]
    truth_reason: str
    figures: dict[str, float] = field(default_factory=dict)
    #: what the level measured and the observers saw (for reading a wrong verdict)
    observed: dict[str, float | None] = field(default_factory=dict)

    @property
    def correct(self) -> bool:
        if self.verdict == self.truth:
            return True
        return (self.truth == "throttled" and self.verdict == self.beneath
                and "throttled" in self.also)


def verdict_of(level: LevelResult, before: list[LevelResult], config: ServerConfig | None,
               workload: RandomWorkload) -> Bottleneck:
    """The verdict as ``run_benchmark`` gives it over a run of these levels: from the levels
    before, the configuration in effect and the workload (each level here is a run of its
    own, so the one ``run_benchmark`` set saw no level before it)."""
    return diagnose(level, before, config, "sim", workload=workload)


def observed(level: LevelResult) -> dict[str, float | None]:
    """The level's figures a verdict reads: throughput, median TPOT, the engine's running,
    waiting and KV usage, and the GPUs' mean SM clock."""
    m = level.server_metrics
    out: dict[str, float | None] = {
        "output_tok_s": round(level.output_throughput, 1), "tpot_ms_p50": level.tpot_ms.median,
        "completed": level.completed, "failed": level.failed}
    if m is not None:
        for key in ("running", "waiting", "kv_usage"):
            gauge = getattr(m, key)
            out[f"{key}_mean"] = None if gauge is None else round(gauge.mean, 3)
            out[f"{key}_max"] = None if gauge is None else gauge.max
        out["preemptions"] = m.preemptions
    for g in level.gpu or ():
        out[f"gpu{g.index}_sm_clock_mhz"] = None if g.sm_clock_mhz is None else g.sm_clock_mhz.mean
        out[f"gpu{g.index}_util_pct"] = (None if g.utilization_pct is None
                                         else g.utilization_pct.mean)
    return out


def run_config(config: Config, seed: int, ledger: str, tmp: Path,
               keep: list[dict[str, Any]] | None = None) -> list[Cell]:
    """Start the configuration's server, benchmark its levels, judge each against the truth.
    ``keep``: receives the levels' full results and the configuration in effect."""
    log = tmp / f"{config.name}-{seed}.log"
    server = Server(config, seed, ledger, log)
    try:
        server.wait_ready()
        workload = RandomWorkload(input_len=config.input_len, output_len=config.output_len,
                                  prefix_len=config.prefix)
        observe = ObserveOptions(interval_s=OBSERVE_S, engine="sim",
                                 gpus=tuple(range(server.tp)), gpu_source="sim")
        results: list[LevelResult] = []
        server_config = None
        for c in config.levels:
            bench = BenchConfig(url=server.url, model=MODEL, workload=workload,
                                num_prompts=config.prompts(c), loads=(ClosedLoop(concurrency=c),),
                                seed=seed, observe=observe)
            one = asyncio.run(run_benchmark(bench))
            server_config = server_config or one.server_config
            results += one.levels
            if any(lv.partial for lv in one.levels):
                break  # the server is gone, as the runner stops after a partial level
    finally:
        server.stop()
    if keep is not None:
        keep.append({"config": config.name, "seed": seed,
                     "server_config": server_config.model_dump(mode="json")
                     if server_config is not None else None,
                     "levels": [lv.model_dump(mode="json") for lv in results]})
    cells = []
    for i, level in enumerate(results):
        c = config.levels[i]
        truth = config.truth(c)
        b = verdict_of(level, results[:i], server_config, workload)
        cells.append(Cell(config.name, seed, c, truth.verdict, truth.beneath, truth.borderline,
                          b.verdict, b.confidence, tuple(b.also), b.rule, tuple(b.evidence),
                          tuple(b.missing), truth.reason, dict(b.figures), observed(level)))
    for c in config.levels[len(results):]:
        # not run: a level before it ended the server (a crash), as the runner does
        truth = config.truth(c)
        cells.append(Cell(config.name, seed, c, truth.verdict, truth.beneath, truth.borderline,
                          "not run", "-", (), "-", ("a level before it ended the run",), (),
                          truth.reason))
    return cells


def tally(cells: list[Cell]) -> dict[str, Any]:
    judged = [c for c in cells if c.verdict != "not run"]
    clear = [c for c in judged if c.confidence == "clear"]
    unknown = [c for c in judged if c.verdict == "unknown"]
    confused = [c for c in clear if {c.truth, c.verdict} in (
        {"running_cap", "compute"}, {"running_cap", "kv_capacity"})]
    matrix: dict[str, dict[str, int]] = collections.defaultdict(collections.Counter)
    for c in judged:
        matrix[c.truth][f"{c.verdict} ({c.confidence})"] += 1
    return {
        "cells": len(judged), "not_run": len(cells) - len(judged),
        "clear": len(clear), "clear_correct": sum(c.correct for c in clear),
        "clear_accuracy": (sum(c.correct for c in clear) / len(clear)) if clear else None,
        "correct": sum(c.correct for c in judged),
        "confused_cap": len(confused), "unknown": len(unknown),
        "unknown_share": len(unknown) / len(judged) if judged else None,
        "borderline": sum(c.borderline is not None for c in judged),
        "matrix": {k: dict(v) for k, v in sorted(matrix.items())},
    }


def matrix_lines(cells: list[Cell]) -> list[str]:
    """The confusion matrix as a Markdown table: truth rows, verdict columns (clear / other)."""
    judged = [c for c in cells if c.verdict != "not run"]
    verdicts = sorted({c.verdict for c in judged})
    truths = sorted({c.truth for c in judged})
    head = "| truth \\ verdict | " + " | ".join(verdicts) + " | cells |"
    lines = [head, "|" + "---|" * (len(verdicts) + 2)]
    for t in truths:
        row = [c for c in judged if c.truth == t]
        parts = []
        for v in verdicts:
            clear = sum(c.verdict == v and c.confidence == "clear" for c in row)
            other = sum(c.verdict == v and c.confidence != "clear" for c in row)
            parts.append("" if clear + other == 0 else f"{clear} / {other}")
        lines.append(f"| {t} | " + " | ".join(parts) + f" | {len(row)} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--quick", action="store_true", help="the CI subset (one seed)")
    ap.add_argument("--only", nargs="+", default=None, help="configurations by name")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--truth", action="store_true", help="print each cell's truth and exit")
    ap.add_argument("--levels-out", default=None,
                    help="write every level's full result here (JSON Lines; for reading a "
                    "wrong verdict again)")
    args = ap.parse_args()
    if args.truth:
        for config in QUICK if args.quick else GRID:
            print(f"{config.name}: time scale {config.time_scale}")
            for c in config.levels:
                t = config.truth(c)
                print(f"{config.name:<20} c={c:<4} {t.verdict:<13} batch {t.batch:<4} cap "
                      f"{t.running_cap:<4} kv {t.kv_limit:<5} admit {t.kv_admit_limit:<5} graph "
                      f"{t.graph_max_bs:<4} sat {t.saturation_batch:<4} gain "
                      f"{t.marginal_gain:.2f}" + (f"  BORDERLINE {t.borderline}"
                                                   if t.borderline else ""))
        print(f"{sum(len(c.levels) for c in GRID)} cells")
        return 0
    reexec_isolated("CLEANSLATE_BENCH_DIAGNOSIS_ISOLATED", "benchmarks/diagnosis.py")
    grid = QUICK if args.quick else GRID
    if args.only:
        grid = tuple(c for c in grid if c.name in args.only)
    seeds = args.seeds[:1] if args.quick else args.seeds
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    t0 = time.monotonic()
    cells: list[Cell] = []
    kept: list[dict[str, Any]] | None = [] if args.levels_out else None
    with tempfile.TemporaryDirectory(prefix="cleanslate-diagnosis-") as tmp:
        ledger = os.path.join(tmp, "gpus")
        os.mkdir(ledger)
        os.environ["CLEANSLATE_SIM_GPU_DIR"] = ledger
        for seed in seeds:
            for config in grid:
                t1 = time.monotonic()
                got = run_config(config, seed, ledger, Path(tmp), kept)
                cells += got
                print(f"seed {seed} {config.name:<20} " + "  ".join(
                    f"c={c.concurrency}: {c.verdict}/{c.confidence}"
                    f"{'' if c.correct else ' != ' + c.truth}" for c in got)
                    + f"  ({time.monotonic() - t1:.1f} s)", flush=True)
    total = tally(cells)
    print()
    print("\n".join(matrix_lines(cells)))
    print()
    acc = total["clear_accuracy"]
    print(f"cells {total['cells']} (+{total['not_run']} not run after a crash), "
          f"{time.monotonic() - t0:.0f} s; clear verdicts {total['clear']}, correct "
          f"{total['clear_correct']} ({'-' if acc is None else f'{acc:.1%}'}); all correct "
          f"{total['correct']}; clear running_cap/compute/kv confusions {total['confused_cap']}; "
          f"unknown {total['unknown']} ({(total['unknown_share'] or 0):.1%}); borderline truth "
          f"{total['borderline']}")
    for cell in (c for c in cells if c.verdict != "not run" and not c.correct):
        print(f"  {cell.config} seed {cell.seed} c={cell.concurrency}: truth {cell.truth} "
              f"({cell.truth_reason}); verdict {cell.verdict} ({cell.confidence}, rule "
              f"{cell.rule}, also {list(cell.also)}): {' | '.join(cell.evidence[:2])}"
              + (f"; missing {list(cell.missing)}" if cell.missing else "")
              + "; observed " + ", ".join(f"{k} {v:.4g}" for k, v in cell.observed.items()
                                          if isinstance(v, int | float)))
    if args.levels_out and kept is not None:
        Path(args.levels_out).write_text("".join(json.dumps(k) + "\n" for k in kept))
    if args.json:
        out = {"date": started.isoformat(timespec="seconds"), "seeds": seeds,
               "level_s": LEVEL_S, "observe_s": OBSERVE_S,
               "seconds": round(time.monotonic() - t0, 1),
               "load_before": load_before, "load_after": os.getloadavg(),
               "commit": _commit(), "totals": total, "matrix_md": matrix_lines(cells),
               "cells": [c.__dict__ | {"correct": c.correct} for c in cells]}
        Path(args.json).write_text(json.dumps(out, indent=1, default=list) + "\n")
    return 0


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
