"""The compact doctor snapshot a study or a ``serve`` run records (``doctor/snapshot.py``): from
the real H200 capture, from this machine (no driver) through real processes, and from probes
that fail (no interpreter, a script that hangs past the deadline, output that is not JSON)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.report import DoctorFinding, DoctorSeverity, HostDoctor
from cleanslate.doctor.snapshot import (
    MAX_FINDINGS,
    MAX_TEXT,
    SNAPSHOT_TIMEOUT_ENV,
    SNAPSHOT_TIMEOUT_S,
    SNAPSHOT_VERSION,
    HostSnapshot,
    redacted,
    snapshot_host,
    snapshot_timeout,
)
from cleanslate.hosts.local import LocalExecutor
from cleanslate.redact import REDACTED
from tests.doctor.captures import H200X1, h200x1_raw, h200x2_smi_raw, with_p2p


def _h200x1_report() -> HostDoctor:
    """``doctor --bandwidth --json``'s report of the one-H200 microVM, as it was printed."""
    [host] = json.loads((H200X1 / "doctor-report.json").read_text())["hosts"]
    host.pop("exit_code")  # computed from the findings
    return HostDoctor.model_validate(host)


def test_the_h200_capture_gives_one_gpu_row_with_its_link_and_state() -> None:
    snap = HostSnapshot.of(_h200x1_report(), taken_at=1.0)
    assert snap.version == SNAPSHOT_VERSION and snap.error is None
    assert (snap.driver, snap.cuda, snap.driver_present) == ("580.159.04", "13.0", True)
    [gpu] = snap.gpus
    assert (gpu.name, gpu.uuid, gpu.pci_bus_id) == (
        "NVIDIA H200", "GPU-37a88d38-c361-3f15-077c-e1be989b431f", "00000000:00:06.0")
    assert gpu.pcie_text() == "gen 5 x16 of gen 5 x16"
    assert (gpu.persistence, gpu.mig, gpu.ecc, gpu.ecc_uncorrected_volatile) == (
        True, False, True, 0)
    assert gpu.clock_events == ("Idle",) and gpu.memory_problems == ()
    assert (gpu.power_limit_w, gpu.power_default_w) == (700.0, 700.0)
    assert snap.virtualization == "firecracker" and (snap.kernel or "").startswith("6.18.44-fc-")
    assert snap.shm_bytes == 128 * 2**30
    assert {f.code for f in snap.findings} == {"virtual_machine", "dockerenv"}
    assert all(f.consequence for f in snap.findings)
    assert snap.summary().startswith("driver 580.159.04 CUDA 13.0; 1 x NVIDIA H200; ")
    # The bandwidth section of the full report is not part of a snapshot.
    assert "bandwidth" not in snap.model_dump() and len(snap.model_dump_json()) < 4000


def test_the_host_scripts_own_output_analyzed_here_gives_the_same_rows() -> None:
    raw = json.loads((H200X1 / "doctor-raw.json").read_text())
    from_raw = HostSnapshot.of(analyze(raw, host="vm"), taken_at=1.0)
    assert from_raw.gpus == HostSnapshot.of(_h200x1_report(), taken_at=1.0).gpus
    # The hand capture of another such VM: another UUID, the same state.
    other = HostSnapshot.of(analyze(h200x1_raw(), host="vm"), taken_at=1.0)
    assert other.gpus[0].model_copy(update={"uuid": None}) == \
        from_raw.gpus[0].model_copy(update={"uuid": None})


def test_two_gpus_give_their_pair_and_a_p2p_finding() -> None:
    snap = HostSnapshot.of(analyze(with_p2p(h200x2_smi_raw(), "r", "NS"), host="h"),
                           taken_at=1.0)
    assert [g.index for g in snap.gpus] == [0, 1]
    [pair] = snap.pairs
    assert (pair.a, pair.b, pair.link, pair.p2p_read) == (0, 1, "NV18", "NS")
    p2p = next(f for f in snap.findings if f.code == "p2p_not_supported")
    assert p2p.severity == DoctorSeverity.ERROR and p2p.gpus == (0, 1) and p2p.evidence
    assert "1 errors" in snap.summary()


