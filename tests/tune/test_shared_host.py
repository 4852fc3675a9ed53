"""A study on a shared host (issue 38, item 6): a process that is not the study's holds what the
check before a trial looks at. Each "host not clean" line names the findings with their PIDs
and ports, the study says how to go on (`--baseline` among it), and a study that never ran a
trial ends "no trial ran: the host is not clean (...)", exit 1, not "no feasible
configuration". ``tune --baseline FILE`` compares every check with what the host held when the
baseline was saved."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import psutil
import pytest

from tests._kit import free_port, study_yaml
from tests.cli.inproc import run_main
from tests.conftest import Processes, run_cli

#: A plain listener: binds the port given, says so, and waits to be ended by its PID.
LISTENER = """
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
time.sleep(300)
"""


def _one_line(text: str) -> str:
    """The output with its line wraps undone (rich folds long lines at the console's width)."""
    return " ".join(text.split())


def _env(tmp_path: Path, **config: int) -> dict[str, str]:
    """A simulated GPU ledger of its own (``config``: its ``config.json``), wide output."""
    gpus = tmp_path / "gpus"
    gpus.mkdir(exist_ok=True)
    if config:
        (gpus / "config.json").write_text(json.dumps(config))
    return {"CLEANSLATE_SIM_GPU_DIR": str(gpus), "COLUMNS": "400"}


@pytest.mark.slow  # a tune process that stops at its first check: about 5 s
def test_a_foreign_listener_on_the_port_is_named_and_no_trial_ran(
        tmp_path: Path, procs: Processes) -> None:
    # A process of its own (not under the tune process, whose own tree its checks leave out).
    port = free_port()
    listener = procs.python(LISTENER, str(port), stdout=subprocess.PIPE)
    assert listener.stdout is not None and listener.stdout.readline() == b"listening\n"
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml(name="shared", port=port, retries=0))

    result = run_cli("tune", str(study), "--store", f"sqlite:///{tmp_path}/cs.db",
                     env=_env(tmp_path), timeout=60)

    out = _one_line(result.stdout)
    assert result.returncode == 1, result.stdout + result.stderr
    # the process's own name (``python3`` or ``python``: whichever this interpreter is called)
    name = psutil.Process(listener.pid).name()
    named = f"port {port} is bound (127.0.0.1) by PID {listener.pid} `{name}"
    assert f"host not clean before the trial ({named}" in out
    assert f"the server needs port {port}: end PID {listener.pid} if it is yours, or give the " \
           "study another `port:`" in out
    assert "`cleanslate check --save-baseline FILE` on the idle host, then `cleanslate tune " \
           "STUDY.yaml --baseline FILE`" in out
    assert out.endswith(f"no trial ran: the host is not clean ({named}`)"), out[-300:]
    assert "no feasible configuration" not in out
    assert listener.poll() is None  # named, never signalled


@pytest.mark.slow  # one trial on the sim: about 6 s
def test_a_baseline_accepts_the_gpu_memory_that_was_there(tmp_path: Path) -> None:
    # 20,000 MiB in use on GPU 0 with no process of ours: another user's, as a shared host has.
    env = _env(tmp_path, gpus=1, idle_used_mib=20_000)
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml(name="shared", retries=0))
    store = f"sqlite:///{tmp_path}/cs.db"

    refused = run_cli("tune", str(study), "--store", store, env=env, timeout=60)
    out = _one_line(refused.stdout)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "no trial ran: the host is not clean (GPU 0" in out and "20000 MiB in use" in out

    baseline = tmp_path / "idle.json"
    saved = run_cli("check", "--gpu-backend", "sim", "--gpus", "0", "--save-baseline",
                    str(baseline), env=env)
    assert baseline.exists(), saved.stdout + saved.stderr

    done = run_cli("tune", str(study), "--store", store, "--baseline", str(baseline), env=env,
                   timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "best configuration" in done.stdout


def test_a_baseline_of_a_fleet_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml(hosts=["local", "ssh://nobody@127.0.0.1"]))
    baseline = tmp_path / "idle.json"
    baseline.write_text("{}")
    result = run_main(capsys, monkeypatch, "tune", str(study), "--check", "--baseline",
                      str(baseline))
    assert result.code == 2, result.out + result.err
    assert "--baseline: the study runs on 2 hosts and a baseline describes one" in \
        _one_line(result.err)


def test_a_baseline_with_register_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    study = tmp_path / "study.yaml"
    study.write_text(study_yaml())
    result = run_main(capsys, monkeypatch, "tune", str(study), "--register", "--baseline",
                      str(tmp_path / "idle.json"), "--store", f"sqlite:///{tmp_path}/cs.db")
    assert result.code == 2, result.out + result.err
    assert "--baseline: --baseline applies to the trials this command runs" in \
        _one_line(result.err)
    assert not (tmp_path / "cs.db").exists()  # refused before the store is opened


def test_a_workers_baseline_is_read_before_anything_else(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "idle.json"
    result = run_main(capsys, monkeypatch, "worker", "--study", "shared", "--baseline",
                      str(missing), "--store", f"sqlite:///{tmp_path}/cs.db")
    assert result.code == 2, result.out + result.err
    assert f"{missing}: cannot read the file" in _one_line(result.err)
    assert not (tmp_path / "cs.db").exists()
