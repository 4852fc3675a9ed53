"""Regenerate ``benchmarks/RESULTS.md``: every benchmark's figure as a ratio against its anchor
measured in the same run (issue: performance).

    python benchmarks/results.py                  # run them all (about 40 minutes on 2 cores)
    python benchmarks/results.py --only teardown  # rerun one, keep the others' last results
    python benchmarks/results.py --render         # rewrite RESULTS.md from the saved results
    python benchmarks/results.py --adopt teardown=out.json  # a run made by hand with --json

Each benchmark is run as its own process with ``--json`` into ``benchmarks/results/NAME.json``
(kept, so that one part can be rerun); the page is then written from every saved result, each
with the date it was measured. Parts:

========== ======================================= ===========================================
name       figure                                  anchor (same run)
========== ======================================= ===========================================
client     tokens/s per busy client core           AIPerf and GuideLLM (and a bare aiohttp loop)
observe    tokens/s per busy core, observers on    the same client with its observers off
accuracy   throughput and TTFT p50 of each client  the sim server's own log (ground truth)
teardown   stop -> verified CLEAN                  the physical release (an independent poller)
search     launches to the optimum (guided)        TPE; random, ablation, full grid
check      ``check`` wall time and probe time      the seeds' one-liner, ``ps -eo``
overhead   the tool's seconds per trial            the engine's seconds in the same trial
selection  wrong winners, false differences, cost  single-shot selection on the same noise
capacity   the capacity search's boundary error    the sim's true boundary; a fixed level list
diagnosis  the bottleneck verdicts' accuracy       the sim's known truth (``binding_constraint``)
========== ======================================= ===========================================

A benchmark that fails is reported as such on the page (its last good result is not shown as
current). Peer clients are installed on demand into ``scratch/bench-peers`` (PyPI).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
SAVED = HERE / "results"
PAGE = HERE / "RESULTS.md"


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    argv: Callable[[Path, bool], list[str]]  # (json path, quick) -> argv
    render: Callable[[dict[str, Any]], list[str]]
    timeout_s: float = 2400.0
    gpu: bool = False  # needs an NVIDIA GPU: run only when one is here, or named by --only
    targets: Callable[[dict[str, Any]], list[tuple[str, bool | None]]] = lambda _d: []


def _py(script: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE / script), *args]


def _met(flag: object) -> str:
    if flag is None:
        return "no target"
    return "**met**" if flag else "**not met**"


# -- renderers: one Markdown block per part, from its JSON ------------------------------------


def render_client(data: dict[str, Any]) -> list[str]:
    lines = ["| concurrency | anchor | cleanslate tok/s per busy core | anchor tok/s per busy core "
             "| ratio (> 1: cleanslate cheaper) | tok/s (cleanslate, anchor) |",
             "|---|---|---|---|---|---|"]
    for r in data.get("ratios", []):
        lines.append(f"| {r['concurrency']} | {r['anchor']} | {r['ours_tok_s_per_core']:,} "
                     f"| {r['anchor_tok_s_per_core']:,} | {r['ratio']:.2f} "
                     f"| {r['ours_tok_s']:,}, {r['anchor_tok_s']:,} |")
    missing = {"aiperf", "guidellm"} - {r["anchor"] for r in data.get("ratios", [])}
    if missing:
        lines.append("")
        lines.append(f"Not measured in this run: {', '.join(sorted(missing))} (not installed).")
    itl = data.get("itl")
    if itl:
        lines += ["", f"ITL against the server's own gaps ({itl['gap_ms']:g} ms): server mean "
                  f"{itl['server_mean_ms']:.3f} ms, cleanslate {itl['client_mean_ms']:.3f} ms, "
                  f"error {itl['error_pct']:+.2f} %."]
    return lines


def targets_accuracy(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    return [("throughput within 5 % and TTFT p50 within 10 % of the peer client's",
             data.get("failures") == 0)]


def render_accuracy(data: dict[str, Any]) -> list[str]:
    lines = ["| concurrency | client | output tok/s (client / server) | error | TTFT p50 ms "
             "(client / server) | error | requests in flight (server) |",
             "|---|---|---|---|---|---|---|"]
    for r in data.get("rows", []):
        lines.append(f"| {r['concurrency']} | {r['client']} | {r['throughput']:,.0f} / "
                     f"{r['server_throughput']:,.0f} | {r['throughput_error_pct']:+.1f} % "
                     f"| {r['ttft_p50_ms']:.1f} / {r['server_ttft_p50_ms']:.1f} "
                     f"| {r['ttft_p50_error_pct']:+.1f} % | {r['in_flight']:.1f} |")
    lines += ["", "Target (issue 6): throughput within 5 % and TTFT p50 within 10 % of the "
              f"peers': {_met(data.get('failures') == 0)} ({data.get('failures', '?')} "
              "comparisons outside)."]
    return lines


def render_teardown(data: dict[str, Any]) -> list[str]:
    from teardown_latency import markdown

    target = data.get("target_gap_s", 0.1)
    lines = [*markdown(data.get("rows", [])), "",
             f"Target: median gap at most {target:g} s. The settle window (0.5 s by default; "
             "`docs/check.md`) is part of the gap by design; `--settle 0` shows the rest of the "
             "tool's cost."]
    return lines + [f"- {n}" for n in data.get("notes", [])] + profile_teardown(data)


def render_search(data: dict[str, Any]) -> list[str]:
    from search_efficiency import render

    return render(data)


def targets_teardown(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    target = data.get("target_gap_s", 0.1)
    return [(f"{r['case']}, settle {r['settle_s']:g} s: verified CLEAN within {target:g} s of the "
             f"release (median {r['gap_median_s']:.3f} s)", r["target_met"])
            for r in data.get("rows", [])]


def profile_teardown(data: dict[str, Any]) -> list[str]:
    """Where the gap goes, from the runs: the settle window's share (the gap with the default
    window minus the gap with none) and what is left."""
    rows = data.get("rows", [])
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows):
        by = {r["settle_s"]: r for r in rows if r["case"] == case}
        if 0.0 in by and len(by) > 1:
            window = max(by)
            cost = by[window]["gap_median_s"] - by[0.0]["gap_median_s"]
            rest = (f"{by[0.0]['gap_median_s']:.3f} s (the gap without a window) is the re-scan "
                    "that sees the last process gone (also the verification's reading), "
                    "recording the run and printing the report")
            if cost <= 0.01:
                lines.append(f"- {case}: the {window:g} s window cost nothing (the release "
                             f"outlasted it); {rest}")
            else:
                lines.append(f"- {case}: of the {by[window]['gap_median_s']:.3f} s gap with the "
                             f"{window:g} s window, about {cost:.3f} s is the window; {rest}")
    return (["", "Where the time goes:", *lines]) if lines else []


def _story(name: str) -> Callable[[dict[str, Any]], Any]:
    import guided_story

    found: Callable[[dict[str, Any]], Any] = getattr(guided_story, name)
    return found


def targets_search(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    from search_efficiency import results_targets

    return results_targets(data)


def targets_check(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    out: list[tuple[str, bool | None]] = []
    for r in data.get("rows", []):
        if "met" not in r:
            continue
        where = f"{r['procs']} extra processes" if r.get("procs") is not None else \
            f"{r.get('hosts')} SSH hosts"
        out.append((f"{r['what']} at {where}: {r['ratio']:.3g}x {r['anchor']} (target "
                    f"{r['target']})", bool(r["met"])))
    return out


def profile_check(data: dict[str, Any]) -> list[str]:
    """Of ``check`` as a process, how much is the check itself (its own ``elapsed_s``) and how
    much the interpreter's start and imports."""
    rows = data.get("rows", [])
    lines = []
    for r in rows:
        if r.get("what") != "check (process)":
            continue
        inner = next((x for x in rows if x.get("what") == "check elapsed_s"
                      and x.get("procs") == r.get("procs")), None)
        if inner is None:
            continue
        rest = r["p50_ms"] - inner["p50_ms"]
        lines.append(f"- {r['procs']} extra processes: {r['p50_ms']:.0f} ms in all, of which the "
                     f"check itself {inner['p50_ms']:.0f} ms ({inner['ratio']:.2g}x the one-liner)"
                     f" and {rest:.0f} ms starting Python and importing the command")
    return (["", "Where the time goes (p50):", *lines]) if lines else []


