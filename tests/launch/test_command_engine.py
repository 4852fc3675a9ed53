"""``engine: command`` from a server file: ``argv:`` with ``{port}`` (and ``{model}``).

It once failed with ``CommandEngine.__init__() got an unexpected keyword argument 'launch'``
(``serve``, and ``stop`` built it the same way). The server here is the simulated engine,
started by its own command line: serve, smoke test, stop CLEAN, all through the CLI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._kit import alive, free_port
from tests.conftest import CliResult, run_cli

SIM_ARGV = [sys.executable, "-m", "cleanslate.sim", "serve", "--port", "{port}",
            "--model-path", "{model}"]


def write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "server.yaml"
    path.write_text(json.dumps(config, indent=1))
    return path


def cli(tmp_path: Path, *args: str) -> CliResult:
    (tmp_path / "gpus").mkdir(exist_ok=True)
    return run_cli(*args, env={"CLEANSLATE_SIM_GPU_DIR": str(tmp_path / "gpus")}, timeout=120)


@pytest.mark.slow
def test_command_engine_serves_smoke_tests_and_stops_clean(tmp_path: Path) -> None:
    port = free_port()
    path = write(tmp_path, {"engine": "command", "model": "sim", "port": port,
                            "argv": SIM_ARGV, "flags": {"tp-size": 2},
                            "ready_timeout_s": 60, "smoke_timeout_s": 10})
    store = f"sqlite:///{tmp_path}/cs.db"
    served = cli(tmp_path, "serve", str(path), "--store", store, "--detach", "--json",
                 "--gpu-backend", "sim")
    assert served.returncode == 0, served.stdout + served.stderr
    doc = served.json()
    assert doc["engine"] == "command" and doc["url"] == f"http://127.0.0.1:{port}"
    assert doc["argv"] == [sys.executable, "-m", "cleanslate.sim", "serve", "--port",
                           str(port), "--model-path", "sim", "--tp-size", "2"]
    assert doc["smoke"]["passed"] is True
    assert doc["flag_validation"] != "checked"  # no help command to validate against
    stopped = cli(tmp_path, "stop", doc["run_id"], "--store", store, "--json",
                  "--gpu-backend", "sim", "--deadline", "20")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    report = stopped.json()
    assert report["verify"]["verdict"] == "clean"
    workers = [t for t in report["targets"] if t["comm"].startswith("sim::")]
    assert len(workers) == 2
    for target in report["targets"]:
        assert not alive(target["pid"])


@pytest.mark.parametrize(("config", "message"), [
    ({"engine": "command", "model": "m"}, "engine command needs argv"),
    ({"engine": "command", "model": "m", "argv": ["my-server", "--port", "8000"]},
     "no {port} placeholder"),
    ({"engine": "command", "model": "m", "argv": ["s", "{port}"], "launch": ["x"]},
     "takes argv: (the whole command, with {port}), not launch:"),
    ({"engine": "sim", "model": "m", "argv": ["s", "{port}"]},
     "argv: is the template of engine command"),
])
def test_bad_command_configs_are_input_errors(tmp_path: Path, config: dict[str, Any],
                                              message: str) -> None:
    path = write(tmp_path, config)
    result = cli(tmp_path, "serve", str(path), "--store", f"sqlite:///{tmp_path}/cs.db",
                 "--detach", "--no-preflight")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr.replace("\n", " ")
    assert "Traceback" not in result.stderr
