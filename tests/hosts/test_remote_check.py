"""``cleanslate check --host`` over a real OpenSSH server on 127.0.0.1, as a user runs it.

The server runs on this machine, so the same processes are seen locally and over SSH: a verdict
that differs between the two is a bug of the remote path. Each test names the findings of its
own processes (by PID); the tests that need CLEAN narrow the scope with ``--engine`` to a
signature nobody else uses here, as ``tests/cli/test_check_live.py`` does.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._kit import free_port
from tests.conftest import Processes
from tests.hosts.conftest import hang_pids, pid_alive
from tests.hosts.sshd import Sshd

STRAY = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(120)"


def check(sshd: Sshd, *args: str, home: Path | None = None, timeout: float = 60,
          env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str, float]:
    """Run ``cleanslate check --json ARGS`` with the test client home; (exit, doc, stderr, s)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "cleanslate", "check", "--json", *args],
        capture_output=True, text=True, timeout=timeout, check=False,
        env={**sshd.client_env(home), **(env or {})},
    )
    elapsed = time.monotonic() - started
    try:
        doc = json.loads(done.stdout)
    except ValueError:
        pytest.fail(f"not one JSON document (exit {done.returncode}): {done.stdout!r} "
                    f"{done.stderr}")
    return done.returncode, doc, done.stderr, elapsed


def reached(doc: dict[str, Any]) -> bool:
    """Whether every host was probed (no UNKNOWN): what the host-key tests need to know."""
    return all(h["verdict"] != "unknown" for h in doc["hosts"])


def check_quiet(sshd: Sshd, *args: str, attempts: int = 3) -> tuple[int, int, dict[str, Any],
                                                                     str]:
    """Check locally, then with ``args``, until the local check is CLEAN: on a shared developer
    machine other people's test servers (carrying run markers) come and go. In CI the first
    attempt is the answer. Where this machine never reads CLEAN, the test is skipped after
    checking that the remote view agrees with the local one. Returns (local exit, exit with
    args, doc with args, stderr)."""
    for _ in range(attempts):
        code_l, local, _, _ = check(sshd, "--gpu-backend", "none", "--engine", "llamacpp")
        code, doc, err, _ = check(sshd, *args)
        if code_l == 0:
            return code_l, code, doc, err
        time.sleep(1.0)
    remote = {h["verdict"] for h in doc["hosts"] if h["host"] in sshd.ports}
    assert remote <= {local["verdict"]}, (local, doc)
    noise = [f["message"] for f in local["hosts"][0]["findings"] if f["severity"] == "error"]
    pytest.skip(f"this machine is not quiet (others' processes keep it DIRTY): {noise[:3]}")


def findings(host: dict[str, Any], kind: str) -> dict[int | None, dict[str, Any]]:
    return {f["pid"]: f for f in host["findings"] if f["kind"] == kind}


def start_stray(procs: Processes, tmp_path: Path) -> int:
    ready = tmp_path / "stray-ready"
    proc = procs.python(STRAY, str(ready), "-m", "sglang.launch_server", "--port", "30000")
    deadline = time.monotonic() + 10
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return proc.pid


def _comparable(finding: dict[str, Any]) -> dict[str, Any]:
    evidence = dict(finding["evidence"])
    evidence.pop("create_time", None)  # /proc ticks vs ps etimes: equal to the second only
    # The fallback reads ps's space-joined args: the same command line, not the same argv.
    evidence["cmdline"] = " ".join(evidence["cmdline"])
    return {**finding, "evidence": evidence}


@pytest.mark.parametrize("alias", ["plain", "nopy"])
def test_same_state_same_verdict_locally_and_over_ssh(
    sshd: Sshd, procs: Processes, tmp_path: Path, alias: str
) -> None:
    """A process matching an engine: DIRTY with the same stray finding (by PID) both ways,
    through the collector (``plain``) and through the no-python3 fallback (``nopy``)."""
    pid = start_stray(procs, tmp_path)
    scope = ["--gpu-backend", "none", "--engine", "sglang"]
    code_l, local, _, _ = check(sshd, *scope)
    code_r, remote, err, _ = check(sshd, *scope, "--host", alias)
    assert (code_l, code_r) == (1, 1), err
    assert local["verdict"] == remote["verdict"] == "dirty"
    host = remote["hosts"][0]
    assert host["host"] == alias
    mine_l = findings(local["hosts"][0], "stray_process")[pid]
    mine_r = findings(host, "stray_process")[pid]
    assert _comparable(mine_l) == _comparable(mine_r)
    assert abs(mine_l["evidence"]["create_time"] - mine_r["evidence"]["create_time"]) < 2.0
    assert mine_r["evidence"]["engine"] == "sglang"


