"""Reports of stores that hold secrets (written before the store redacted) or hostile text: no
secret in any output, text printed as text, HTML escaped; bad output paths are input errors."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from cleanslate.store import Store
from cleanslate.store._tables import RunRow, StudyRow, TrialRow
from tests.report.conftest import DATA, StudyStore
from tests.store.documents import check_report, finding

SECRETS = ("hf_oldsecret123", "sk-old-abcdef9876", "pgold-pass-55", "other-server-key-1",
           "bearer-old-tok-2")


def _with_secrets(entry: dict[str, Any]) -> dict[str, Any]:
    """A recorded study (data/stores.json) with secrets where today's main kept them."""
    entry = copy.deepcopy(entry)
    spec = entry["study"]["spec"]
    spec["env"] = {"HF_TOKEN": "hf_oldsecret123",
                   "DATABASE_URL": "postgresql://u:pgold-pass-55@db/x"}
    spec["fixed"] = {**spec.get("fixed", {}), "api-key": "sk-old-abcdef9876"}
    for trial in entry["trials"]:
        trial["flags"] = {**trial.get("flags", {}), "api-key": "sk-old-abcdef9876"}
        trial["argv"] = [*trial.get("argv", []), "--api-key", "sk-old-abcdef9876"]
        trial["detail"] = "server said: HF_TOKEN=hf_oldsecret123 is not valid"
        trial["log_tail"] = ("non-default args: {'api_key': ['sk-old-abcdef9876']}\n"
                             "Authorization: Bearer bearer-old-tok-2\n")
        trial["findings_after"] = [finding("python x.py --api-key other-server-key-1")]
    for run in entry["runs"]:
        run["env"] = {**run.get("env", {}), "HF_TOKEN": "hf_oldsecret123"}
        run["argv"] = [*run["argv"], "--api-key", "sk-old-abcdef9876"]
        run["log_tail"] = "token hf_oldsecret123 accepted"
        doc = run.get("verdict_after") or check_report("dirty")
        doc["hosts"][0]["findings"].append(finding(
            "stray `python other.py --api-key other-server-key-1`",
            evidence={"cmdline": ["python", "other.py", "--api-key", "other-server-key-1"]}))
        run["verdict_after"] = doc
    return entry


@pytest.fixture(scope="module")
def old_store(tmp_path_factory: pytest.TempPathFactory) -> StudyStore:
    """The recorded studies written as raw rows (what today's main stored), with secrets."""
    folder = tmp_path_factory.mktemp("old")
    url = f"sqlite:///{folder / 'cleanslate.db'}"
    store = Store(url)
    names = []
    with Session(store.engine) as session, session.begin():
        for raw in json.loads(DATA.read_text())["studies"]:
            entry = _with_secrets(raw)
            study = entry["study"]
            session.add(StudyRow(name=study["name"], spec=study["spec"], status=study["status"],
                                 created_at=study["created_at"], updated_at=study["updated_at"],
                                 elapsed_s=study.get("elapsed_s") or 0.0))
            for trial in entry["trials"]:
                session.add(TrialRow(study=trial["study"], number=trial["number"],
                                     status=trial["status"], data={**trial, "id": None},
                                     started_at=trial["started_at"], updated_at=1.0))
            for run in entry["runs"]:
                session.add(RunRow(id=run["id"], host=run["host"], engine=run["engine"],
                                   model=run["model"], status=run["status"], data=run,
                                   started_at=run["started_at"], updated_at=1.0,
                                   study=run.get("study"), trial=run.get("trial")))
            names.append(study["name"])
    store.close()
    raw = (folder / "cleanslate.db").read_bytes()
    assert all(s.encode() in raw for s in SECRETS)  # the store really holds them
    return StudyStore(folder, url, tuple(names))


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


def test_every_report_output_of_an_old_store_is_redacted(cli: Any, old_store: StudyStore,
                                                         tmp_path: Path) -> None:
    first, second = old_store.studies[:2]
    page = tmp_path / "page.html"
    done = cli("report", first, "--store", old_store.url, "--compare", second,
               "--html", str(page), timeout=180)
    assert done.returncode == 0, done.stderr
    _assert_no_secret(done.stdout + done.stderr)
    html = page.read_text()
    assert "--api-key ***" in html
    _assert_no_secret(html)
    for fmt in ("json", "csv"):
        done = cli("report", first, "--store", old_store.url, "--compare", second,
                   "--format", fmt)
        assert done.returncode == 0, done.stderr
        _assert_no_secret(done.stdout + done.stderr)
    assert '"HF_TOKEN": "***"' in done.stdout or fmt == "csv"


HOSTILE = {
    "name": "evil[/x]<script>alert(1)</script>$\\frac$",
    "factor": "max[/b]-seqs<blink>",
    "value": "[bold red]boom[/]$\\x$<marquee>",
    "cause": "crash[/]<img src=x onerror=alert(2)>",
    "model": "[link=http://x]m[/link]</td>",
}


