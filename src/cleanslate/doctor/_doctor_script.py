"""The doctor's host script: a self-contained, stdlib-only reader of what a GPU host says.

Like the check's collector (:mod:`cleanslate.probe._collect_script`), this module is imported by
nothing at run time: its *source* is run by the host's Python (``python3 -I -``, the source on
stdin), locally as a child process and remotely over SSH, so both give the same JSON by
construction. It imports nothing outside the standard library (``pynvml`` only when the host
has it) and runs on any Python 3.8 or newer.

It gathers raw text and values; it judges nothing (:mod:`cleanslate.doctor.parse` and
:mod:`cleanslate.doctor.findings` do, on this machine). Every probe may fail: a missing tool is
``{"missing": true}``, a command that fails keeps its exit status and output, a file that cannot
be read records why, and an NVML field that the driver does not support is the string
``"ERR NVMLError_NotSupported: Not Supported"`` (the form of the captured ``nvml.json``).

Input: one JSON object as the first argument (``cmd_timeout_s``, ``nvml``, and ``config_root``:
the folder systemd-logind's and ``login.defs``' files are read under, ``/`` on a host, a fixture
tree in tests).
Output: one JSON object on stdout: ``commands``, ``nvml``, ``env``, ``elapsed_s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

#: The ``nvidia-smi`` commands read, by the name the report uses.
SMI_COMMANDS = {
    "smi_q": ["-q"],
    "topo_m": ["topo", "-m"],
    "p2p_r": ["topo", "-p2p", "r"],
    "p2p_w": ["topo", "-p2p", "w"],
    "p2p_n": ["topo", "-p2p", "n"],
    "p2p_a": ["topo", "-p2p", "a"],
}
_LIMIT = 1 << 20
#: Bytes of ``nvidia-smi -q`` kept: 8 MiB (an 8-GPU host prints about 120 KiB; process names,
#: up to 128 KiB each, can make it longer, and a cut log cannot be checked whole).
SMI_Q_LIMIT = 1 << 23


#: systemd-logind's main configuration file: the first of these that exists is used
#: (``logind.conf(5)``, "Configuration Directories and Precedence").
LOGIND_MAIN = ("etc/systemd/logind.conf", "run/systemd/logind.conf",
               "usr/local/lib/systemd/logind.conf", "usr/lib/systemd/logind.conf")
#: Its drop-in folders, highest priority first (a file in ``/etc`` hides one of the same name
#: below it).
LOGIND_DROPINS = ("etc/systemd/logind.conf.d", "run/systemd/logind.conf.d",
                  "usr/local/lib/systemd/logind.conf.d", "usr/lib/systemd/logind.conf.d")
#: Where systemd's pkg-config file, which names the system-user boundary it was built with
#: (``system_uid_max=``), is installed.
SYSTEMD_PC = ("usr/share/pkgconfig/systemd.pc", "usr/lib/pkgconfig/systemd.pc",
              "usr/lib64/pkgconfig/systemd.pc")
#: Drop-ins read per folder, at most.
MAX_DROPINS = 256


def _text(data: bytes, limit: int = _LIMIT) -> str:
    return data[:limit].decode("utf-8", "replace")


def run_command(argv: list[str], timeout: float, limit: int = _LIMIT) -> dict[str, Any]:
    """Run ``argv`` with ``timeout`` seconds: its exit status and output (``limit`` bytes of
    each; ``stdout_truncated`` when stdout was longer), or why it did not run."""
    path = shutil.which(argv[0])
    if path is None:
        return {"argv": argv, "missing": True}
    started = time.monotonic()
    try:
        done = subprocess.run([path, *argv[1:]], stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"argv": argv, "timed_out": True, "timeout_s": timeout}
    except OSError as exc:
        return {"argv": argv, "error": f"{type(exc).__name__}: {exc}"}
    out = {"argv": argv, "rc": done.returncode, "stdout": _text(done.stdout, limit),
           "stderr": _text(done.stderr, limit),
           "elapsed_s": round(time.monotonic() - started, 4)}
    if len(done.stdout) > limit:
        out["stdout_truncated"] = True
    return out


def read_text(path: str, limit: int = _LIMIT) -> dict[str, Any]:
    """A file's text, or ``{"missing": true}``, or ``{"error": why}`` (unreadable)."""
    try:
        with open(path, "rb") as fh:
            return {"text": _text(fh.read(limit))}
    except FileNotFoundError:
        return {"missing": True}
    except OSError as exc:
        return {"error": f"{type(exc).__name__}: {exc.strerror or exc}"}


