"""systemd-logind's ``RemoveIPC=`` (issue 28; vllm#54259): systemd's precedence over the main
file and the drop-ins, the system-user boundary, unreadable files as unknown, and the host
script on fixture trees (``config_root``), run as a non-system user beside a process named
``systemd-logind``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cleanslate.doctor import _doctor_script as script
from cleanslate.doctor.analyze import analyze
from cleanslate.doctor.logind import DROPIN_DIRS, MAIN_FILES, logind_ipc
from cleanslate.doctor.report import DoctorFinding, HostDoctor
from cleanslate.hosts.scripts import script_source
from tests.conftest import Processes
from tests.doctor.captures import h200x1_raw

#: A UID above every system-user boundary, with no passwd entry on these machines.
USER_UID = 54321
DEBIAN_MAIN = ("# Entries in this file show the compile time defaults.\n\n[Login]\n"
               "#KillUserProcesses=no\n#RemoveIPC=yes\n#InhibitorsMax=8192\n")


def _text(text: str) -> dict[str, Any]:
    return {"text": text}


MISSING: dict[str, Any] = {"missing": True}
DENIED: dict[str, Any] = {"error": "PermissionError: Permission denied"}


def _raw(files: dict[str, dict[str, Any]] | None = None, *, uid: int = USER_UID,
         login_defs: str | None = None, systemd_pc: str | None = None,
         pid1: str = "systemd\n", dirs: dict[str, dict[str, Any]] | None = None
         ) -> dict[str, Any]:
    """The host script's ``env.logind`` for these files (path -> read entry): the drop-in
    folders' listings follow from the drop-ins named."""
    files = dict(files or {})
    listing: dict[str, dict[str, Any]] = {d: dict(MISSING) for d in DROPIN_DIRS}
    for path in files:
        folder, _, name = path.rpartition("/")
        if folder in listing:
            if "names" not in listing[folder]:
                listing[folder] = {"names": []}
            listing[folder]["names"].append(name)
    listing.update(dirs or {})
    for path in MAIN_FILES:
        files.setdefault(path, dict(MISSING))
    return {"files": files, "dirs": listing, "uid": uid, "user": None,
            "login_defs": _text(login_defs) if login_defs is not None else dict(MISSING),
            "systemd_pc": {"/usr/share/pkgconfig/systemd.pc":
                           _text(systemd_pc) if systemd_pc is not None else dict(MISSING)},
            "pid1_comm": _text(pid1)}


def _ipc(raw: dict[str, Any], pids: Any = ()) -> Any:
    ipc = logind_ipc(raw, list(pids) if not isinstance(pids, str) else pids)
    assert ipc is not None
    return ipc


def _findings(raw: dict[str, Any], pids: Any = ()) -> list[DoctorFinding]:
    host = h200x1_raw()
    host["env"]["logind"] = raw
    host["env"]["logind_pids"] = list(pids) if not isinstance(pids, str) else pids
    report = analyze(host, host="h")
    return [f for f in report.findings if f.code.startswith("remove_ipc")]


ETC = "/etc/systemd/logind.conf.d"
RUN = "/run/systemd/logind.conf.d"
USR = "/usr/lib/systemd/logind.conf.d"


def test_the_paths_are_the_host_scripts() -> None:
    assert tuple("/" + p for p in script.LOGIND_MAIN) == MAIN_FILES
    assert tuple("/" + p for p in script.LOGIND_DROPINS) == DROPIN_DIRS


def test_a_drop_in_in_etc_hides_the_one_of_the_same_name_in_usr_lib() -> None:
    ipc = _ipc(_raw({f"{USR}/50-vendor.conf": _text("[Login]\nRemoveIPC=no\n"),
                     f"{ETC}/50-vendor.conf": _text("[Login]\n\nRemoveIPC=yes\n")}))
    assert ipc.remove_ipc is True
    assert ipc.setting == f"{ETC}/50-vendor.conf:3: RemoveIPC=yes"
    assert ipc.files == (f"{ETC}/50-vendor.conf",)


def test_the_lexicographically_last_drop_in_wins_whatever_its_folder() -> None:
    ipc = _ipc(_raw({"/etc/systemd/logind.conf": _text("[Login]\nRemoveIPC=no\n"),
                     f"{ETC}/10-site.conf": _text("[Login]\nRemoveIPC=no\n"),
                     f"{USR}/20-vendor.conf": _text("[Login]\nRemoveIPC=yes\n"),
                     f"{RUN}/15-runtime.conf": _text("[Login]\nRemoveIPC=no\n")}))
    assert ipc.remove_ipc is True and ipc.setting == f"{USR}/20-vendor.conf:2: RemoveIPC=yes"
    assert ipc.files == ("/etc/systemd/logind.conf", f"{ETC}/10-site.conf",
                         f"{RUN}/15-runtime.conf", f"{USR}/20-vendor.conf")