@pytest.fixture(scope="module")
def hostile_store(tmp_path_factory: pytest.TempPathFactory) -> StudyStore:
    """A study whose names, values, causes and model hold rich markup, HTML and math text."""
    from cleanslate.store import TrialRecord

    folder = tmp_path_factory.mktemp("hostile")
    url = f"sqlite:///{folder / 'cleanslate.db'}"
    recorded = json.loads(DATA.read_text())["studies"][0]
    levels = recorded["trials"][0]["levels"]
    verdicts = recorded["trials"][0]["level_verdicts"]
    store = Store(url)
    spec = {"name": HOSTILE["name"], "engine": "sim", "model": HOSTILE["model"],
            "strategy": "ablation", "baseline": {HOSTILE["factor"]: 1},
            "space": {HOSTILE["factor"]: [1, HOSTILE["value"]]},
            "objective": {"maximize": "output_throughput"}, "concurrency": [8, 32]}
    store.save_study(HOSTILE["name"], spec, "finished")
    best = max(lv["output_throughput"] for lv in levels)
    store.save_trial(TrialRecord(study=HOSTILE["name"], number=0, params={HOSTILE["factor"]: 1},
                                 status="feasible", value=best, levels=tuple(levels),
                                 best_level=next(lv["label"] for lv in levels
                                                 if lv["output_throughput"] == best),
                                 level_verdicts=verdicts,
                                 argv=("srv", f"--{HOSTILE['factor']}", "1")))
    store.save_trial(TrialRecord(study=HOSTILE["name"], number=1,
                                 params={HOSTILE["factor"]: HOSTILE["value"]},
                                 status="infeasible", cause=HOSTILE["cause"],
                                 detail=HOSTILE["cause"], levels=tuple(levels[:1]),
                                 level_verdicts={levels[0]["label"]: "crashed"},
                                 log_tail=HOSTILE["value"] + "\n" + HOSTILE["cause"]))
    store.close()
    return StudyStore(folder, url, (HOSTILE["name"],))


def test_hostile_text_is_printed_as_text_and_escaped(cli: Any, hostile_store: StudyStore,
                                                     tmp_path: Path) -> None:
    page, pngs = tmp_path / "page.html", tmp_path / "png"
    done = cli("report", HOSTILE["name"], "--store", hostile_store.url, "--html", str(page),
               "--png", str(pngs), env={"COLUMNS": "400"}, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    out = done.stdout
    for text in (HOSTILE["name"], HOSTILE["value"], HOSTILE["factor"]):
        assert text in out, text
    assert "crash[/]" in out
    html = page.read_text()
    for needle in ("<script>alert", "<img src=x", "<marquee>", "<blink>", "</td>m"):
        assert needle not in html, needle
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "[bold red]boom[/]$\\x$&lt;marquee&gt;" in html
    assert sorted(p.name for p in pngs.iterdir()) == ["ablation.png", "pareto.png",
                                                      "throughput.png"]


# -- bad outputs ----------------------------------------------------------------------------------


def _read_only_folder(tmp_path: Path) -> Path:
    """A folder this user cannot write to: /proc for root (no file can be created there),
    else a folder with mode 0500."""
    if os.geteuid() == 0:
        return Path("/proc")
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    return folder


@pytest.mark.parametrize("case", ["html is a folder", "html under a file", "html read-only",
                                  "png is a file", "png read-only", "out is a folder",
                                  "out read-only"])
def test_unwritable_outputs_exit_2_naming_the_option(cli: Any, recorded_store: StudyStore,
                                                     tmp_path: Path, case: str) -> None:
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    folder = tmp_path / "folder"
    folder.mkdir()
    ro = _read_only_folder(tmp_path)
    option, path = {
        "html is a folder": ("--html", folder),
        "html under a file": ("--html", a_file / "page.html"),
        "html read-only": ("--html", ro / "cleanslate-test-page.html"),
        "png is a file": ("--png", a_file),
        "png read-only": ("--png", ro / "cleanslate-test-pngs"),
        "out is a folder": ("--out", folder),
        "out read-only": ("--out", ro / "cleanslate-test.json"),
    }[case]
    extra = ["--format", "json"] if option == "--out" else []
    done = cli("report", "quickstart", "--store", recorded_store.url, option, str(path), *extra)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"{option}:" in done.stderr and str(path) in done.stderr, done.stderr


def test_unknown_format_and_study(cli: Any, recorded_store: StudyStore) -> None:
    done = cli("report", "quickstart", "--store", recorded_store.url, "--format", "xml")
    assert done.returncode == 2 and "--format" in done.stderr
    done = cli("report", "nope[/x]", "--store", recorded_store.url)
    assert done.returncode == 2 and "no study 'nope[/x]'" in done.stderr