def read_logind(root: str) -> dict[str, Any]:
    """What decides whether systemd-logind removes this user's IPC objects when its last session
    ends: its configuration files (``files``: each candidate main file and drop-in by its path
    on the host, read or why not; ``dirs``: each drop-in folder's ``.conf`` names), the user
    this script (and so an engine started the same way) runs as, ``/etc/login.defs`` and
    systemd's pkg-config file (the system-user boundary). Files are read under ``root``."""
    def under(rel: str) -> str:
        return os.path.join(root, rel)

    out: dict[str, Any] = {"files": {}, "dirs": {}}
    for rel in LOGIND_MAIN:
        out["files"]["/" + rel] = read_text(under(rel), 1 << 16)
    for rel in LOGIND_DROPINS:
        try:
            names = sorted(n for n in os.listdir(under(rel)) if n.endswith(".conf"))
        except FileNotFoundError:
            out["dirs"]["/" + rel] = {"missing": True}
            continue
        except OSError as exc:
            out["dirs"]["/" + rel] = {"error": f"{type(exc).__name__}: {exc.strerror or exc}"}
            continue
        out["dirs"]["/" + rel] = {"names": names[:MAX_DROPINS]}
        if len(names) > MAX_DROPINS:
            out["dirs"]["/" + rel]["truncated"] = len(names)
        for name in names[:MAX_DROPINS]:
            out["files"][f"/{rel}/{name}"] = read_text(under(f"{rel}/{name}"), 1 << 16)
    out["login_defs"] = read_text(under("etc/login.defs"), 1 << 18)
    out["systemd_pc"] = {}
    for rel in SYSTEMD_PC:
        found = read_text(under(rel), 1 << 16)
        out["systemd_pc"]["/" + rel] = found
        if "missing" not in found:
            break
    uid = os.geteuid()
    out["uid"] = uid
    try:
        out["user"] = pwd.getpwuid(uid).pw_name
    except KeyError:
        out["user"] = None
    out["pid1_comm"] = read_text("/proc/1/comm", 256)
    return out


def _nvml_error(exc: BaseException) -> str:
    return f"ERR {type(exc).__name__}: {exc}"


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (int, float, str)) or value is None:
        return value
    if hasattr(value, "_length_"):  # a ctypes array (nvmlDeviceGetCpuAffinity)
        return [_plain(v) for v in value]
    return str(value)