def test_a_drop_in_overrides_the_main_file_and_the_last_line_of_a_file_wins() -> None:
    ipc = _ipc(_raw({"/etc/systemd/logind.conf": _text("[Login]\nRemoveIPC=yes\n"),
                     f"{ETC}/60-ipc.conf": _text("[Login]\nRemoveIPC=yes\nRemoveIPC = off\n")}))
    assert ipc.remove_ipc is False and ipc.setting == f"{ETC}/60-ipc.conf:3: RemoveIPC = off"


def test_only_the_first_main_file_that_exists_is_read() -> None:
    ipc = _ipc(_raw({"/run/systemd/logind.conf": _text("[Login]\nRemoveIPC=no\n"),
                     "/usr/lib/systemd/logind.conf": _text("[Login]\nRemoveIPC=yes\n")}))
    assert ipc.remove_ipc is False and ipc.files == ("/run/systemd/logind.conf",)


def test_other_sections_comments_and_values_that_are_not_booleans_do_not_count() -> None:
    ipc = _ipc(_raw({f"{ETC}/60-ipc.conf": _text(
        "RemoveIPC=no\n[Other]\nRemoveIPC=no\n[Login]\n; RemoveIPC=no\nremoveipc=no\n"
        "RemoveIPC=yes\nRemoveIPC=maybe\n")}))
    assert ipc.remove_ipc is True
    assert ipc.setting == (f"{ETC}/60-ipc.conf:7: RemoveIPC=yes ({ETC}/60-ipc.conf:8: "
                           "RemoveIPC=maybe ignored: not a boolean)")


def test_unset_is_the_compiled_in_default_as_the_vendor_file_shows_it() -> None:
    ipc = _ipc(_raw({"/etc/systemd/logind.conf": _text(DEBIAN_MAIN)}))
    assert ipc.remove_ipc is True
    assert ipc.setting == ("RemoveIPC= not set in /etc/systemd/logind.conf: systemd's "
                           "compiled-in default applies, yes as /etc/systemd/logind.conf:5: "
                           "#RemoveIPC=yes shows")
    # A distribution built with RemoveIPC=no (RHEL) shows that default instead.
    rhel = _ipc(_raw({"/etc/systemd/logind.conf": _text("[Login]\n#RemoveIPC=no\n")}))
    assert rhel.remove_ipc is False and "no as /etc/systemd/logind.conf:2" in rhel.setting
    assert _findings(_raw({"/etc/systemd/logind.conf": _text("[Login]\n#RemoveIPC=no\n")})) == []
    # No file at all: upstream's default.
    bare = _ipc(_raw())
    assert bare.remove_ipc is True and bare.files == ()
    assert bare.setting == ("no logind.conf and no drop-in: systemd's compiled-in default "
                            "applies, yes upstream (logind.conf(5))")


def test_an_unreadable_file_after_the_last_assignment_is_unknown_never_no() -> None:
    raw = _raw({"/etc/systemd/logind.conf": _text("[Login]\nRemoveIPC=yes\n"),
                f"{ETC}/60-ipc.conf": DENIED})
    ipc = _ipc(raw)
    assert ipc.remove_ipc is None
    assert ipc.unknown == f"{ETC}/60-ipc.conf: PermissionError: Permission denied"
    (f,) = _findings(raw)
    assert f.code == "remove_ipc_unknown" and f.severity == "warning"
    assert f"{ETC}/60-ipc.conf: PermissionError" in f.message
    # Before the last assignment that was read, it decides nothing.
    known = _ipc(_raw({"/etc/systemd/logind.conf": DENIED,
                       f"{ETC}/60-ipc.conf": _text("[Login]\nRemoveIPC=no\n")}))
    assert known.remove_ipc is False and known.unknown is None
    # A drop-in folder that cannot be listed: its names could sort anywhere.
    unlisted = _ipc(_raw({f"{ETC}/99-last.conf": _text("[Login]\nRemoveIPC=no\n")},
                         dirs={RUN: DENIED}))
    assert unlisted.remove_ipc is None and unlisted.unknown is not None
    assert unlisted.unknown.startswith(f"{RUN}: PermissionError")


