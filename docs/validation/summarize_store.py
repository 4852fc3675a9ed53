"""Print the tables of docs/validation/h200-transformers.md from a study's SQLite store.

    python docs/validation/summarize_store.py STORE.db [STUDY]

Reads ``cs_trials`` (params, status, cause, levels) and ``cs_runs`` (teardown reports): output
tokens/s per concurrency level, the best level, and the kill-to-CLEAN times.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from typing import Any


def _levels(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {lv.get("label", "?"): lv for lv in data.get("levels") or []}


def main(path: str, study: str = "h200-transformers") -> None:
    db = sqlite3.connect(path)
    trials = [(n, s, json.loads(d)) for n, s, d in db.execute(
        "select number, status, data from cs_trials where study = ? order by number", (study,))]
    runs = {rid: json.loads(d) for rid, d in db.execute(
        "select id, data from cs_runs where study = ?", (study,))}
    labels: list[str] = []
    for _, _, d in trials:
        for label in _levels(d):
            if label not in labels:
                labels.append(label)
    labels.sort(key=lambda x: int(x.split("=")[1]) if "=" in x else 0)
    head = ["#", "continuous-batching", "cb-use-cuda-graph", "cb-max-memory-percent",
            "status (cause)", *[f"out tok/s {lb}" for lb in labels], "best level",
            "ready s", "verdict before/after"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n, status, d in trials:
        p = d.get("params", {})
        lv = _levels(d)
        verdicts = d.get("level_verdicts") or {}
        cells = []
        for label in labels:
            if label not in lv:
                cells.append("-")
                continue
            x = lv[label]
            v = verdicts.get(label, "")
            mark = "" if v in ("ok", "") else f" ({v})"
            cells.append(f"{x.get('output_throughput', 0):,.0f}{mark}")
        cause = f" ({d.get('cause')})" if d.get("cause") else ""
        phases = d.get("phases") or {}
        print(f"| {n} | {p.get('continuous-batching')} | {p.get('cb-use-cuda-graph')} | "
              f"{p.get('cb-max-memory-percent')} | {status}{cause} | " + " | ".join(cells)
              + f" | {d.get('best_level') or '-'} | {phases.get('ready_s', '-')} | "
              f"{d.get('verdict_before')}/{d.get('verdict_after')} |")
    print()
    print("| trial | run | signals (at s) | engine exited s | teardown s | CLEAN after s "
          "(until-clean) | probes |")
    print("|---|---|---|---|---|---|---|")
    for n, _, d in trials:
        run = runs.get(d.get("run_id") or "", {})
        td = run.get("teardown") or {}
        rounds = ", ".join(f"{r['signal']}@{r['at_s']}s" for r in td.get("rounds", []))
        after = (td.get("verify") or run.get("verdict_after") or {})
        uc = after.get("until_clean") or {}
        print(f"| {n} | {d.get('run_id')} | {rounds or '-'} | {td.get('root_exit_s', '-')} | "
              f"{td.get('elapsed_s', '-')} | {uc.get('clean_after_s', '-')} | "
              f"{uc.get('attempts', '-')} |")
    for n, _, d in trials:
        if d.get("detail"):
            print(f"\ntrial {n}: {d.get('cause')}: {d.get('detail')[:300]}")


if __name__ == "__main__":
    main(*sys.argv[1:])
