"""``cleanslate check`` and ``clean`` against live GPU states, through both GPU backends.

Marked ``gpu`` and skipped where no NVIDIA GPU is usable (CI). On the accelerator machine it
reproduces the states of ``tests/fixtures/nvidia-h200x2/`` live:

1. idle: CLEAN;
2. a process tree holding memory: a parent on GPU 0 (torch), a child renamed with
   ``prctl(PR_SET_NAME)`` on GPU 1, and a grandchild in its own session (``setsid``), renamed
   too, on GPU 1: DIRTY, naming every PID on its GPU;
3. the parent SIGKILLed: DIRTY, naming the orphaned child and grandchild on GPU 1; GPU 0 clean;
4. ``cleanslate clean --pid CHILD --pid GRANDCHILD --yes --json`` ends them, and a
   ``check --until-clean`` started before it reports when the host read clean again.

On a machine with one GPU everything is on GPU 0 and step 3 checks only that the parent is
gone. Every process the tests start is ended by PID in a finalizer, and each also ends itself
after :data:`LIFETIME_S` (a setsid'd process would otherwise outlive the test run).

Set ``CLEANSLATE_GPU_TEST_LOG`` to a file to get the JSON documents the CLI printed there.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.nvidia_smi import NvidiaSmiBackend
from cleanslate.probe.gpu.nvml import NvmlBackend

BACKENDS = ("nvml", "nvidia-smi")
LIFETIME_S = 240  # every test process exits by itself after this
PARENT_MIB, CHILD_MIB, GRANDCHILD_MIB = 4096, 2048, 1024
CHILD_NAME, GRANDCHILD_NAME = "cstest::worker", "cstest::detach"


def _gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        if not asyncio.run(NvmlBackend.usable(LocalExecutor())):
            return 0
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


GPUS = _gpu_count()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(GPUS == 0, reason="needs an NVIDIA GPU (nvidia-smi and NVML)"),
]

#: One script for the three generations: ``ROLE GPU MIB [ROLE GPU MIB ...]``. Each allocates
#: ``MIB`` on ``cuda:GPU`` with torch, renames itself (all but the first), starts the next
#: generation (the last in a new session), prints ``ROLE PID`` when it holds its memory, and
#: sleeps until killed or :data:`LIFETIME_S` has passed.
TREE = r"""
import ctypes, os, subprocess, sys, time
import torch
role, gpu, mib, rest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
name = os.environ.pop("CSTEST_NAME_" + role, "")
if name:
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
x = torch.empty(mib * 2**20, dtype=torch.uint8, device=f"cuda:{gpu}")
x.fill_(1)
torch.cuda.synchronize(gpu)
if rest:
    subprocess.Popen([sys.executable, "-c", os.environ["CSTEST_CODE"], *rest],
                     start_new_session=(len(rest) == 3))
