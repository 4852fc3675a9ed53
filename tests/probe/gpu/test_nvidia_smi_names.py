"""A process name with a newline cannot make the ``nvidia-smi`` backend UNKNOWN (issue 23).

``nvidia-smi`` prints a compute process's name (its ``argv[0]``) raw. Any local user can start a
CUDA process with ``exec -a $'python3\\n...'``; its ``--query-compute-apps`` row then spans
lines, the CSV could not be read, and the backend's reading was UNKNOWN for as long as that
process ran. The outputs replayed here are real: one H200 (driver 580.159.04) while two CUDA
processes ran, one with newlines in ``argv[0]``, the other named ``a<b>&c "d"``
(``tests/fixtures/forged-process-name-h200x1/``, README there). The backend now asks for no
name column; a GPU process is named by the snapshot's process table (``/proc``).
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from cleanslate.hosts.local import LocalExecutor
from cleanslate.probe.gpu.nvidia_smi import NvidiaSmiBackend, parse_apps_query

FORGED = Path(__file__).resolve().parents[2] / "fixtures" / "forged-process-name-h200x1"
UUID = "GPU-41941f1b-0065-07d9-31a0-1086a91f2bfc"

#: A stand-in ``nvidia-smi`` that answers each query with what the real one printed to it.
SCRIPT = """\
#!/bin/sh
D="{data}"
echo "$*" >> "{calls}"
case "$*" in
  *--query-gpu=*) n=query ;;
  *--query-compute-apps=*process_name*) n=apps_named ;;
  *--query-compute-apps=*) n=apps ;;
  *) echo "stand-in nvidia-smi: unexpected arguments: $*" >&2; exit 99 ;;
esac
cat "$D/$n.out"
cat "$D/$n.err" >&2
exit "$(sed 's/^exit=//' "$D/$n.exit")"
"""


def _fixture(stem: str) -> tuple[str, str, int]:
    code = int((FORGED / f"{stem}.exit").read_text().strip().removeprefix("exit="))
    return (FORGED / f"{stem}.out").read_text(), (FORGED / f"{stem}.err").read_text(), code


def test_the_named_query_of_the_capture_cannot_be_read() -> None:
    """What the backend got before: the row of the renamed process spans four lines."""
    assert "\n    Remapped Rows\n" in _fixture("apps_named")[0]
    assert parse_apps_query(*_fixture("apps_named")).error is not None


def test_a_newline_in_a_process_name_leaves_the_reading_ok(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``ok=False`` ("printed a row cleanslate cannot read"), the host UNKNOWN."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    calls = tmp_path / "calls"
    smi.write_text(SCRIPT.format(data=FORGED, calls=calls))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    reading = asyncio.run(NvidiaSmiBackend().read(LocalExecutor(), timeout=10))
    assert reading.ok, reading.error
    (gpu,) = reading.gpus
    assert gpu.uuid == UUID and gpu.memory_used_mib == 3099
    assert sorted((p.pid, p.used_mib, p.name) for p in gpu.processes) == [
        (457, 1542, None), (458, 1542, None)]
    assert all("process_name" not in line for line in calls.read_text().splitlines())
