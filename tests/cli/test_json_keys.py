"""The keys of every ``--json`` document stay as they were recorded (the command line is a
contract: fields may be added, never renamed or dropped silently).

The documents of ``check``, ``serve --detach``, ``stop``, ``bench``, ``bench --find-max`` and
``tune`` on the sim engine are reduced to their key paths (``hosts[].findings[].kind``); maps
whose keys are data (flags, phases, error kinds) count as one ``{*}``. ``data/json_keys.json``
holds the paths as recorded; a change of keys fails here until the file is rewritten on purpose
with ``CLEANSLATE_RECORD_JSON_KEYS=1``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests._kit import OMIT, free_port, study_yaml
from tests.conftest import run_cli

pytestmark = pytest.mark.slow

RECORDED = Path(__file__).parent / "data" / "json_keys.json"

#: Maps whose keys are values (a flag name, a phase, an error kind), not fields.
FREE_FORM = {"phases", "flags", "params", "env", "errors", "level_verdicts", "evidence",
             "error_details", "best_params", "spec", "fixed", "space", "baseline", "slo",
             "workload", "extra_body", "headers", "held", "by_kind", "errors_by_kind",
             "limit_counts", "limits", "host_effects", "slo_checks", "requested", "in_effect",
             "sources", "figures", "clock_events"}


def key_paths(doc: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(doc, dict):
        for key, value in doc.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out.add(path)
            if key in FREE_FORM and isinstance(value, dict):
                out.add(path + ".{*}")
                continue
            out |= key_paths(value, path)
    elif isinstance(doc, list):
        for item in doc:
            out |= key_paths(item, prefix + "[]")
    return out


def documents(tmp_path: Path) -> dict[str, Any]:
    env = {"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}
    (tmp_path / "gpus").mkdir()
    store = f"sqlite:///{tmp_path}/cs.db"
    docs: dict[str, Any] = {}
    port = free_port()
    served = run_cli("serve", "--engine", "sim", "--model", "sim", "--port", str(port),
                     "--store", store, "--detach", "--json", "--ready-timeout", "60", "--",
                     "--tp-size", "1", env=env, timeout=120)
    assert served.returncode == 0, served.stdout + served.stderr
    docs["serve"] = served.json()
    run_id = docs["serve"]["run_id"]
    try:
        # Checked while the server runs: findings and GPU processes exist, so every field of
        # theirs is in the document.
        check = run_cli("check", "--gpu-backend", "sim", "--json", env=env)
        assert check.returncode == 1, check.stdout + check.stderr
        docs["check"] = check.json()
        bench = run_cli("bench", "--url", f"http://127.0.0.1:{port}", "--model", "sim",
                        "--concurrency", "2", "--num-prompts", "4", "--json", "-", "--no-live",
                        env=env, timeout=120)
        assert bench.returncode == 0, bench.stdout + bench.stderr
        docs["bench"] = bench.json()
        # A capacity search's document (issue 25) on the same server: a generous SLO, so both
        # probes pass and the search stops at its top load.
        found = run_cli("bench", "--url", f"http://127.0.0.1:{port}", "--model", "sim",
                        "--find-max", "concurrency", "--slo", "median_tpot_ms=100000",
                        "--start", "1", "--max-load", "2", "--num-prompts", "4", "--warmup", "1",
                        "--json", "-", "--no-live", env=env, timeout=120)
        assert found.returncode == 0, found.stdout + found.stderr
        docs["bench_find_max"] = found.json()
    finally:
        stopped = run_cli("stop", run_id, "--store", store, "--json", "--gpu-backend", "sim",
                          env=env, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    docs["stop"] = stopped.json()
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml(name="keys", requests_per_level=OMIT, duration_s_per_level=1))
    tuned = run_cli("tune", str(study), "--store", store, "--json", env=env, timeout=300)
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    docs["tune"] = tuned.json()
    return docs


def test_json_documents_keep_their_keys(tmp_path: Path) -> None:
    now = {name: sorted(key_paths(doc)) for name, doc in documents(tmp_path).items()}
    if os.environ.get("CLEANSLATE_RECORD_JSON_KEYS") == "1":
        RECORDED.parent.mkdir(exist_ok=True)
        RECORDED.write_text(json.dumps(now, indent=1) + "\n")
    recorded = json.loads(RECORDED.read_text())
    for name, paths in recorded.items():
        missing = sorted(set(paths) - set(now[name]))
        added = sorted(set(now[name]) - set(paths))
        assert not missing and not added, f"{name}: missing {missing}, added {added}"
