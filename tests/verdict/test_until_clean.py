"""``check_until_clean``: the settle window (issue 12).

The live tests count only processes that carry this test's own run marker (``Scope(engines=(),
markers={ours})``), so other software on the machine cannot change their verdicts. The scripted
tests replace the readings with a sequence of reports to pin the window's rules.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.verdict import check as check_module
from cleanslate.verdict.check import (
    DEFAULT_SETTLE_S,
    MIN_SETTLE_READINGS,
    CheckOptions,
    CheckReport,
    check_until_clean,
)
from cleanslate.verdict.findings import Finding, FindingKind, HostVerdict, Severity, Verdict
from cleanslate.verdict.rules import Scope
from tests.conftest import Processes

#: A parent with an innocent name that restarts a marked child: the child sleeps LIFE seconds,
#: the parent waits GAP seconds, again and again. Only the child carries the marker.
RESPAWNER = (
    "import os, subprocess, sys, time\n"
    "life, gap = sys.argv[1], float(sys.argv[2])\n"
    "env = {**os.environ, 'CLEANSLATE_RUN': os.environ.pop('CHILD_MARKER')}\n"
    "while True:\n"
    "    subprocess.run([sys.executable, '-c', 'import sys, time; time.sleep(float(sys.argv[1]))',"
    " life], env=env)\n"
    "    time.sleep(gap)\n"
)


def _options(marker: str) -> CheckOptions:
    return CheckOptions(scope=Scope(engines=(), markers=frozenset({marker}),
                                    exclude_roots=frozenset({os.getpid()})),
                        gpu_backend="none")


def _until_clean(marker: str, **kw: Any) -> CheckReport:
    kw.setdefault("deadline_s", 5.0)
    kw.setdefault("interval_s", 0.25)
    return asyncio.run(check_until_clean([LocalExecutor()], _options(marker), **kw))


@pytest.fixture
def respawner(procs: Processes) -> Iterator[str]:
    marker = f"r-respawn-{uuid.uuid4().hex[:8]}"
    procs.start([sys.executable, "-c", RESPAWNER, "0.2", "0.15"],
                env={**os.environ, "CHILD_MARKER": marker})
    time.sleep(0.5)
    yield marker


def test_a_respawned_stray_is_not_clean(respawner: str) -> None:
    """The issue's reproduction: a stray its parent restarts every ~0.15 s left gaps in which
    the first clean reading was accepted."""
    report = _until_clean(respawner)
    assert report.verdict == Verdict.DIRTY, report.until_clean
    uc = report.until_clean
    assert uc is not None and uc.clean_after_s is None and uc.settle_s == DEFAULT_SETTLE_S
    kinds = {f.kind for f in report.hosts[0].findings}
    assert FindingKind.STRAY_PROCESS in kinds
    if uc.respawned:  # seen again inside a window: ended at once, and says so
        respawned = [f for f in report.hosts[0].findings if f.kind == FindingKind.RESPAWNED]
        assert respawned and "after the host had read clean" in respawned[0].message
        assert report.elapsed_s < 5.0


def test_without_a_settle_window_the_respawner_reads_clean(respawner: str) -> None:
    """The control: the respawner does leave clean gaps, which the old rule (first clean
    reading wins) reported as CLEAN."""
    report = _until_clean(respawner, settle_s=0.0)
    assert report.verdict == Verdict.CLEAN


def test_a_clean_host_holds_for_the_window() -> None:
    started = time.monotonic()
    report = _until_clean(f"nobody-has-{uuid.uuid4().hex}")
    elapsed = time.monotonic() - started
    assert report.verdict == Verdict.CLEAN
    uc = report.until_clean
    assert uc is not None and not uc.respawned
    assert uc.clean_after_s is not None and uc.clean_after_s < 3.0
    assert uc.clean_for_s >= DEFAULT_SETTLE_S
    assert uc.clean_readings >= MIN_SETTLE_READINGS
    assert elapsed >= DEFAULT_SETTLE_S


def test_a_stray_that_exits_for_good_is_clean_after_it(procs: Processes) -> None:
    marker = f"r-exits-{uuid.uuid4().hex[:8]}"
    procs.python("import time; time.sleep(1.0)", env={**os.environ, "CLEANSLATE_RUN": marker})
    time.sleep(0.2)
    report = _until_clean(marker)
    assert report.verdict == Verdict.CLEAN
    uc = report.until_clean
    assert uc is not None and uc.attempts > MIN_SETTLE_READINGS and not uc.respawned


# --- the window's rules on scripted readings -------------------------------------------------


def _report(*findings: Finding) -> CheckReport:
    verdict = Verdict.DIRTY if any(f.severity == Severity.ERROR for f in findings) else \
        Verdict.CLEAN
    host = HostVerdict(host="h", verdict=verdict, gpu_backend="none", findings=findings,
                       probed_at="2026-01-01T00:00:00Z", probe_elapsed_s=0.01)
    return CheckReport(verdict=verdict, checked_at="2026-01-01T00:00:00Z", elapsed_s=0.01,
                       hosts=(host,))


STRAY = Finding(kind=FindingKind.STRAY_PROCESS, severity=Severity.ERROR, pid=42,
                message="sglang process PID 42 is running", evidence={"ppid": 7})
MEMORY = Finding(kind=FindingKind.GPU_MEMORY_HELD, severity=Severity.ERROR, gpu=0,
                 message="GPU 0: 900 MiB in use")
CLEAN = _report()


def _scripted(monkeypatch: pytest.MonkeyPatch, readings: list[CheckReport],
              pause_s: float = 0.0) -> list[int]:
    taken: list[int] = []

    async def fake(executors: Any, options: Any) -> CheckReport:
        await asyncio.sleep(pause_s)
        taken.append(1)
        return readings[min(len(taken), len(readings)) - 1]

    monkeypatch.setattr(check_module, "check_hosts", fake)
    return taken


def test_a_dirty_reading_restarts_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """GPU memory still being released inside the window: not a respawn, the window starts
    over and must hold again in full."""
    taken = _scripted(monkeypatch, [CLEAN, CLEAN, _report(MEMORY), *[CLEAN] * 200],
                      pause_s=0.02)
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=10, interval_s=0.05,
                                           settle_s=0.2))
    assert report.verdict == Verdict.CLEAN
    uc = report.until_clean
    assert uc is not None and uc.clean_readings >= MIN_SETTLE_READINGS
    assert uc.clean_for_s >= 0.2 and len(taken) > 3 + MIN_SETTLE_READINGS - 1


def test_an_engine_process_after_a_clean_reading_is_dirty_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = _scripted(monkeypatch, [_report(STRAY), CLEAN, _report(STRAY), *[CLEAN] * 200])
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=10, interval_s=0.01))
    assert report.verdict == Verdict.DIRTY and len(taken) == 3
    assert report.until_clean is not None and report.until_clean.respawned
    respawned = [f for f in report.hosts[0].findings if f.kind == FindingKind.RESPAWNED]
    assert respawned[0].pid == 42 and respawned[0].severity == Severity.ERROR
    assert "parent PID 7" in respawned[0].message


def test_a_window_open_at_the_deadline_may_finish(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline bounds the wait for a first clean reading, not the confirmation of it."""
    _scripted(monkeypatch, [_report(MEMORY), *[CLEAN] * 500], pause_s=0.02)
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=0.1, interval_s=0.04,
                                           settle_s=0.2))
    assert report.verdict == Verdict.CLEAN
    assert 0.1 < report.elapsed_s < 0.1 + 0.2 + 0.5


