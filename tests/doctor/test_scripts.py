"""The host scripts as real processes on this machine: a hanging or missing ``nvidia-smi`` is
recorded, never an exception, and ``--bandwidth`` says why it was skipped."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cleanslate
from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.run import run_script
from cleanslate.hosts import LocalExecutor
from cleanslate.hosts.scripts import script_source


def test_a_hanging_nvidia_smi_is_timed_out_not_an_exception(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nexec sleep 30\n")
    fake.chmod(0o755)
    done = subprocess.run([sys.executable, "-I", "-", json.dumps({"cmd_timeout_s": 0.5,
                                                                  "nvml": False})],
                          input=script_source("doctor._doctor_script"), capture_output=True,
                          timeout=30, check=True,
                          env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    raw = json.loads(done.stdout)
    assert raw["commands"]["smi_q"]["timed_out"] is True
    assert set(raw["commands"]) == {"smi_q", "topo_m", "p2p_r", "p2p_w", "p2p_n", "p2p_a"}
    assert raw["elapsed_s"] < 10
    report = analyze(raw, host="local")
    assert report.driver is not None
    assert report.driver.nvidia_smi == "nvidia-smi -q timed out after 0.5 s"
    assert report.findings[0].code == "gpu_unreadable"
    assert report.exit_code == 1


def test_the_host_script_through_the_executor() -> None:
    raw, error, elapsed = asyncio.run(run_script(LocalExecutor(), {}, timeout=30))
    assert error is None and raw is not None
    assert {"commands", "nvml", "env", "elapsed_s"} <= set(raw)
    assert isinstance(raw["env"]["kernel"], str) and raw["env"]["shm"]["total_bytes"] > 0
    assert elapsed < 30


def test_bandwidth_without_torch_says_why() -> None:
    source = script_source("doctor._bandwidth")
    # -S: no site packages, so no torch, whatever this machine has.
    done = subprocess.run([sys.executable, "-I", "-S", "-", "{}"], input=source,
                          capture_output=True, timeout=60, check=True)
    assert json.loads(done.stdout)["skipped"].startswith("torch does not import: ")


#: Every script sent to a host's Python, found by its name (``_<name>_script.py``), with the three
#: that do not follow it: modules that double as a script (the ledger reader, the run files'
#: reader) and ``--bandwidth``, which imports torch inside a ``try``.
SRC = Path(cleanslate.__file__).parent
HOST_SCRIPTS = sorted([*SRC.rglob("_*_script.py"), SRC / "sim" / "ledger.py",
                       SRC / "hosts" / "files.py", SRC / "doctor" / "_bandwidth.py"])


def test_every_script_sent_to_a_host_is_covered() -> None:
    names = {p.name for p in HOST_SCRIPTS}
    assert {"_collect_script.py", "_doctor_script.py", "_supervise_script.py"} <= names


@pytest.mark.parametrize("path", HOST_SCRIPTS, ids=lambda p: str(p.relative_to(SRC)))
def test_the_host_scripts_run_on_python_3_8_with_the_standard_library(path: Path) -> None:
    """What a GPU host may have: the grammar of 3.8 and nothing to install (``pynvml`` and
    ``torch`` only inside a ``try``)."""
    import ast

    tree = ast.parse(path.read_bytes(), feature_version=(3, 8))
    guarded: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    guarded |= {a.name for a in inner.names} if isinstance(
                        inner, ast.Import) else {inner.module or ""}
    imported = 0
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for module in names:
            imported += 1
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or module in guarded or \
                top == "__future__", (path.name, module)
    assert imported > 0