def test_a_snapshot_is_bounded_and_says_what_was_cut() -> None:
    many = tuple(DoctorFinding(code="x", severity=DoctorSeverity.WARNING, message="m" * 5000,
                         consequence="c", evidence=tuple(f"e{i}" for i in range(10)))
                 for _ in range(MAX_FINDINGS + 10))
    error = DoctorFinding(code="ecc_uncorrected", severity=DoctorSeverity.ERROR, message="e",
                    consequence="c")
    report = _h200x1_report().model_copy(update={"findings": (*many, error)})
    snap = HostSnapshot.of(report, taken_at=1.0)
    assert len(snap.findings) == MAX_FINDINGS and snap.truncated == ("findings",)
    assert snap.findings[0].code == "ecc_uncorrected"  # errors first: a cut keeps them
    assert all(len(f.message) == MAX_TEXT and len(f.evidence) == 3 for f in snap.findings[1:])
    assert len(snap.model_dump_json()) < 64 * 1024


def test_a_snapshot_of_a_newer_version_is_refused() -> None:
    data = HostSnapshot.of(_h200x1_report(), taken_at=1.0).model_dump(mode="json")
    with pytest.raises(ValidationError, match="version 2"):
        HostSnapshot.model_validate({**data, "version": SNAPSHOT_VERSION + 1})


def test_secrets_in_host_text_are_redacted() -> None:
    report = _h200x1_report()
    assert report.environment is not None
    env = report.environment.model_copy(update={"kernel": "6.1 HF_TOKEN=hf_abcdefgh123"})
    finding = DoctorFinding(code="iommu", severity=DoctorSeverity.INFO, message="m",
                            consequence="c",
                            evidence=("/proc/cmdline: db=postgresql://u:pgsecret99@db/x",
                                      "Authorization: Bearer tok-secret-777"))
    snap = redacted(HostSnapshot.of(report.model_copy(update={
        "environment": env, "findings": (finding,)}), taken_at=1.0))
    text = snap.model_dump_json()
    for secret in ("hf_abcdefgh123", "pgsecret99", "tok-secret-777"):
        assert secret not in text
    assert REDACTED in (snap.kernel or "")


# -- real processes --------------------------------------------------------------------------------


def test_this_machine_without_a_driver_is_a_snapshot_of_its_environment() -> None:
    started = time.monotonic()
    snap = asyncio.run(snapshot_host(LocalExecutor()))
    assert time.monotonic() - started < 15
    assert snap.error is None and snap.host == "local"
    if snap.driver_present:
        pytest.skip("this machine has an NVIDIA driver")
    assert snap.gpus == () and snap.gpu_summary() == "no NVIDIA driver"
    assert "no_driver" in {f.code for f in snap.findings}
    assert snap.kernel and snap.shm_bytes


def _fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python3"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_an_executor_that_cannot_run_the_script_is_a_failed_snapshot() -> None:
    snap = asyncio.run(snapshot_host(LocalExecutor(python="/nonexistent/python3")))
    assert snap.error is not None and "could not run" in snap.error
    assert snap.gpus == () and snap.summary().startswith("doctor snapshot failed")


def test_a_script_that_hangs_is_ended_at_the_deadline(tmp_path: Path) -> None:
    executor = LocalExecutor(python=_fake_python(tmp_path, "exec sleep 60"))
    started = time.monotonic()
    snap = asyncio.run(snapshot_host(executor, timeout=1.0))
    assert time.monotonic() - started < 8
    assert snap.error is not None and "timed out" in snap.error


def test_output_that_is_not_json_is_a_failed_snapshot(tmp_path: Path) -> None:
    executor = LocalExecutor(python=_fake_python(tmp_path, "echo '<b>not json</b>'"))
    snap = asyncio.run(snapshot_host(executor, timeout=5.0))
    assert snap.error == "the doctor's host script printed no JSON"


def test_the_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SNAPSHOT_TIMEOUT_ENV, "2.5")
    assert snapshot_timeout() == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(SNAPSHOT_TIMEOUT_ENV, bad)
        assert snapshot_timeout() == SNAPSHOT_TIMEOUT_S, bad
