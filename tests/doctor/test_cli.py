"""``cleanslate doctor`` as a user runs it: on this CPU machine (no NVIDIA driver: a problem,
exit 1, with the environment section; exit 0 with ``--gpu-backend none``), over SSH against
the test sshd (the same report as local), an unreachable host (exit 3) and mistakes on the
command line (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from tests._kit import free_port
from tests.hosts.sshd import Sshd


def doctor(*args: str, env: dict[str, str] | None = None, timeout: float = 120
           ) -> tuple[int, str, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cleanslate", "doctor", *args],
                          capture_output=True, text=True, timeout=timeout, check=False, env=env)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def doc_of(stdout: str) -> dict[str, Any]:
    doc = json.loads(stdout)
    assert isinstance(doc, dict)
    return doc


def test_this_machine_without_a_driver_is_a_problem_with_the_environment() -> None:
    """Before: "NO PROBLEM FOUND", exit 0, on a host where nothing can be served on GPUs."""
    code, out, err, _ = doctor("--json")
    assert code == 1, err
    doc = doc_of(out)
    (host,) = doc["hosts"]
    assert host["host"] == "local" and host["error"] is None and host["exit_code"] == 1
    assert host["driver"]["present"] is False
    assert host["devices"] == [] and host["pairs"] == []
    env = host["environment"]
    assert env["kernel"] and env["shm_bytes"] > 0 and env["memlock"]
    (no_driver,) = [f for f in host["findings"] if f["code"] == "no_driver"]
    assert no_driver["severity"] == "error" and host["findings"][0] == no_driver
    assert doc["exit_code"] == 1


def test_the_human_report_and_bandwidth_skipped() -> None:
    code, out, err, _ = doctor("--bandwidth")
    assert code == 1, err
    assert "error: no NVIDIA driver or GPU found" in out and "environment:" in out
    assert "means: nothing can be served on NVIDIA GPUs here" in out
    assert "bandwidth: skipped: no NVIDIA GPU on local" in out
    assert out.strip().splitlines()[-1] == "PROBLEMS FOUND"
    assert "NO PROBLEM FOUND" not in out and "Traceback" not in err


def test_a_host_meant_to_serve_without_gpus() -> None:
    code, out, err, _ = doctor("--gpu-backend", "none")
    assert code == 0, err
    assert "info: no NVIDIA driver or GPU found (none expected: --gpu-backend none)" in out
    assert out.strip().splitlines()[-1] == "NO PROBLEM FOUND"
    code, _, err, _ = doctor("--gpu-backend", "bogus")
    assert code == 2 and "--gpu-backend" in err and "Traceback" not in err


def test_mistakes_are_input_errors() -> None:
    for args, where in ((["--gpus", "a"], "--gpus"), (["--timeout", "0"], "--timeout"),
                        (["--gpus", "-1"], "--gpus"), (["--host", "bad host@@:x"], "")):
        code, _, err, _ = doctor(*args)
        assert code == 2, (args, err)
        assert "Traceback" not in err and where in err


def test_an_unreachable_host_is_unknown(sshd: Sshd) -> None:
    code, out, err, _ = doctor("--json", "--host", f"ssh://{sshd.user}@127.0.0.1:{free_port()}",
                               env=sshd.client_env())
    assert code == 3, err
    (host,) = doc_of(out)["hosts"]
    assert host["error"] and host["exit_code"] == 3 and host["environment"] is None


def test_over_ssh_the_same_report_as_local(sshd: Sshd) -> None:
    env = sshd.client_env()
    code_l, out_l, err_l, local_s = doctor("--json", env=env)
    code_r, out_r, err_r, remote_s = doctor("--json", "--host", "plain", env=env)
    assert code_l == code_r == 1, (err_l, err_r)  # no driver on either
    local, remote = doc_of(out_l)["hosts"][0], doc_of(out_r)["hosts"][0]
    assert remote["host"] != "local" and remote["error"] is None
    for key in ("driver", "devices", "pairs"):
        assert remote[key] == local[key], key
    env_l, env_r = dict(local["environment"]), dict(remote["environment"])
    # The probe's own cgroup is where its session runs (sshd's session, or this test's):
    # everything else about the host reads the same.
    for side in (env_l, env_r):
        side["cgroup"] = [c for c in side["cgroup"] if not c.startswith("/proc/self/")]
    assert env_r == env_l
    assert [f["code"] for f in remote["findings"]] == [f["code"] for f in local["findings"]]
    print(f"doctor --json: local {local_s:.2f} s, over SSH {remote_s:.2f} s "
          f"(probe {local['elapsed_s']} s / {remote['elapsed_s']} s)")


def test_doctor_imports_only_what_it_needs() -> None:
    code = ("import sys\nsys.argv = ['cleanslate', 'doctor']\n"
            "from cleanslate.cli import build_app\nbuild_app('doctor')\n"
            "import cleanslate.doctor.run\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'optuna', "
            "'aiohttp', 'numpy', 'matplotlib', 'asyncssh', 'pynvml', 'torch'}))\n"
            "print(sorted(m for m in sys.modules if m.startswith('cleanslate.') and m.split('.')[1]"
            " in ('store', 'tune', 'bench', 'launch', 'verdict', 'engines', 'probe')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["[]", "[]"]