def test_never_clean_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, [_report(MEMORY)])
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=0.3, interval_s=0.05))
    assert report.verdict == Verdict.DIRTY
    uc = report.until_clean
    assert uc is not None and uc.clean_after_s is None and uc.clean_readings == 0
    assert not uc.respawned


def test_zero_settle_accepts_the_first_clean_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = _scripted(monkeypatch, [_report(MEMORY), CLEAN, _report(STRAY)])
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=5, interval_s=0.01,
                                           settle_s=0))
    assert report.verdict == Verdict.CLEAN and len(taken) == 2


# --- a release under way opens the window -----------------------------------------------------


HELD_BY = Finding(kind=FindingKind.GPU_MEMORY_HELD, severity=Severity.ERROR, gpu=0,
                  message="GPU 0: 900 MiB in use; held by PIDs 42", evidence={"pids": [42]})


def test_a_release_does_not_open_the_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The last process is gone and the driver is still releasing its memory: those readings
    are taken back to back but count for nothing; the window opens on the first clean reading
    and must hold ``settle_s`` from there (issue 23: a window opened on a release let a stray
    that its parent restarted just after read CLEAN)."""
    taken = _scripted(monkeypatch, [*[_report(MEMORY)] * 15, *[CLEAN] * 200], pause_s=0.02)
    started = time.monotonic()
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=10, interval_s=0.25,
                                           settle_s=0.2))
    assert report.verdict == Verdict.CLEAN
    uc = report.until_clean
    assert uc is not None and uc.window_after_s is not None and uc.clean_after_s is not None
    assert uc.window_after_s == uc.clean_after_s
    assert uc.clean_after_s < 15 * 0.25  # the releasing readings were back to back
    assert uc.clean_for_s >= 0.2 and uc.clean_readings >= MIN_SETTLE_READINGS
    assert uc.clean_readings == len(taken) - 15
    assert time.monotonic() - started >= uc.clean_after_s + 0.2


def test_memory_that_comes_back_after_a_clean_reading_closes_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = _scripted(monkeypatch, [_report(MEMORY), CLEAN, _report(MEMORY), *[CLEAN] * 200],
                      pause_s=0.02)
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=10, interval_s=0.05,
                                           settle_s=0.2))
    assert report.verdict == Verdict.CLEAN
    uc = report.until_clean
    assert uc is not None and uc.window_after_s == uc.clean_after_s  # a new window, opened clean
    assert len(taken) > 3 + MIN_SETTLE_READINGS - 1


@pytest.mark.parametrize("finding", [HELD_BY, STRAY])
def test_a_visible_holder_is_not_a_release(monkeypatch: pytest.MonkeyPatch,
                                           finding: Finding) -> None:
    """Memory that a process holds, or a stray, never opens the window; readings keep their
    interval."""
    taken = _scripted(monkeypatch, [_report(finding)] * 3 + [CLEAN] * 200)
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=10, interval_s=0.1,
                                           settle_s=0.2))
    uc = report.until_clean
    assert report.verdict == Verdict.CLEAN and uc is not None and not uc.respawned
    assert uc.window_after_s == uc.clean_after_s
    assert uc.window_after_s is not None and uc.window_after_s >= 0.3  # three 0.1 s intervals
    assert len(taken) >= 3 + MIN_SETTLE_READINGS


def test_a_stray_after_a_release_reading_is_a_respawn(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reading with no process at all, then an engine process: something started it."""
    _scripted(monkeypatch, [_report(MEMORY), _report(STRAY), *[CLEAN] * 200])
    report = asyncio.run(check_until_clean([], CheckOptions(), deadline_s=10, interval_s=0.01))
    assert report.verdict == Verdict.DIRTY
    assert report.until_clean is not None and report.until_clean.respawned
    respawned = [f for f in report.hosts[0].findings if f.kind == FindingKind.RESPAWNED]
    assert "with no process left" in respawned[0].message  # it never read clean