def test_the_system_user_boundary() -> None:
    pc = "prefix=/usr\nsystem_uid_max=499\nsystemuidmax=${system_uid_max}\n"
    defs = "UID_MIN 1000\n#SYS_UID_MAX 999\nSYS_UID_MAX 899\n"
    ipc = _ipc(_raw(systemd_pc=pc, login_defs=defs))
    assert ipc.system_uid_max == 499
    assert ipc.system_uid_max_source.startswith(
        "/usr/share/pkgconfig/systemd.pc:2: system_uid_max=499")
    ipc = _ipc(_raw(login_defs=defs))
    assert ipc.system_uid_max == 899
    assert ipc.system_uid_max_source.startswith("/etc/login.defs:3: SYS_UID_MAX 899")
    ipc = _ipc(_raw(login_defs="#SYS_UID_MAX 999\n"))
    assert ipc.system_uid_max == 999 and "not set in /etc/login.defs" in \
        ipc.system_uid_max_source
    yes = {f"{ETC}/60-ipc.conf": _text("[Login]\nRemoveIPC=yes\n")}
    assert _findings(_raw(yes, uid=999)) == []  # a system user: excluded
    assert _findings(_raw(yes, uid=0)) == []  # root: excluded
    assert [f.code for f in _findings(_raw(yes, uid=1000))] == ["remove_ipc"]


def test_where_no_logind_runs_or_could_start_nothing_removes_ipc() -> None:
    yes = {f"{ETC}/60-ipc.conf": _text("[Login]\nRemoveIPC=yes\n")}
    ipc = _ipc(_raw(yes, pid1="tini\n"))
    assert ipc.logind is False
    assert ipc.logind_evidence == "no systemd-logind process, and PID 1 is 'tini', not systemd"
    assert _findings(_raw(yes, pid1="tini\n")) == []
    (f,) = _findings(_raw(yes, pid1="tini\n"), pids=[812])
    assert f.evidence[2] == "systemd-logind runs (pid 812)"
    (f,) = _findings(_raw(yes))
    assert f.evidence[2].startswith("PID 1 is systemd")
    # /proc/1/comm hidden (hidepid): unknown, so said.
    raw = _raw(yes)
    raw["pid1_comm"] = DENIED
    (f,) = _findings(raw)
    assert "whether one runs is unknown" in f.evidence[2]


def test_an_older_host_script_without_the_probe_gives_no_finding() -> None:
    report = analyze(h200x1_raw(), host="h")
    assert report.environment is not None and report.environment.logind is None
    assert not [f for f in report.findings if f.code.startswith("remove_ipc")]


# --- the host script on fixture trees ------------------------------------------------------