def read_nvml() -> dict[str, Any]:
    """Driver, devices and pairs through ``pynvml``; ``{"missing": ...}`` when it does not import,
    ``{"error": ...}`` when NVML does not start (no driver)."""
    try:
        import pynvml as n  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:
        return {"missing": f"{type(exc).__name__}: {exc}"}
    try:
        n.nvmlInit()
    except Exception as exc:
        return {"error": _nvml_error(exc)}

    def get(fn: Any, *args: Any) -> Any:
        try:
            return _plain(fn(*args))
        except Exception as exc:
            return _nvml_error(exc)

    out: dict[str, Any] = {"driver": get(n.nvmlSystemGetDriverVersion),
                           "cuda": get(n.nvmlSystemGetCudaDriverVersion_v2), "gpus": [],
                           "p2p": []}
    count = get(n.nvmlDeviceGetCount)
    if not isinstance(count, int):
        out["count_error"] = count
        count = 0
    reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    handles: list[Any] = []
    for i in range(count):
        try:
            h = n.nvmlDeviceGetHandleByIndex(i)
        except Exception as exc:
            out["gpus"].append({"index": i, "handle": _nvml_error(exc)})
            handles.append(None)
            continue
        handles.append(h)
        d: dict[str, Any] = {"index": i}
        fields = [
            ("name", n.nvmlDeviceGetName, ()), ("uuid", n.nvmlDeviceGetUUID, ()),
            ("persistence", n.nvmlDeviceGetPersistenceMode, ()),
            ("mig", n.nvmlDeviceGetMigMode, ()), ("ecc", n.nvmlDeviceGetEccMode, ()),
            ("pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration, ()),
            ("pcie_gen_max", n.nvmlDeviceGetMaxPcieLinkGeneration, ()),
            ("pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth, ()),
            ("pcie_width_max", n.nvmlDeviceGetMaxPcieLinkWidth, ()),
            ("pcie_replay", n.nvmlDeviceGetPcieReplayCounter, ()),
            ("power_limit", n.nvmlDeviceGetPowerManagementLimit, ()),
            ("power_default", n.nvmlDeviceGetPowerManagementDefaultLimit, ()),
            ("temp", n.nvmlDeviceGetTemperature, (0,)),
            ("numa", getattr(n, "nvmlDeviceGetNumaNodeId", None), ()),
            ("remapped", n.nvmlDeviceGetRemappedRows, ()),
            ("retired_pending", n.nvmlDeviceGetRetiredPagesPendingStatus, ()),
            ("ecc_uncorrected_volatile", n.nvmlDeviceGetTotalEccErrors, (1, 0)),
            ("cpu_affinity", n.nvmlDeviceGetCpuAffinity, (4,)),
        ]
        if reasons is not None:
            fields.append(("throttle", reasons, ()))
        for name, fn, args in fields:
            d[name] = get(fn, h, *args) if fn is not None else "ERR missing: not in pynvml"
        d["pci"] = get(lambda h: n.nvmlDeviceGetPciInfo(h).busId, h)
        d["nvlink"] = [get(n.nvmlDeviceGetNvLinkState, h, link)
                       for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18))]
        out["gpus"].append(d)
    caps = (("read", 0), ("write", 1), ("nvlink", 2), ("atomics", 3))
    for i in range(len(handles)):
        for j in range(len(handles)):
            if i == j or handles[i] is None or handles[j] is None:
                continue
            pair: dict[str, Any] = {"a": i, "b": j}
            for name, index in caps:
                pair[name] = get(n.nvmlDeviceGetP2PStatus, handles[i], handles[j], index)
            pair["ancestor"] = get(n.nvmlDeviceGetTopologyCommonAncestor, handles[i],
                                   handles[j])
            out["p2p"].append(pair)
    with contextlib.suppress(Exception):
        n.nvmlShutdown()
    return out