print(role, os.getpid(), flush=True)
time.sleep(float(os.environ["CSTEST_LIFETIME"]))
"""


def _log(label: str, document: Any) -> None:
    """Print a CLI document (pytest -s shows it) and append it to CLEANSLATE_GPU_TEST_LOG."""
    text = json.dumps(document, indent=None, default=str)
    print(f"--- {label}: {text[:2000]}")
    path = os.environ.get("CLEANSLATE_GPU_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"label": label, "document": document}, default=str) + "\n")


def cli(*args: str, timeout: float = 120) -> tuple[int, Any]:
    """``python -m cleanslate ARGS`` (``--json``): exit code and the parsed document."""
    done = subprocess.run([sys.executable, "-m", "cleanslate", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)
    try:
        document = json.loads(done.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"cleanslate {' '.join(args)} exited {done.returncode} without JSON:\n"
                    f"stdout: {done.stdout[-2000:]}\nstderr: {done.stderr[-2000:]}")
    return done.returncode, document


def check(backend: str, *extra: str) -> tuple[int, dict[str, Any]]:
    code, document = cli("check", "--gpu-backend", backend, "--json", *extra)
    _log(f"check --gpu-backend {backend} {' '.join(extra)} (exit {code})", document)
    return code, document


def findings(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for host in document["hosts"] for f in host["findings"]]


def held(document: dict[str, Any]) -> set[tuple[int, int]]:
    """(gpu, pid) of every ``gpu_process`` error finding."""
    return {(f["gpu"], f["pid"]) for f in findings(document)
            if f["kind"] == "gpu_process" and f["severity"] == "error"}


def gpu_pids(document: dict[str, Any], index: int) -> set[int]:
    gpus = [g for host in document["hosts"] for g in host["gpus"] if g["index"] == index]
    assert gpus, f"GPU {index} not in the report"
    return {p["pid"] for p in gpus[0]["processes"]}


@dataclass
class Tree:
    """The process tree: psutil handles (PID + create time: no PID-reuse accidents)."""

    gpu_a: int
    gpu_b: int
    procs: dict[str, psutil.Process] = field(default_factory=dict)
    popen: subprocess.Popen[str] | None = None

    def pid(self, role: str) -> int:
        return self.procs[role].pid

    def end(self) -> None:
        """SIGKILL every process of the tree still alive, by PID, and reap the parent."""
        for proc in self.procs.values():
            try:
                if proc.is_running():
                    proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        if self.popen is not None:
            if self.popen.poll() is None:
                self.popen.kill()
            self.popen.wait(timeout=30)


@pytest.fixture
def tree() -> Iterator[Tree]:
    """Start parent (GPU a) -> child (GPU b, renamed) -> grandchild (GPU b, setsid, renamed)."""
    gpu_a, gpu_b = 0, (1 if GPUS >= 2 else 0)
    t = Tree(gpu_a, gpu_b)
    env = {**os.environ, "CSTEST_CODE": TREE, "CSTEST_LIFETIME": str(LIFETIME_S),
           "CSTEST_NAME_child": CHILD_NAME, "CSTEST_NAME_grandchild": GRANDCHILD_NAME,
           "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-c", TREE,
            "parent", str(gpu_a), str(PARENT_MIB),
            "child", str(gpu_b), str(CHILD_MIB),
            "grandchild", str(gpu_b), str(GRANDCHILD_MIB)]
    t.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert t.popen.stdout is not None
        deadline = time.monotonic() + 120
        while len(t.procs) < 3:
            left = deadline - time.monotonic()
            assert left > 0, f"the tree did not start: {sorted(t.procs)}"
            ready, _, _ = select.select([t.popen.stdout], [], [], left)
            if not ready:
                continue
            line = t.popen.stdout.readline()
            assert line, f"the tree's output ended early: {sorted(t.procs)}"
            role, pid = line.split()
            t.procs[role] = psutil.Process(int(pid))
        yield t
    finally:
        t.end()


@pytest.mark.parametrize("backend", BACKENDS)
def test_idle_host_is_clean(backend: str) -> None:
    code, document = check(backend)
    assert document["verdict"] == "clean", findings(document)
    assert code == 0
    host = document["hosts"][0]
    assert host["gpu_backend"] == backend
    assert len(host["gpus"]) == GPUS


def alive(proc: psutil.Process) -> bool:
    """Running and not a zombie: an orphan's exit status waits for its new parent (PID 1 of the
    machine) to reap it, and psutil counts a zombie as running."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, index: int, timeout: float = 30) -> float:
    """Seconds until neither backend lists ``pid`` on GPU ``index``."""
    t0 = time.monotonic()

    async def listed() -> bool:
        executor = LocalExecutor()
        for backend in (NvmlBackend(), NvidiaSmiBackend()):
            reading = await backend.read(executor, timeout=30)
            for gpu in reading.gpus:
                if gpu.index == index and pid in {p.pid for p in gpu.processes}:
                    return True
        return False

    while asyncio.run(listed()):
        assert time.monotonic() - t0 < timeout, f"PID {pid} still holds GPU {index}"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_orphaned_tree_is_found_and_cleaned(tree: Tree) -> None:
    parent, child, grandchild = (tree.pid(r) for r in ("parent", "child", "grandchild"))
    a, b = tree.gpu_a, tree.gpu_b
    assert tree.procs["child"].name() == CHILD_NAME
    assert tree.procs["grandchild"].name() == GRANDCHILD_NAME
    assert os.getsid(grandchild) == grandchild != os.getsid(parent)

    # 2. the whole tree holds memory: DIRTY, every PID on its GPU, through both backends
    for backend in BACKENDS:
        code, document = check(backend)
        assert code == 1 and document["verdict"] == "dirty"
        assert {(a, parent), (b, child), (b, grandchild)} <= held(document), held(document)
        kinds = {(f["kind"], f["gpu"]) for f in findings(document)}
        assert ("gpu_memory_held", a) in kinds and ("gpu_memory_held", b) in kinds

    # 3. SIGKILL the parent only: its children are orphaned and keep GPU b
    tree.procs["parent"].send_signal(signal.SIGKILL)
    assert tree.popen is not None
    tree.popen.wait(timeout=30)
    released = _wait_gone(parent, a)
    _log("parent SIGKILL -> its PID gone from GPU a (s)", {"gpu": a, "seconds": released})
    assert alive(tree.procs["child"]) and alive(tree.procs["grandchild"])
    assert tree.procs["child"].ppid() != parent
    for backend in BACKENDS:
        code, document = check(backend)
        assert code == 1 and document["verdict"] == "dirty"
        now_held = held(document)
        assert {(b, child), (b, grandchild)} <= now_held, now_held
        assert all(pid != parent for _, pid in now_held), now_held
        if a != b:  # GPU a is clean: no error on it, nobody on it
            on_a = [f for f in findings(document) if f["gpu"] == a and f["severity"] == "error"]
            assert not on_a, on_a
            assert gpu_pids(document, a) == set()
        names = {f["pid"]: f["message"] for f in findings(document) if f["kind"] == "gpu_process"}
        assert CHILD_NAME in names[child] and GRANDCHILD_NAME in names[grandchild], names

    # 4. a check --until-clean that starts before the clean-up measures the release
    waiter = subprocess.Popen(
        [sys.executable, "-m", "cleanslate", "check", "--gpu-backend", "nvml", "--until-clean",
         "--deadline", "60", "--interval", "0.1", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)  # it has read DIRTY at least once by now
        code, report = cli("clean", "--pid", str(child), "--pid", str(grandchild), "--yes",
                           "--grace", "5", "--deadline", "30", "--gpu-backend", "nvml", "--json")
        _log(f"clean --pid {child} --pid {grandchild} (exit {code})", report)
        assert code == 0, report
        assert {t["pid"] for t in report["targets"]} >= {child, grandchild}
        assert report["survivors"] == []
        assert report["verify"]["verdict"] == "clean"
        out, err = waiter.communicate(timeout=90)
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(timeout=30)
    assert not alive(tree.procs["child"]) and not alive(tree.procs["grandchild"])
    waited = json.loads(out)
    _log(f"check --until-clean started 2 s before clean (exit {waiter.returncode})", waited)
    assert waited["verdict"] == "clean", err[-2000:]
    assert waited["until_clean"]["clean_after_s"] is not None

    # and the brief's form, after the fact, through both backends
    for backend in BACKENDS:
        code, document = check(backend, "--until-clean", "--deadline", "30")
        assert code == 0 and document["verdict"] == "clean", findings(document)
        assert document["until_clean"]["clean_after_s"] is not None