@pytest.fixture
def tree() -> Iterator[Path]:
    """A host's root folder that a non-root user can read (pytest's ``tmp_path`` is not)."""
    root = Path(tempfile.mkdtemp(prefix="cleanslate-logind-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        for path in [root, *root.rglob("*")]:
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(root)


def _write(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    for parent in path.relative_to(root).parents:
        (root / parent).chmod(0o755)
    path.write_text(text)
    return path


def _fake_logind(root: Path, procs: Processes) -> int:
    """A real process whose name (``/proc/PID/comm``) is ``systemd-logind``: ``sleep`` under
    that name. The test's ``procs`` ends it by PID."""
    binary = root / "bin" / "systemd-logind"
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(shutil.which("sleep") or "/bin/sleep", binary)
    return procs.start([str(binary), "60"]).pid


def _doctor(root: Path, *, uid: int | None) -> HostDoctor:
    """The host script run under ``uid`` (``None``: this test's user) with its logind files
    read under ``root``, then analyzed."""
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    options = {"nvml": False, "cmd_timeout_s": 5, "config_root": str(root)}
    done = subprocess.run([python, "-I", "-", json.dumps(options)],
                          input=script_source("doctor._doctor_script"), capture_output=True,
                          timeout=30, cwd="/", user=uid)
    assert done.returncode == 0, done.stderr.decode()
    return analyze(json.loads(done.stdout), host="fixture", gpus_expected=False)  # a CPU host


def _as_user() -> int | None:
    """The UID to run the script as a non-system user: :data:`USER_UID` when this test runs as
    root, else this test's own user (when it is not a system user)."""
    if os.geteuid() == 0:
        return USER_UID
    if os.geteuid() <= 999:
        pytest.skip(f"this test runs as system user {os.geteuid()} and cannot change user")
    return None


def _debian_like(root: Path) -> None:
    _write(root, "etc/systemd/logind.conf", DEBIAN_MAIN)
    _write(root, "usr/lib/systemd/logind.conf.d/50-vendor.conf", "[Login]\nRemoveIPC=no\n")
    _write(root, "etc/systemd/logind.conf.d/50-vendor.conf", "[Login]\n# site\nRemoveIPC=yes\n")
    _write(root, "run/systemd/logind.conf.d/20-runtime.conf", "[Login]\nRemoveIPC=no\n")
    _write(root, "etc/login.defs", "UID_MIN 1000\n#SYS_UID_MAX 999\nSYS_UID_MAX 999\n")


def test_the_fixture_host_warns_with_its_evidence(tree: Path, procs: Processes) -> None:
    _debian_like(tree)
    pid = _fake_logind(tree, procs)
    uid = _as_user()
    report = _doctor(tree, uid=uid)
    (f,) = [f for f in report.findings if f.code.startswith("remove_ipc")]
    print(f"{f.severity}: {f.message}\n  means: {f.consequence}\n  evidence: "
          + "\n  evidence: ".join(f.evidence))
    who = f"UID {uid if uid is not None else os.geteuid()}"
    assert f.code == "remove_ipc" and f.severity == "warning"
    assert f.message.startswith(f"systemd-logind removes {who}")
    assert "/dev/shm" in f.consequence and "vllm#54259" in f.consequence
    assert "RemoveIPC=no" in f.consequence
    assert f.evidence[0] == "/etc/systemd/logind.conf.d/50-vendor.conf:3: RemoveIPC=yes"
    assert f.evidence[1].startswith(f"the engine runs as {who}")
    assert "/etc/login.defs:3: SYS_UID_MAX 999" in f.evidence[1]
    assert f.evidence[2] == f"systemd-logind runs (pid {pid})"
    assert report.exit_code == 0  # a warning
    env = report.environment
    assert env is not None and env.logind is not None
    assert env.logind.files == ("/etc/systemd/logind.conf",
                                "/run/systemd/logind.conf.d/20-runtime.conf",
                                "/etc/systemd/logind.conf.d/50-vendor.conf")


def test_the_fixture_host_with_removeipc_no_is_clean(tree: Path, procs: Processes) -> None:
    _debian_like(tree)
    _write(tree, "etc/systemd/logind.conf.d/60-removeipc.conf", "[Login]\nRemoveIPC=no\n")
    _fake_logind(tree, procs)
    report = _doctor(tree, uid=_as_user())
    assert not [f for f in report.findings if f.code.startswith("remove_ipc")]
    env = report.environment
    assert env is not None and env.logind is not None and env.logind.remove_ipc is False
    assert env.logind.setting == \
        "/etc/systemd/logind.conf.d/60-removeipc.conf:2: RemoveIPC=no"


def test_the_fixture_host_masked_with_dev_null_falls_back_on_the_default(
        tree: Path, procs: Processes) -> None:
    """A symlink to ``/dev/null`` in ``/etc`` masks the vendor's drop-in of that name: with
    nothing else set, the compiled-in default the main file shows applies."""
    _write(tree, "etc/systemd/logind.conf", "[Login]\n#RemoveIPC=no\n")
    _write(tree, "usr/lib/systemd/logind.conf.d/50-vendor.conf", "[Login]\nRemoveIPC=yes\n")
    masked = tree / "etc/systemd/logind.conf.d/50-vendor.conf"
    masked.parent.mkdir(parents=True)
    masked.symlink_to("/dev/null")
    _fake_logind(tree, procs)
    report = _doctor(tree, uid=_as_user())
    env = report.environment
    assert env is not None and env.logind is not None
    assert env.logind.remove_ipc is False
    assert "no as /etc/systemd/logind.conf:2: #RemoveIPC=no shows" in env.logind.setting
    assert env.logind.files == ("/etc/systemd/logind.conf",
                                "/etc/systemd/logind.conf.d/50-vendor.conf")


def test_the_fixture_host_as_root_is_clean(tree: Path, procs: Processes) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the host script as root")
    _debian_like(tree)
    _fake_logind(tree, procs)
    report = _doctor(tree, uid=None)
    env = report.environment
    assert env is not None and env.logind is not None
    assert env.logind.uid == 0 and env.logind.remove_ipc is True
    assert not [f for f in report.findings if f.code.startswith("remove_ipc")]


def test_an_unreadable_drop_in_on_the_fixture_host_is_unknown(
        tree: Path, procs: Processes) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file this user cannot read (as another user)")
    _debian_like(tree)
    _write(tree, "etc/systemd/logind.conf.d/60-removeipc.conf",
           "[Login]\nRemoveIPC=no\n").chmod(0o000)
    _fake_logind(tree, procs)
    report = _doctor(tree, uid=USER_UID)
    (f,) = [f for f in report.findings if f.code.startswith("remove_ipc")]
    print(f"{f.severity}: {f.message}\n  evidence: " + "\n  evidence: ".join(f.evidence))
    assert f.code == "remove_ipc_unknown" and f.severity == "warning"
    assert f.message == (f"whether systemd-logind removes UID {USER_UID}'s shared memory at "
                         "logout is unknown: /etc/systemd/logind.conf.d/60-removeipc.conf: "
                         "PermissionError: Permission denied")
    # A drop-in folder the user cannot list.
    (tree / "etc/systemd/logind.conf.d").chmod(0o311)
    report = _doctor(tree, uid=USER_UID)
    (f,) = [f for f in report.findings if f.code.startswith("remove_ipc")]
    assert f.code == "remove_ipc_unknown"
    assert "/etc/systemd/logind.conf.d: PermissionError" in f.message
