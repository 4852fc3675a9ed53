"""The namespaced test hosts themselves (:mod:`tests.fleet.hosts`): each host's check sees its
own processes and ledger only, a run on one host is seen there and nowhere else, the decoy makes
its host DIRTY and outlives a teardown on that host, and the fixture ends everything it started.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests._kit import free_port
from tests.conftest import recorded_rows
from tests.fleet.conftest import DECOY_HOST, MakeFleet
from tests.fleet.hosts import DECOY_TITLE, Decoy, Fleet, outer_pid

pytestmark = pytest.mark.slow


def check(fleet: Fleet, alias: str, *extra: str) -> tuple[int, dict[str, Any], float]:
    """``cleanslate check --host ALIAS --gpu-backend sim --json``: (exit, document, seconds)."""
    done = fleet.cli("check", "--host", alias, "--gpu-backend", "sim", "--json", *extra,
                     timeout=90)
    try:
        doc = done.json()
    except ValueError:
        pytest.fail(f"not JSON (exit {done.returncode}): {done.stdout!r} {done.stderr}")
    return done.returncode, doc, done.elapsed_s


def errors(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for host in doc["hosts"] for f in host["findings"] if f["severity"] == "error"]


def gpu_used(doc: dict[str, Any]) -> dict[int, int]:
    """GPU index -> MiB used, from the ``gpu_memory_held`` findings (absent: idle)."""
    used: dict[int, int] = {}
    for f in errors(doc):
        if f["kind"] == "gpu_memory_held":
            used[int(f["gpu"])] = int(f["evidence"]["memory_used_mib"])
    return used


def test_each_host_sees_only_itself(fleet: Fleet, tmp_path: Path, figure: Any) -> None:
    figure(f"fleet of {len(fleet.hosts)} namespaced sshd hosts started in {fleet.start_s:.2f} s")
    for alias, host in fleet.hosts.items():
        baseline = tmp_path / f"{alias}.json"
        code, doc, elapsed = check(fleet, alias, "--save-baseline", str(baseline))
        figure(f"check --host {alias} (sim GPUs) took {elapsed:.2f} s: {doc['verdict']}")
        saved = json.loads(baseline.read_text())
        # The processes of the host's own namespace, by their PIDs there: its init (PID 1), its
        # sshd, the decoy where there is one, and the probe's own short-lived sessions.
        pids = {pid for pid, _ in saved["processes"]}
        assert {1, host.sshd_pid} <= pids, (alias, saved["processes"])
        assert set(host.pids()) <= pids  # what lives there now was there during the check
        # Every listener of the shared network is seen, but only this host's sshd is owned by a
        # process the host has: the other hosts' servers are not its processes.
        owners = {item["port"]: {pid for pid, _ in item["owners"]} for item in saved["listeners"]}
        for other in fleet.hosts.values():
            assert owners.get(other.port) == ({host.sshd_pid} if other is host else set()), (
                alias, other.alias, owners)
        # The ledger read is the host's own.
        assert [g["index"] for g in saved["gpus"]] == list(range(8))
        held = {g["index"]: g["memory_used_mib"] for g in saved["gpus"] if g["memory_used_mib"]}
        if host.decoy is None:  # the decoy, a stray sglang process, would be an error here
            assert code == 0, doc
            assert doc["verdict"] == "clean" and not errors(doc), doc
            assert held == {}
        else:
            assert host.decoy_pid is not None
            assert host.decoy_pid in pids
            assert held == {host.decoy.gpu: host.decoy.used_mib}
    # Checked together, the worst verdict wins, and each host keeps its own findings.
    aliases = fleet.aliases
    done = fleet.cli("check", *(x for a in aliases for x in ("--host", a)), "--gpu-backend",
                     "sim", "--json", timeout=90)
    doc = done.json()
    figure(f"check of {len(aliases)} hosts at once took {done.elapsed_s:.2f} s")
    local = fleet.cli("check", "--gpu-backend", "sim", "--json", timeout=90)
    figure(f"for comparison, check of this machine (no SSH) took {local.elapsed_s:.2f} s")
    assert [h["host"] for h in doc["hosts"]] == aliases
    assert {h["host"]: h["verdict"] for h in doc["hosts"]} == {
        a: ("dirty" if a == DECOY_HOST else "clean") for a in aliases}


def test_decoy_host_is_dirty_naming_the_decoy(fleet: Fleet) -> None:
    host = fleet[DECOY_HOST]
    assert host.decoy is not None and host.decoy_pid is not None
    assert host.pids()[host.decoy_pid] == DECOY_TITLE
    code, doc, _ = check(fleet, DECOY_HOST)
    assert code == 1 and doc["verdict"] == "dirty", doc
    named = {(f["kind"], f["pid"]) for f in errors(doc)}
    assert {("stray_process", host.decoy_pid), ("gpu_process", host.decoy_pid)} <= named, named
    stray = next(f for f in errors(doc) if f["kind"] == "stray_process")
    assert DECOY_TITLE in stray["message"], stray
    assert gpu_used(doc) == {host.decoy.gpu: host.decoy.used_mib}
    # The same reading by hand, inside the host's namespace and over SSH.
    seen = host.inside("cat", f"/proc/{host.decoy_pid}/cmdline")
    assert seen.stdout.rstrip("\0") == DECOY_TITLE, seen
    over = fleet.ssh(DECOY_HOST, f"tr '\\0' ' ' </proc/{host.decoy_pid}/cmdline; echo; "
                                 "printenv CLEANSLATE_SIM_GPU_DIR")
    assert [line.strip() for line in over.stdout.splitlines()] == [
        DECOY_TITLE, str(fleet.ledger_path)], over
    assert host.inside("cat", f"/proc/{host.decoy_pid}/comm").stdout.strip() == DECOY_TITLE[:15]


class Runs:
    """``serve`` / ``stop`` of sim runs on fleet hosts, with one store; stops what is left."""

    def __init__(self, fleet: Fleet, root: Path) -> None:
        self.fleet = fleet
        self.db = root / "cs.db"
        self.store = f"sqlite:///{self.db}"

    def serve(self, alias: str, port: int, *options: str) -> dict[str, Any]:
        done = self.fleet.cli("serve", "--engine", "sim", "--model", "sim", "--host", alias,
                              "--port", str(port), "--store", self.store, "--detach", "--json",
                              "--gpu-backend", "sim", "--ready-timeout", "60",
                              "--smoke-timeout", "5", *options, "--", "--tp-size", "2")
        assert done.returncode == 0, (done.stdout, done.stderr)
        doc: dict[str, Any] = done.json()
        return doc

    def stop(self, run_id: str) -> tuple[int, dict[str, Any]]:
        done = self.fleet.cli("stop", run_id, "--store", self.store, "--json", "--deadline",
                              "20", "--grace", "3", "--gpu-backend", "sim")
        return done.returncode, done.json()

    def check(self, alias: str, *extra: str) -> tuple[int, dict[str, Any], float]:
        return check(self.fleet, alias, "--store", self.store, *extra)

    def stop_all(self) -> None:
        for run in recorded_rows(self.db):
            if run["status"] in ("starting", "ready"):
                self.stop(run["id"])


@pytest.fixture
def runs(fleet: Fleet, tmp_path: Path) -> Any:
    made = Runs(fleet, tmp_path)
    yield made
    made.stop_all()


def run_pids(doc: dict[str, Any], run_id: str) -> set[int]:
    return {f["pid"] for f in errors(doc) if f["evidence"].get("run_marker") == run_id}


def test_a_run_is_seen_on_its_host_only(fleet: Fleet, runs: Runs, figure: Any) -> None:
    a, b = fleet["fleet-a"], fleet["fleet-b"]
    port = free_port()
    started = time.monotonic()
    doc = runs.serve(a.alias, port, "--gpus", "0,1")
    figure(f"serve --host fleet-a (sim, tp 2) ready and smoke-tested in "
           f"{time.monotonic() - started:.2f} s")
    run_id = doc["run_id"]
    assert doc["host"] == "fleet-a"
    # The run's files are in fleet-a's login directory; its memory in fleet-a's ledger only.
    assert (a.login / doc["log"]).exists(), doc["log"]
    entries = a.ledger_entries()
    assert {e["gpu"] for e in entries} == {0, 1}, entries
    assert b.ledger_entries() == [] and not list(fleet.ledger_path.glob("alloc-*"))
    assert all(a.pid_alive(e["pid"], e["start_ticks"]) for e in entries)

    code_a, on_a, _ = runs.check("fleet-a", "--port", str(port))
    assert code_a == 1, on_a
    pids = run_pids(on_a, run_id)
    assert doc["pid"] in pids
    kinds = {f["kind"] for f in errors(on_a) if f["pid"] in pids}
    assert {"stray_process", "gpu_process"} <= kinds, kinds
    assert set(gpu_used(on_a)) == {0, 1}
    assert all(a.pid_alive(pid) for pid in pids)

    # fleet-b: none of it (its port is not asked for: the hosts share one network).
    code_b, on_b, _ = runs.check("fleet-b")
    assert code_b == 0 and on_b["verdict"] == "clean", on_b
    assert not run_pids(on_b, run_id)
    assert gpu_used(on_b) == {}
    assert {pid for pid, cmd in b.pids().items() if "cleanslate" in cmd} == set()

    code, report = runs.stop(run_id)
    assert code == 0, report
    assert report["verify"]["verdict"] == "clean"
    assert not any(a.pid_alive(pid) for pid in pids)
    assert runs.check("fleet-a", "--port", str(port))[1]["verdict"] == "clean"
    assert a.ledger_entries() == []


def test_a_stop_on_the_decoy_host_leaves_the_decoy_alone(fleet: Fleet, runs: Runs) -> None:
    host = fleet[DECOY_HOST]
    assert host.decoy is not None and host.decoy_pid is not None
    ticks = host.start_ticks(host.decoy_pid)
    port = free_port()
    # On GPUs the decoy does not hold, as a study's slot would be, and without a preflight:
    # this test is about teardown, not about whether the decoy may block a launch (today, with
    # --gpus 2,3, the rules report it as a warning, "its GPUs are outside --gpus").
    doc = runs.serve(DECOY_HOST, port, "--gpus", "2,3", "--no-preflight")
    run_id = doc["run_id"]
    _, during, _ = runs.check(DECOY_HOST, "--port", str(port))
    pids = run_pids(during, run_id)
    assert doc["pid"] in pids and host.decoy_pid not in pids

    code, report = runs.stop(run_id)
    targets = {t["pid"] for t in report["targets"]}
    assert host.decoy_pid not in targets, report["targets"]
    assert pids <= targets
    assert not any(host.pid_alive(pid) for pid in pids)
    # The decoy: alive, the same process, never signalled, its memory still held.
    assert host.pid_alive(host.decoy_pid, ticks)
    assert host.decoy_signals() == []
    assert host.decoy_outer_pid is not None and os.path.exists(f"/proc/{host.decoy_outer_pid}")
    # The stop verifies what the run owned (its engine, GPUs 2 and 3, its port): clean. The
    # whole host is not: a check afterwards is DIRTY, naming the decoy.
    assert code == 0 and report["verify"]["verdict"] == "clean", report["verify"]
    code_after, after, _ = runs.check(DECOY_HOST)
    assert code_after == 1
    assert ("stray_process", host.decoy_pid) in {(f["kind"], f["pid"]) for f in errors(after)}
    assert gpu_used(after) == {host.decoy.gpu: host.decoy.used_mib}


def test_the_fixture_ends_everything_it_started(make_fleet: MakeFleet) -> None:
    fleet = make_fleet(["fleet-x", "fleet-y"], decoys={"fleet-y": Decoy(gpu=3, used_mib=1000)},
                       gpus=4)
    x, y = fleet["fleet-x"], fleet["fleet-y"]
    assert fleet.aliases == ["fleet-x", "fleet-y"]
    assert (fleet.home / ".ssh" / "config").read_text().count("Host fleet-") == 2
    # The ledger of each host is its own (4 GPUs here); the decoy's memory is in y's only.
    assert json.loads((x.ledger / "config.json").read_text())["gpus"] == 4
    assert x.ledger_entries() == []
    assert [(e["gpu"], e["used_mib"], e["name"]) for e in y.ledger_entries()] == [
        (3, 1000, DECOY_TITLE)]
    # A long-lived process of its own session in x, as a run's daemonized supervisor is.
    inside = x.inside("sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!")
    assert inside.returncode == 0, inside
    sleeper = int(inside.stdout)
    assert x.pid_alive(sleeper)
    outer = [x.init_pid, y.init_pid, y.decoy_outer_pid, outer_pid(x.init_pid, sleeper)]
    assert all(pid is not None and os.path.exists(f"/proc/{pid}") for pid in outer)
    fleet.stop()
    assert not x.running and not y.running
    assert all(not os.path.exists(f"/proc/{pid}") for pid in outer)
    assert y.decoy_signals() == []  # ended with its namespace (SIGKILL), not asked to leave


def test_hosts_refuse_a_decoy_on_a_host_not_started(tmp_path: Path) -> None:
    from tests.fleet.conftest import skip_unless_available
    from tests.fleet.hosts import start_fleet

    skip_unless_available()
    with pytest.raises(ValueError, match="not started"):
        start_fleet(tmp_path, ["fleet-a"], decoys={"fleet-z": Decoy()})



def test_probe_latency_per_host(fleet_env: Fleet, figure: Any) -> None:
    """In-process checks (no CLI start): the first opens the SSH connection, the next reuse it,
    as a study's verification does between trials."""
    import asyncio

    from cleanslate.hosts.ssh import SSHExecutor
    from cleanslate.verdict.check import CheckOptions, check_hosts

    options = CheckOptions(gpu_backend="sim")

    async def timed(executors: list[SSHExecutor]) -> tuple[float, str]:
        started = time.monotonic()
        report = await check_hosts(list(executors), options)
        return time.monotonic() - started, str(report.verdict)

    async def go() -> None:
        for alias in fleet_env.aliases:
            ex = SSHExecutor(alias)
            cold, verdict = await timed([ex])
            warm = sorted([(await timed([ex]))[0] for _ in range(3)])[1]
            figure(f"probe of {alias} in-process: {cold:.2f} s with connecting, {warm:.2f} s "
                   f"on an open connection (median of 3): {verdict}")
            assert verdict == ("dirty" if alias == DECOY_HOST else "clean")
            await ex.close()
        executors = [SSHExecutor(a) for a in fleet_env.aliases]
        await timed(executors)
        together, verdict = await timed(executors)
        figure(f"probe of {len(executors)} hosts at once on open connections: {together:.2f} s")
        assert verdict == "dirty"
        for ex in executors:
            await ex.close()

    asyncio.run(go())