def read_env(timeout: float, config_root: str = "/") -> dict[str, Any]:
    """What the host runs in: virtualization, containers, kernel, what NCCL needs, and
    systemd-logind's ``RemoveIPC=`` (:func:`read_logind`, its files under ``config_root``)."""
    env: dict[str, Any] = {}
    env["detect_virt"] = run_command(["systemd-detect-virt"], timeout)
    env["cpuinfo_hypervisor"] = None
    cpuinfo = read_text("/proc/cpuinfo", 1 << 22)
    if "text" in cpuinfo:
        flags = next((line for line in cpuinfo["text"].splitlines()
                      if line.startswith(("flags", "Features"))), "")
        model = next((line for line in cpuinfo["text"].splitlines()
                      if line.startswith("model name")), "")
        env["cpuinfo_hypervisor"] = "hypervisor" in flags.split()
        env["cpu_model"] = model.split(":", 1)[-1].strip() or None
    else:
        env["cpuinfo_error"] = cpuinfo
    env["dmi"] = {name: read_text("/sys/class/dmi/id/" + name, 4096)
                  for name in ("sys_vendor", "product_name")}
    env["kernel"] = os.uname().release
    environ = read_text("/proc/1/environ", 1 << 20)
    if "text" in environ:
        values = [v for v in environ["text"].split("\0") if v.startswith("container=")]
        env["pid1_container"] = {"value": values[0].split("=", 1)[1] if values else None}
    else:
        env["pid1_container"] = environ
    env["dockerenv"] = os.path.exists("/.dockerenv")
    env["containerenv"] = os.path.exists("/run/.containerenv")
    env["cgroup_self"] = read_text("/proc/self/cgroup", 65536)
    env["cgroup_pid1"] = read_text("/proc/1/cgroup", 65536)
    env["cmdline"] = read_text("/proc/cmdline", 65536)
    try:
        env["iommu_groups"] = len(os.listdir("/sys/kernel/iommu_groups"))
    except OSError as exc:
        env["iommu_groups"] = f"{type(exc).__name__}: {exc.strerror or exc}"
    try:
        st = os.statvfs("/dev/shm")
        env["shm"] = {"total_bytes": st.f_frsize * st.f_blocks,
                      "free_bytes": st.f_frsize * st.f_bavail}
    except OSError as exc:
        env["shm"] = {"error": f"{type(exc).__name__}: {exc.strerror or exc}"}
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        env["memlock"] = {"soft": soft, "hard": hard, "unlimited": resource.RLIM_INFINITY}
    except Exception as exc:
        env["memlock"] = {"error": f"{type(exc).__name__}: {exc}"}
    meminfo = read_text("/proc/meminfo", 65536)
    env["hugepages"] = ("\n".join(line for line in meminfo["text"].splitlines()
                                  if "Huge" in line) if "text" in meminfo else meminfo)
    persistenced = []
    logind = []
    try:
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                comm = read_text(f"/proc/{pid}/comm", 256).get("text", "").strip()
                if comm == "nvidia-persiste" or comm.startswith("nvidia-persistenced"):
                    persistenced.append(int(pid))
                elif comm == "systemd-logind":
                    logind.append(int(pid))
        env["persistenced"] = sorted(persistenced)
        env["logind_pids"] = sorted(logind)
    except OSError as exc:
        env["persistenced"] = f"{type(exc).__name__}: {exc.strerror or exc}"
        env["logind_pids"] = env["persistenced"]
    env["logind"] = read_logind(config_root)
    env["driver_version_file"] = read_text("/proc/driver/nvidia/version", 4096)
    return env


def main() -> None:
    options = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    timeout = float(options.get("cmd_timeout_s") or 10.0)
    started = time.monotonic()
    out: dict[str, Any] = {"python": sys.version.split()[0]}
    with ThreadPoolExecutor(max_workers=len(SMI_COMMANDS) + 2) as pool:
        smi = shutil.which("nvidia-smi")
        futures = {}
        if smi is not None:
            futures = {name: pool.submit(run_command, ["nvidia-smi", *args], timeout,
                                         SMI_Q_LIMIT if name == "smi_q" else _LIMIT)
                       for name, args in SMI_COMMANDS.items()}
        nvml = pool.submit(read_nvml) if options.get("nvml", True) else None
        env = pool.submit(read_env, timeout, str(options.get("config_root") or "/"))
        out["commands"] = ({name: f.result() for name, f in futures.items()} if smi
                           else {"nvidia_smi": {"argv": ["nvidia-smi"], "missing": True}})
        out["nvml"] = nvml.result() if nvml is not None else {"missing": "not asked for"}
        out["env"] = env.result()
    out["elapsed_s"] = round(time.monotonic() - started, 4)
    json.dump(out, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