def render_check(data: dict[str, Any]) -> list[str]:
    rows = data.get("rows", [])
    if not rows:
        return ["(no rows)"]
    keys = [k for k in ("what", "procs", "hosts", "p50_ms", "p95_ms", "p50", "p95", "anchor",
                        "anchor_p50_ms", "ratio", "target", "met") if any(k in r for r in rows)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = []
        for k in keys:
            v = r.get(k, "")
            if k == "met":
                v = _met(v) if v != "" else ""
            elif isinstance(v, float):
                v = f"{v:.3g}" if k == "ratio" else f"{v:.1f}"
            cells.append(str(v))
        lines.append("| " + " | ".join(cells) + " |")
    notes = data.get("notes") or []
    return lines + ([""] + [f"- {n}" for n in notes] if notes else []) + profile_check(data)


def render_overhead(data: dict[str, Any]) -> list[str]:
    from trial_overhead import table

    return [*table(data), "", f"Study `{data.get('study')}`, {data.get('wall_s')} s in all. "
            "Medians per trial; no target was set for this figure."]


def render_selection(data: dict[str, Any]) -> list[str]:
    from selection import render

    return render(data)


def targets_selection(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    from selection import results_targets

    return results_targets(data)


def render_capacity(data: dict[str, Any]) -> list[str]:
    from capacity import table

    total = data.get("totals", {})
    lines = table(data.get("rows", [])).splitlines()
    lines += ["", f"Within the tolerance (true boundary in [capacity x 0.9, upper x 1.1]): "
              f"{total.get('within')} of {total.get('seeds')}; mean |error| "
              f"{total.get('mean_abs_error_pct', float('nan')):.1f} % in "
              f"{total.get('mean_probes', float('nan')):.1f} probes, against the fixed list's "
              f"{total.get('fixed_mean_abs_error_pct', float('nan')):.1f} % in "
              f"{total.get('fixed_mean_probes', float('nan')):.1f} (one run; "
              "`docs/sim-model.md`, \"Capacity under an SLO\")."]
    return lines


def targets_capacity(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    total = data.get("totals", {})
    within, seeds = total.get("within"), total.get("seeds")
    if not isinstance(within, int) or not isinstance(seeds, int) or seeds == 0:
        return [("capacity search: boundary within the tolerance in 9 of 10 seeds", None)]
    return [(f"capacity search: boundary within the tolerance in at least 90 % of seeds "
             f"({within} of {seeds})", within >= 0.9 * seeds)]


def render_diagnosis(data: dict[str, Any]) -> list[str]:
    t = data.get("totals", {})
    acc = t.get("clear_accuracy")
    lines = [f"One run, seeds {', '.join(str(s) for s in data.get('seeds', []))} (each a new "
             f"sim server per configuration, `--noise-seed SEED`), {data.get('date', '?')}, "
             f"{data.get('seconds')} s, load average {float(data.get('load_before', [0])[0]):.1f} "
             "before. "
             "Rows: the truth (`cleanslate.sim.model.binding_constraint`); columns: the verdict, "
             "each cell `clear / likely or unknown` (`benchmarks/diagnosis.py`).", "",
             *data.get("matrix_md", []), "",
             f"Cells {t.get('cells')} ({t.get('not_run', 0)} not run after a crash); clear "
             f"verdicts {t.get('clear')}, correct {t.get('clear_correct')} "
             f"({'-' if acc is None else f'{acc:.1%}'}); every verdict correct "
             f"{t.get('correct')} of {t.get('cells')}; clear verdicts confusing running_cap with "
             f"compute or kv_capacity {t.get('confused_cap')}; unknown {t.get('unknown')} "
             f"({(t.get('unknown_share') or 0):.1%}); truth borderline {t.get('borderline')}."]
    wrong = [c for c in data.get("cells", []) if c.get("verdict") != "not run"
             and not c.get("correct")]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for c in wrong:
        groups.setdefault((c["config"], c["truth"], f"{c['verdict']} ({c['confidence']})"),
                          []).append(c)
    if groups:
        lines += ["", "Cells whose verdict is not the truth, by configuration (what the engine's "
                  "metrics showed: waiting / running, means over the steady window):", "",
                  "| configuration | truth | verdict | c (seeds) | waiting / running | rule: "
                  "evidence |", "|---|---|---|---|---|---|"]
        for (config, truth, verdict), cells in groups.items():
            where = ", ".join(f"{c['concurrency']} ({c['seed']})" for c in cells)
            ratios = [c["observed"]["waiting_mean"] / c["observed"]["running_mean"]
                      for c in cells if (c.get("observed") or {}).get("running_mean")]
            spread = (f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-")
            first = cells[0]
            why = "; ".join((first.get("evidence") or [])[:1] or first.get("missing") or [])
            lines.append(f"| {config} | {truth} | {verdict} | {where} | {spread} | "
                         f"{first['rule']}: {why} |")
    return lines


def targets_diagnosis(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    t = data.get("totals", {})
    acc, share, confused = t.get("clear_accuracy"), t.get("unknown_share"), t.get("confused_cap")
    return [(f"bottleneck verdicts: clear ones correct >= 95 % ({t.get('clear_correct')} of "
             f"{t.get('clear')})", None if acc is None else acc >= 0.95),
            (f"bottleneck verdicts: no clear one confusing running_cap with compute or "
             f"kv_capacity ({confused})", None if confused is None else confused == 0),
            (f"bottleneck verdicts: unknown <= 10 % ({t.get('unknown')} of {t.get('cells')})",
             None if share is None else share <= 0.10)]


def render_observe(data: dict[str, Any]) -> list[str]:
    lines = ["| pair | order | tok/s off | tok/s on | tok/s per busy core off "
             "| tok/s per busy core on | ratio on/off (per core) | scrapes on |",
             "|---|---|---|---|---|---|---|---|"]
    for i, pair in enumerate(data.get("pairs", []), 1):
        off, on = pair.get("off", {}), pair.get("on", {})
        ratio = pair.get("capacity_ratio")
        order = ("together" if str(data.get("method", "")).startswith("together")
                 else "off, on" if i % 2 else "on, off")
        lines.append(f"| {i} | {order} | {off.get('tok_s', 0):,} | "
                     f"{on.get('tok_s', 0):,} | {off.get('tok_s_per_core', 0):,} | "
                     f"{on.get('tok_s_per_core', 0):,} | "
                     f"{'-' if ratio is None else f'{ratio:.3f}'} | {on.get('scrapes', 0)} |")
    out = []
    for key, what in (("capacity_ratio", "tokens/s per busy client core"),
                      ("throughput_ratio", "tokens/s")):
        iv = data.get(key)
        if iv:
            band = (f" [{iv['low']:.3f}, {iv['high']:.3f}]" if iv.get("low") is not None
                    else "")
            out.append(f"{what} {iv['mean']:.3f}{band}")
    cost = data.get("scrape_cost", {})
    how = ("both clients at once on the client core from a start barrier, each with its own "
           "server, measured over their common window" if order == "together"
           else "order alternating") if data.get("pairs") else "order alternating"
    lines += ["", f"Observers on / off at c={data.get('concurrency')} ({data.get('requests')} "
              f"requests of {data.get('output_len')} tokens a run, fresh server each, {how}; "
              "on: the engine-metrics observer scraping the fake server's "
              f"`/metrics`, the real vLLM 0.32 capture `{data.get('metrics_file')}`, every "
              f"250 ms): {'; '.join(out)} (mean of the pairs' ratios, 95 % Student-t interval; "
              "one run). One scrape of that answer in the client: "
              f"{cost.get('cpu_ms_per_scrape', float('nan')):.2f} ms CPU, "
              f"{cost.get('wall_ms_per_scrape', float('nan')):.2f} ms wall, "
              f"{cost.get('cpu_share_pct', float('nan')):.2f} % of a core at 4 a second."]
    together = data.get("together")
    if together and together.get("capacity_ratio"):
        iv = together["capacity_ratio"]
        ratios = ", ".join(f"{p['capacity_ratio']:.3f}" for p in together.get("pairs", [])
                           if "capacity_ratio" in p)
        band = f" [{iv['low']:.3f}, {iv['high']:.3f}]" if iv.get("low") is not None else ""
        lines += ["", f"Together (`--together`, run right after: each pair's two clients at once "
                  "on the client core, each with its own server, tokens per CPU-second of the "
                  f"level as each client reports it): {iv['mean']:.3f}{band} over {iv['n']} "
                  f"pairs ({ratios})."]
    control = data.get("control") or {}
    if control.get("capacity_ratio"):
        iv = control["capacity_ratio"]
        lines += ["", f"Control (`--control-pairs`, right after: the same pairs with the "
                  f"observers off on both sides, the method's own bias): {iv['mean']:.3f} "
                  f"[{iv['low']:.3f}, {iv['high']:.3f}] over {iv['n']} pairs."]
    notes = data.get("notes") or []
    return lines + ([""] + [f"- {n}" for n in notes] if notes else [])


def targets_observe(data: dict[str, Any]) -> list[tuple[str, bool | None]]:
    rows: list[tuple[str, bool | None]] = []
    for run in (data, data.get("together") or {}):
        iv = run.get("capacity_ratio")
        if not iv:
            continue
        band = f" [{iv['low']:.3f}, {iv['high']:.3f}]" if iv.get("low") is not None else ""
        rows.append((f"observers on: client capacity at least 0.97x of off at "
                     f"c={run.get('concurrency')}, {run.get('method', 'interleaved')} "
                     f"(mean {iv['mean']:.3f}{band})", iv["mean"] >= 0.97))
    return rows or [("observers on: client capacity at least 0.97x of off at c=256", None)]


PARTS = [
    Part("client", "Client capacity against AIPerf and GuideLLM",
         lambda out, quick: _py("client_capacity.py", "--json", str(out), "--install-peers",
                                *(["--concurrency", "64", "--requests", "600"] if quick else [])),
         render_client),
    Part("observe", "Observers' cost: client capacity with them on and off",
         lambda out, quick: _py("client_capacity.py", "--json", str(out),
                                "--observe-side-by-side", "--together", "--concurrency",
                                "256", *(["--pairs", "3", "--control-pairs", "2",
                                          "--requests", "1000"] if quick
                                         else ["--pairs", "40", "--control-pairs", "20"])),
         render_observe, targets=targets_observe),
    Part("accuracy", "Metric error against the server's ground truth",
         lambda out, quick: _py("peer_crosscheck.py", "--json", str(out), "--peers", "aiperf",
                                *(["--concurrency", "16", "--requests", "150"] if quick else [])),
         render_accuracy, targets=targets_accuracy),
    Part("teardown", "Teardown: verified CLEAN against the physical release",
         lambda out, quick: _py("teardown_latency.py", "--json", str(out),
                                *(["--repeats", "3", "--real-repeats", "0"] if quick else [])),
         render_teardown, targets=targets_teardown),
    Part("teardown_gpu", "Teardown on a real GPU: transformers serve, NVML",
         lambda out, quick: _py("teardown_latency.py", "--json", str(out), "--no-sim",
                                "--real-repeats", "0", "--gpu",
                                *(["--gpu-repeats", "2"] if quick else [])),
         render_teardown, gpu=True, targets=targets_teardown),
    Part("search", "Search efficiency: launches to the optimum, guided against TPE",
         lambda out, quick: _py("search_efficiency.py", "--json", str(out),
                                *(["--seeds", "5"] if quick else [])),
         render_search, targets=targets_search),
    Part("guided_story", "The founding story, guided: the path and the sim's optimum",
         lambda out, quick: _py("guided_story.py", "--json", str(out)),
         lambda data: _story("render")(data), targets=lambda data: _story("results_targets")(data)),
    Part("check", "Check latency against ps and the seeds' one-liner",
         lambda out, quick: _py("check_latency.py", "--json", str(out), *(["--quick"] if quick
                                                                         else [])),
         render_check, targets=targets_check),
    Part("check_gpu", "Check latency on a GPU host (NVML)",
         lambda out, quick: _py("check_latency.py", "--json", str(out), "--gpu-backend", "nvml",
                                *(["--quick"] if quick else [])),
         render_check, gpu=True, targets=targets_check),
    Part("overhead", "Tool overhead per trial against engine time",
         lambda out, quick: _py("trial_overhead.py", "--json", str(out)), render_overhead),
    Part("selection", "Selection under noise: single-shot against noise-aware",
         lambda out, quick: _py("selection.py", "--json", str(out), "--sweep",
                                *(["--seeds", "5"] if quick else ["--seeds", "100",
                                                                  "--sweep-seeds", "30"])),
         render_selection, targets=targets_selection),
    Part("capacity", "Capacity under an SLO: the search against the sim's true boundary",
         lambda out, quick: _py("capacity.py", "--json", str(out),
                                *(["--seeds", "3"] if quick else [])),
         render_capacity, targets=targets_capacity),
    Part("diagnosis", "Bottleneck verdicts against the sim's known truth",
         lambda out, quick: _py("diagnosis.py", "--json", str(out),
                                *(["--seeds", "1"] if quick else [])),
         render_diagnosis, targets=targets_diagnosis),
]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 1024 / 1024:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return f"{os.cpu_count()} CPUs ({cpu}){mem}, Linux {platform.release()}, Python " \
           f"{platform.python_version()}"


def commit() -> str:
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_part(part: Part, quick: bool) -> None:
    SAVED.mkdir(exist_ok=True)
    out = SAVED / f"{part.name}.json"
    tmp = out.with_suffix(".new.json")
    tmp.unlink(missing_ok=True)
    started = time.monotonic()
    print(f"== {part.name}: {' '.join(part.argv(tmp, quick)[1:])}", flush=True)
    try:
        done = subprocess.run(part.argv(tmp, quick), cwd=REPO, timeout=part.timeout_s,
                              check=False, capture_output=True, text=True)
        code: int | str = done.returncode
        tail = (done.stdout + done.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        code, tail = "timeout", ""
    elapsed = round(time.monotonic() - started, 1)
    meta = {"measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
            "machine": machine(), "seconds": elapsed, "exit": code, "quick": quick}
    if tmp.exists():
        data = json.loads(tmp.read_text())
        tmp.unlink()
        out.write_text(json.dumps({"meta": meta, "data": data}, indent=1) + "\n")
        print(f"   done in {elapsed} s (exit {code})", flush=True)
    else:
        out.write_text(json.dumps({"meta": meta, "data": None, "error": tail}, indent=1) + "\n")
        print(f"   FAILED in {elapsed} s (exit {code}): {tail[-600:]}", flush=True)


def render() -> str:
    lines = ["# Benchmark results",
             "",
             "Written by `python benchmarks/results.py` from `benchmarks/results/*.json`; do not "
             "edit by hand. Every figure is set against an anchor measured in the same run of "
             "its benchmark, on the machine named in its section (these machines are shared and "
             "noisy: read ratios, not absolute times).",
             ""]
    summary: list[str] = []
    for part in PARTS:
        path = SAVED / f"{part.name}.json"
        saved = json.loads(path.read_text()) if path.exists() else None
        if saved is None or saved.get("data") is None:
            continue
        for what, met in part.targets(saved["data"]):
            summary.append(f"| {part.title} | {what} | {_met(met)} |")
    if summary:
        lines += ["## Targets", "", "| part | target | |", "|---|---|---|", *summary, ""]
    for part in PARTS:
        path = SAVED / f"{part.name}.json"
        lines += [f"## {part.title}", ""]
        if not path.exists():
            lines += ["Not measured yet.", ""]
            continue
        saved = json.loads(path.read_text())
        meta = saved["meta"]
        if meta.get("by_hand"):
            lines.append(f"Measured {meta['measured']} on {meta['machine']}, run by hand and "
                         f"adopted at commit {meta['commit']}.")
        else:
            lines.append(f"Measured {meta['measured']} at commit {meta['commit']} on "
                         f"{meta['machine']}; {meta['seconds']} s"
                         + (" (quick settings)" if meta.get("quick") else "") + ".")
        lines.append("")
        if saved.get("data") is None:
            lines += ["**The benchmark failed** (exit " + str(meta["exit"]) + "):", "", "```",
                      *str(saved.get("error", "")).splitlines()[-15:], "```", ""]
            continue
        lines += part.render(saved["data"])
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="",
                        help="comma-separated parts to run: " + ",".join(p.name for p in PARTS))
    parser.add_argument("--render", action="store_true", help="only rewrite RESULTS.md")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--adopt", action="append", default=[], metavar="NAME=FILE",
                        help="save the --json output of a benchmark run by hand as this part's "
                        "result (measured when the file was written, adopted at this commit)")
    parser.add_argument("--machine", default=None,
                        help="with --adopt: the machine it ran on (default: this one)")
    args = parser.parse_args()
    for item in args.adopt:
        name, _, file = item.partition("=")
        if name not in {p.name for p in PARTS} or not Path(file).is_file():
            print(f"results.py: --adopt {item!r}: give NAME=FILE with a part name and an "
                  "existing file", file=sys.stderr)
            return 2
        try:
            data = json.loads(Path(file).read_text())
        except ValueError as exc:
            print(f"results.py: --adopt {file}: not JSON ({exc})", file=sys.stderr)
            return 2
        SAVED.mkdir(exist_ok=True)
        about = data.get("machine") if isinstance(data, dict) else None
        stamp = about.get("date") if isinstance(about, dict) else None
        when = str(stamp)[:16].replace("T", " ") if stamp else time.strftime(
            "%Y-%m-%d %H:%M", time.gmtime(Path(file).stat().st_mtime))
        meta = {"measured": f"{when} UTC", "commit": commit(),
                "machine": args.machine or machine(),
                "seconds": None, "exit": 0, "quick": False, "by_hand": True}
        (SAVED / f"{name}.json").write_text(json.dumps({"meta": meta, "data": data}, indent=1)
                                            + "\n")
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - {p.name for p in PARTS}
    if unknown:
        print(f"results.py: --only: unknown part {sorted(unknown)[0]!r}; choose from "
              + ", ".join(p.name for p in PARTS), file=sys.stderr)
        return 2
    has_gpu = shutil.which("nvidia-smi") is not None
    # --adopt alone rewrites the page with what it adopted; it runs parts only with --only
    if not args.render and not (args.adopt and not names):
        for part in PARTS:
            if part.name in names or (not names and (has_gpu or not part.gpu)):
                run_part(part, args.quick)
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