@pytest.mark.parametrize("alias", ["plain", "nopy"])
def test_nothing_running_is_clean_both_ways(sshd: Sshd, alias: str) -> None:
    scope = ["--gpu-backend", "none", "--engine", "llamacpp"]
    code_l, code_r, remote, err = check_quiet(sshd, *scope, "--host", alias)
    assert (code_l, code_r) == (0, 0), (remote, err)
    assert remote["hosts"][0]["verdict"] == "clean"


def test_fallback_reads_ports_and_gpus_without_python3(
    sshd: Sshd, procs: Processes, tmp_path: Path
) -> None:
    """``nopy`` has no python3: ps, ls and /proc/net/tcp give processes, port owners and the
    run marker; the nvidia-smi stand-in (the idle H200 fixture) gives the GPUs. What the
    fallback cannot read (the kernel log) is a warning that names it, not a silent zero."""
    port = free_port()
    ready = tmp_path / "listening"
    owner = procs.python(
        "import socket, sys, time\n"
        "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen()\n"
        "open(sys.argv[2], 'w').close(); time.sleep(120)\n",
        str(port), str(ready), env={**sshd.client_env(), "CLEANSLATE_RUN": "r-ssh-test"},
    )
    while not ready.exists():
        time.sleep(0.02)
    code, doc, err, _ = check(sshd, "--host", "nopy", "--gpu-backend", "nvidia-smi",
                              "--engine", "llamacpp", "--port", str(port))
    host = doc["hosts"][0]
    assert code == 1, (doc, err)
    assert host["gpu_backend"] == "nvidia-smi"
    assert [g["memory_used_mib"] for g in host["gpus"]] == [0, 0]
    bound = findings(host, "port_in_use")
    assert bound[owner.pid]["port"] == port
    marked = findings(host, "stray_process")[owner.pid]
    assert marked["evidence"]["run_marker"] == "r-ssh-test"
    warnings = [f["message"] for f in host["findings"]
                if f["kind"] == "probe_error" and f["severity"] == "warning"]
    assert any("kmsg" in m and "python3" in m for m in warnings), warnings
    # The same port, free, with nothing of ours running: CLEAN (the warning is no reason).
    owner.kill()
    owner.wait()
    _, code, doc, err = check_quiet(sshd, "--host", "nopy", "--gpu-backend", "nvidia-smi",
                                    "--engine", "llamacpp", "--port", str(port))
    assert code == 0, (doc, err)


def test_closed_port_is_unknown_within_the_connect_timeout(sshd: Sshd) -> None:
    url = f"ssh://{sshd.user}@127.0.0.1:{free_port()}?connect-timeout=3"
    code, doc, err, elapsed = check(sshd, "--host", url, "--gpu-backend", "none")
    assert code == 3, err
    host = doc["hosts"][0]
    assert doc["verdict"] == host["verdict"] == "unknown"
    assert host["host"] == url.split("?")[0]
    messages = " ".join(f["message"] for f in host["findings"] if f["severity"] == "unknown")
    assert "host unreachable" in messages and "refused" in messages.lower()
    assert elapsed < 3 + 10  # the connect timeout, plus the interpreter's start on a busy CI box


def test_silent_host_is_unknown_at_the_connect_timeout(sshd: Sshd) -> None:
    with socket.socket() as silent:  # accepts TCP, never speaks SSH
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"ssh://127.0.0.1:{silent.getsockname()[1]}?connect-timeout=2"
        code, doc, err, _ = check(sshd, "--host", url, "--gpu-backend", "nvidia-smi")
    assert code == 3, err
    host = doc["hosts"][0]
    assert doc["elapsed_s"] < 2 + 1.5
    assert any("no answer within 2 s" in f["message"] for f in host["findings"]), host


