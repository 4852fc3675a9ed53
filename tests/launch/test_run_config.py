"""A launched run keeps the configuration its engine says it runs with (issue 36 item 4): read
once it is ready, stored with the run record and read back typed, not masked by the store's
redaction. In-process ``start_server`` with the simulated engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.launch.config import ServeConfig
from cleanslate.launch.lifecycle import start_server, stop_server
from cleanslate.store import Store
from tests._kit import free_port


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    monkeypatch.setenv("CLEANSLATE_SIM_GPU_DIR", str(tmp_path / "gpus"))
    (tmp_path / "gpus").mkdir()
    return Store(f"sqlite:///{tmp_path}/cs.db")


def test_a_ready_run_records_its_configuration_in_effect(store: Store) -> None:
    config = ServeConfig(engine="sim", model="sim", port=free_port(), ready_timeout_s=60,
                         smoke=False, grace_s=5,
                         flags={"max-running-requests": "64", "tp-size": 1})
    executor = LocalExecutor()

    async def cycle() -> None:
        outcome = await start_server(executor, store, config, gpu_backend="sim",
                                     preflight=False, validate=False, verify_deadline_s=20)
        assert outcome.ok and outcome.run is not None, outcome
        await stop_server(executor, store, outcome.run, grace_s=5, gpu_backend="sim",
                          verify_deadline_s=20)

    asyncio.run(cycle())
    (run,) = store.runs()
    found = run.server_config
    assert found is not None and found.unreadable is None
    assert found.engine == "sim" and found.flavour == "sglang" and found.requested_known
    assert found.requested == {"--max-running-requests": "64", "--tp-size": 1}
    assert found.in_effect["max_running_requests"] == 64 and found.in_effect["tp_size"] == 1
    # "64" (text from the command line) asked, 64 in effect: the same
    assert [d.setting for d in found.differences] == ["max_total_num_tokens"]
    assert found.lines() == [f"max_total_num_tokens: not asked for; the engine chose "
                             f"{found.in_effect['max_total_num_tokens']:,}"]
    assert "config_s" in run.phases
