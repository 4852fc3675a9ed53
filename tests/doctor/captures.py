"""The doctor's raw host JSON built from real captures (``tests/fixtures/doctor/``,
``tests/fixtures/nvidia-h200x2/``), and edits of it for the cases no machine here shows."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
H200X1 = FIXTURES / "doctor" / "h200x1"
H200X2 = FIXTURES / "nvidia-h200x2"


def ok(text: str, *argv: str) -> dict[str, Any]:
    return {"argv": ["nvidia-smi", *argv], "rc": 0, "stdout": text, "stderr": "",
            "elapsed_s": 0.1}


def h200x1_raw() -> dict[str, Any]:
    """The single H200 in a Firecracker microVM, from the files ``capture.sh`` wrote (the
    environment probes translated into the host script's form, value for value)."""
    def read(name: str) -> str:
        return (H200X1 / name).read_text()

    commands = {"smi_q": ok(read("smi-q.txt"), "-q"), "topo_m": ok(read("topo-m.txt"))}
    for letter in "rwna":
        commands[f"p2p_{letter}"] = ok(read(f"topo-p2p-{letter}.txt"))
    nvml = json.loads(read("nvml.json"))
    nvml["p2p"] = []
    shm_total = int(read("env-shm.txt").splitlines()[1].split()[1])
    cgroup = read("env-cgroup.txt").splitlines()
    env = {
        "detect_virt": {"argv": ["systemd-detect-virt"], "missing": True},
        "cpuinfo_hypervisor": read("env-cpuinfo-hypervisor.txt").startswith("hypervisor"),
        "dmi": {"sys_vendor": {"missing": True}, "product_name": {"missing": True}},
        "kernel": read("env-uname.txt").split()[2],
        "pid1_container": {"error": "PermissionError: Permission denied"},
        "dockerenv": "/.dockerenv" in read("env-container-files.txt").splitlines()[1],
        "containerenv": False,
        "cgroup_self": {"text": cgroup[0] + "\n"},
        "cgroup_pid1": {"text": cgroup[1] + "\n"},
        "cmdline": {"text": read("env-cmdline.txt")},
        "iommu_groups": 0,
        "shm": {"total_bytes": shm_total, "free_bytes": shm_total},
        "memlock": {"soft": -1, "hard": -1, "unlimited": -1},
        "hugepages": read("env-hugepages.txt"),
        "persistenced": [],
        "driver_version_file": {"missing": True},
    }
    return {"python": "3.12.3", "commands": commands, "nvml": nvml, "env": env}


def h200x2_smi_raw() -> dict[str, Any]:
    """Two H200 with NV18, from ``nvidia-smi -q`` and ``topo -m`` of that machine, without
    NVML (its capture has no P2P status: every P2P cell is unknown) and with the single H200's
    environment."""
    raw = h200x1_raw()
    raw["commands"] = {"smi_q": ok((H200X2 / "idle_q.out").read_text(), "-q"),
                       "topo_m": ok((H200X2 / "topo.out").read_text(), "topo", "-m")}
    raw["nvml"] = {"missing": "ModuleNotFoundError: No module named 'pynvml'"}
    return raw


P2P_TEMPLATE = " \t\x1b[4mGPU0\tGPU1\t\x1b[0m\n GPU0\tX\t{ab}\t\n GPU1\t{ba}\tX\t\n\n" \
    "Legend:\n\n  X    = Self\n  OK   = Status Ok\n  NS   = Not supported\n"


def with_p2p(raw: dict[str, Any], letter: str, status: str) -> dict[str, Any]:
    """``raw`` with a two-GPU ``topo -p2p LETTER`` matrix whose off-diagonal cells are
    ``status`` (the layout of the real single-GPU capture, one GPU more)."""
    out = copy.deepcopy(raw)
    out["commands"][f"p2p_{letter}"] = ok(P2P_TEMPLATE.format(ab=status, ba=status))
    return out


def edit_smi(raw: dict[str, Any], gpu: int, path_line: str | tuple[str, ...], old: str,
             new: str) -> dict[str, Any]:
    """``raw`` with one line of GPU ``gpu``'s ``nvidia-smi -q`` section changed: the first
    line after ``path_line`` (a key of the section, e.g. ``Link Width``, or keys in order:
    ``("Link Width", "Current")``) whose value is ``old`` gets ``new``."""
    out = copy.deepcopy(raw)
    text: str = out["commands"]["smi_q"]["stdout"]
    sections = re.split(r"(?m)^(?=GPU [0-9A-Fa-f]{8}:)", text)
    body = sections[gpu + 1]
    start = 0
    for key in (path_line,) if isinstance(path_line, str) else path_line:
        start = body.index(key, start)
    at = body.index(f": {old}\n", start)
    sections[gpu + 1] = body[:at] + f": {new}\n" + body[at + len(old) + 3:]
    out["commands"]["smi_q"]["stdout"] = "".join(sections)
    return out
