"""``nvidia-smi -q`` text that a process name wrote, or that is not the log at all (issue 23).

``nvidia-smi -q`` prints each compute process's name (its ``argv[0]``) raw, so any local user
can print lines into it: a CUDA process started with ``exec -a $'python3\\n    Remapped
Rows\\n        Pending : No'`` wrote a second ``Remapped Rows/Pending`` into the GPU's section,
the doctor's parser kept the last one, and a GPU with a row remap pending read "NO PROBLEM
FOUND". The captures are real (``tests/fixtures/forged-process-name-h200x1/``): only the fault
is forged here, by marking the real ``Pending`` field ``Yes``. Output that does not parse as the
log (nothing, garbage, fewer GPU sections than it says) said "NO PROBLEM FOUND" too; it is now
"could not tell", exit 3.
"""

from __future__ import annotations

import copy
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cleanslate.doctor._doctor_script import SMI_Q_LIMIT, run_command
from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.parse import SmiParseError, parse_smi_q
from tests.doctor.captures import H200X2, edit_smi, h200x1_raw, ok

FORGED = Path(__file__).resolve().parents[1] / "fixtures" / "forged-process-name-h200x1"
NO_NVML = {"missing": "ModuleNotFoundError: No module named 'pynvml'"}


def _raw(smi_q: str) -> dict[str, Any]:
    """The single H200's host JSON with this ``nvidia-smi -q`` text and no NVML (a host
    without pynvml: ``nvidia-smi -q`` is then where the GPU's health is read)."""
    raw = h200x1_raw()
    raw["commands"]["smi_q"] = ok(smi_q, "-q")
    raw["nvml"] = dict(NO_NVML)
    return raw


def _faulty(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with the GPU's real ``Remapped Rows/Pending`` field (the first) read ``Yes``."""
    return edit_smi(raw, 0, ("Remapped Rows", "Pending"), "No", "Yes")


def test_a_process_name_cannot_hide_a_faulty_gpu() -> None:
    """Before: exit 0 and no finding; the name's ``Pending : No`` overrode the GPU's."""
    text = (FORGED / "q.out").read_text()
    assert text.count("Remapped Rows\n") == 2  # the GPU's section and the process's name
    clean = analyze(_raw(text), host="h200")
    assert clean.error is None and clean.exit_code == 0
    report = analyze(_faulty(_raw(text)), host="h200")
    assert report.error is None
    pending = [f for f in report.findings if f.code == "remapped_rows_pending"]
    assert pending and pending[0].gpus == (0,), report.findings
    assert report.exit_code == 1
    (gpu,) = report.devices
    assert gpu.remapped_rows_pending is True and gpu.remapped_rows_failure is False


def test_a_field_twice_in_a_gpu_section_cannot_be_told() -> None:
    """A field seen twice outside ``Processes`` (a name that printed a GPU header first, an
    output this parser does not know) is not resolved by keeping either: exit 3."""
    text = (H200X2 / "idle_q.out").read_text()
    line = "    Persistence Mode                                   : Enabled\n"
    at = text.index(line, text.index("GPU 00000000:00:07.0"))
    doubled = text[:at] + line.replace("Enabled", "Disabled") + text[at:]
    with pytest.raises(SmiParseError,
                       match=re.escape("Persistence Mode comes twice in GPU 00000000:00:07.0")):
        parse_smi_q(doubled)
    report = analyze(_raw(doubled), host="h200x2")
    assert report.exit_code == 3 and report.error is not None
    assert "Persistence Mode comes twice" in report.error and not report.devices


def test_gpu_headers_in_process_names_cannot_be_told() -> None:
    """The real capture whose names hold ``GPU 00000000:00:99.0`` and ``...:98.0`` lines: GPU
    sections the host does not have (``Attached GPUs : 1``)."""
    report = analyze(_raw((FORGED / "q_fake_gpus.out").read_text()), host="h200")
    assert report.exit_code == 3 and report.error is not None
    assert "GPU 00000000:00:99.0" in report.error


def _one_gpu_more(text: str) -> str:
    """The two-GPU log with GPU 1's whole section again, as a process name could print it."""
    at = text.index("GPU 00000000:00:07.0")
    return text + text[at:]


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        (lambda t: "", "no `Attached GPUs : N`"),
        (lambda t: "Unable to determine the device handle\n", "no `Attached GPUs : N`"),
        (lambda t: t[: t.index("GPU 00000000:00:07.0")], "1 GPU sections for `Attached GPUs : 2`"),
        (_one_gpu_more, "GPU 00000000:00:07.0 is listed twice"),
        (lambda t: t.replace("Attached GPUs", "Attached GPUs : 2\nAttached GPUs", 1),
         "Attached GPUs"),
        (lambda t: t.replace("Attached GPUs                                          : 2\n", ""),
         "a GPU before `Attached GPUs : N`"),
    ],
    ids=["empty", "garbage", "fewer-sections", "gpu-twice", "attached-twice", "no-attached"],
)
def test_output_that_is_not_the_log_is_exit_3(edit: Any, said: str) -> None:
    """Before: each read "NO PROBLEM FOUND", exit 0 (no GPU section, no finding)."""
    text = edit((H200X2 / "idle_q.out").read_text())
    report = analyze(_raw(text), host="h200x2")
    assert report.exit_code == 3, report.findings
    assert report.error is not None and said in report.error