def test_unknown_host_key_is_refused_unless_opted_in(sshd: Sshd, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(sshd.home, home)
    known = home / ".ssh" / "known_hosts"
    known.write_text("")
    code, doc, err, _ = check(sshd, "--host", "plain", "--gpu-backend", "none", home=home)
    assert code == 3, err
    message = " ".join(f["message"] for f in doc["hosts"][0]["findings"])
    assert "is not in" in message and "refused" in message
    assert f"ssh-keyscan -p {sshd.ports['plain']} 127.0.0.1 >> {known}" in message
    assert "CLEANSLATE_SSH_ACCEPT_NEW=1" in message and "accept-new=1" in message
    assert known.read_text() == ""
    # Opted in by the environment: the key is recorded, and the next check trusts it without.
    code, doc, err, _ = check(sshd, "--host", "plain", "--gpu-backend", "none",
                              "--engine", "llamacpp", home=home,
                              env={"CLEANSLATE_SSH_ACCEPT_NEW": "1"})
    assert reached(doc), (doc, err)
    recorded = known.read_text().split()
    assert recorded == [f"[127.0.0.1]:{sshd.ports['plain']}", *sshd.host_key_pub.split()[:2]]
    code, doc, err, _ = check(sshd, "--host", "plain", "--gpu-backend", "none",
                              "--engine", "llamacpp", home=home)
    assert reached(doc), (doc, err)
    # Opted in by the URL, for another port of the same server.
    url = sshd.url("nopy", **{"accept-new": "1"})
    code, doc, err, _ = check(sshd, "--host", url, "--gpu-backend", "none",
                              "--engine", "llamacpp", home=home)
    assert reached(doc), (doc, err)
    assert f"[127.0.0.1]:{sshd.ports['nopy']} " in known.read_text()


def test_changed_host_key_is_refused_even_when_opted_in(sshd: Sshd, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(sshd.home, home)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)],
                   check=True)
    known = home / ".ssh" / "known_hosts"
    wrong = f"[127.0.0.1]:{sshd.ports['plain']} {(tmp_path / 'other_key.pub').read_text()}"
    known.write_text(wrong)
    code, doc, err, _ = check(sshd, "--host", "plain", "--gpu-backend", "none", home=home,
                              env={"CLEANSLATE_SSH_ACCEPT_NEW": "1"})
    assert code == 3, err
    message = " ".join(f["message"] for f in doc["hosts"][0]["findings"])
    assert "CHANGED" in message and "ssh-keygen -R" in message
    assert known.read_text() == wrong


def test_hanging_probe_is_ended_on_the_host(sshd: Sshd) -> None:
    """``hang``'s python3 never answers: the remote ``timeout`` ends it at the probe timeout,
    the host is UNKNOWN, and no process of it is left there."""
    before = set(hang_pids(sshd))
    code, doc, err, _ = check(sshd, "--host", "hang", "--gpu-backend", "none",
                              "--timeout", "2")
    assert code == 3, err
    host = doc["hosts"][0]
    assert host["verdict"] == "unknown"
    assert any("timed out" in f["message"] for f in host["findings"]), host
    assert doc["elapsed_s"] < 2 + 3
    started = [pid for pid in hang_pids(sshd) if pid not in before]
    assert started, "the hanging python3 stand-in never ran"
    deadline = time.monotonic() + 5
    while any(map(pid_alive, started)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(pid_alive, started)), f"left running on the host: {started}"


def test_many_hosts_concurrently_one_entry_each_worst_wins(
    sshd: Sshd, procs: Processes, tmp_path: Path
) -> None:
    dead = f"ssh://{sshd.user}@127.0.0.1:{free_port()}?connect-timeout=3"
    scope = ["--gpu-backend", "none", "--engine", "llamacpp"]
    _, code, doc, err = check_quiet(sshd, *scope, "--host", "plain", "--host", "nopy",
                                    "--host", dead)
    assert code == 3, err  # UNKNOWN beats CLEAN
    assert [h["host"] for h in doc["hosts"]] == ["plain", "nopy", dead.split("?")[0]]
    assert [h["verdict"] for h in doc["hosts"]] == ["clean", "clean", "unknown"]
    pid = start_stray(procs, tmp_path)
    code, doc, err, _ = check(sshd, "--gpu-backend", "none", "--engine", "sglang",
                              "--host", "plain", "--host", dead)
    assert code == 1, err  # DIRTY beats UNKNOWN
    assert [h["verdict"] for h in doc["hosts"]] == ["dirty", "unknown"]
    assert pid in findings(doc["hosts"][0], "stray_process")


def test_refused_login_and_missing_key_file_are_unknown(sshd: Sshd, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(sshd.home, home)
    key = home / ".ssh" / "id_ed25519"
    key.unlink()
    Path(str(key) + ".pub").unlink()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    code, doc, err, _ = check(sshd, "--host", "plain", "--gpu-backend", "none", home=home)
    assert code == 3, err
    message = " ".join(f["message"] for f in doc["hosts"][0]["findings"])
    assert "cannot log in" in message, message
    key.unlink()
    code, doc, err, _ = check(sshd, "--host", "plain", "--gpu-backend", "none", home=home)
    assert code == 3, err
    message = " ".join(f["message"] for f in doc["hosts"][0]["findings"])
    assert "id_ed25519" in message, message