def test_a_cut_log_is_exit_3() -> None:
    """The host script keeps 8 MiB of ``nvidia-smi -q`` and says when it cut: a cut log cannot
    be checked whole (the count of GPU sections, a field twice)."""
    done = run_command(["head", "-c", str(SMI_Q_LIMIT + 1), "/dev/zero"], 10, SMI_Q_LIMIT)
    assert done["stdout_truncated"] is True and len(done["stdout"]) == SMI_Q_LIMIT
    assert "stdout_truncated" not in run_command(["true"], 10, SMI_Q_LIMIT)
    raw = _raw((H200X2 / "idle_q.out").read_text())
    cut = copy.deepcopy(raw)
    cut["commands"]["smi_q"]["stdout_truncated"] = True
    assert analyze(raw, host="h").exit_code == 0
    report = analyze(cut, host="h")
    assert report.exit_code == 3 and report.error is not None and "cut" in report.error


def _stand_in(folder: Path, smi_q: str) -> dict[str, str]:
    """A ``PATH`` whose ``nvidia-smi`` prints ``smi_q`` for ``-q`` and nothing else."""
    (folder / "q.out").write_text(smi_q)
    smi = folder / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ncase "$1" in -q) cat "{folder}/q.out" ;; esac\nexit 0\n')
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"}


def _doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cleanslate", "doctor"], capture_output=True,
                          text=True, timeout=60, check=False, env=env)


def test_the_command_on_garbage_could_not_tell(tmp_path: Path) -> None:
    """``cleanslate doctor`` as a user runs it, with a stand-in ``nvidia-smi`` on ``PATH`` that
    exits 0 with a message instead of the log. Before: "NO PROBLEM FOUND", exit 0."""
    garbage = _doctor(_stand_in(tmp_path, "Failed to initialize NVML: Unknown Error\n"))
    assert garbage.returncode == 3, garbage.stdout + garbage.stderr
    assert garbage.stdout.strip().splitlines()[-1] == "COULD NOT TELL"
    assert "cannot read as its log" in garbage.stdout and "Traceback" not in garbage.stderr


def test_the_command_on_a_forged_name_finds_the_fault(tmp_path: Path) -> None:
    """The same with the real capture whose process name prints ``Pending : No`` after the
    GPU's faulty ``Pending : Yes``. Before: "NO PROBLEM FOUND", exit 0."""
    forged = _faulty(_raw((FORGED / "q.out").read_text()))["commands"]["smi_q"]["stdout"]
    faulty = _doctor(_stand_in(tmp_path, forged))
    assert faulty.returncode == 1, faulty.stdout + faulty.stderr
    assert "row remap" in faulty.stdout.lower()
    assert faulty.stdout.strip().splitlines()[-1] == "PROBLEMS FOUND"
