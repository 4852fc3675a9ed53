"""The run supervisor: a self-contained, stdlib-only script that starts one engine.

``cleanslate serve`` starts this script in a new session with the run's ``CLEANSLATE_RUN``
marker in its environment; it makes itself a child subreaper (``PR_SET_CHILD_SUBREAPER``), so
workers that outlive the engine's root process are re-parented to it rather than to PID 1, then
starts the engine in its own process group (and, where the host allows it, its own cgroup v2)
with the log going to the run's log file, and writes a state file:

    {"supervisor_pid": .., "pid": .., "pgid": .., "sid": .., "started": <epoch s>,
     "exit_code": null | int, "exited_at": null | <epoch s>, "error": null | str,
     "boot_id": .., "machine_id": .., "user": .., "uid": <effective uid>,
     "cgroup": null | path, "cgroup_id": null | <its inode number>,
     "cgroup_error": null | why there is no cgroup}

It reaps every child (the engine and the orphans it inherits) until none is left, then exits.
SIGTERM and SIGINT are forwarded to the engine's root process. Like the collector it needs only
the standard library, so it can be shipped to a remote host's ``python3``.

Usage: ``python3 -I -S supervise.py SPEC.json`` where the spec holds ``argv``, ``env``, ``log``,
``state``, ``cwd``, ``daemonize`` and ``cgroup`` (the name of the run's cgroup, or ``null`` to
make none). The spec holds the run's environment, secrets included: the script deletes it as
soon as it has read it, so they then live only in the engine's own ``/proc/PID/environ``.
Everything it creates is private to its user (``umask 077``: the log and state are 0600); the
engine gets the umask the supervisor was started with. With ``daemonize`` the script forks, the
parent exits at once (so the command that started it returns), and the child starts a new
session.

The cgroup: the supervisor finds the cgroup v2 mount in ``/proc/self/mountinfo`` and its own
cgroup in ``/proc/self/cgroup`` (``0::/path``), creates ``<mount><own path>/<name>``, and the
engine's process moves itself there before it executes the engine (so nothing it starts can be
outside it). The cgroup's inode number (its cgroup id, unique within a boot) and the
supervisor's uid (the cgroup's owner) are recorded, so that teardown acts on this very
directory and no other of the same name (``cleanslate.teardown._cgroup_script``). Where that is not
possible (no cgroup v2, read-only, not permitted) the run goes on without one and
``cgroup_error`` says why.

The tree (only without a cgroup): every :data:`TREE_INTERVAL_S` seconds a thread lists
``/proc``, reads the ``stat`` of the processes it has not seen yet (all of them every
:data:`TREE_FULL_EVERY` passes), and appends each descendant of the supervisor not yet recorded
(its PID and its start time in clock ticks since boot, field 22) to ``tree.txt`` beside the
state file, so
that teardown can still find a process that left the run's group and session after the
supervisor is gone (``cleanslate.teardown._tree``). The file is made 0600 with ``O_EXCL`` and
``O_NOFOLLOW``; its first line is ``cleanslate-tree 1 <boot id> <clock ticks per second>``, each
other line ``<pid> <start ticks>``, written whole with one ``write`` of ``O_APPEND``; recording
stops at :data:`TREE_MAX_ENTRIES` lines.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NAME = 15
#: Seconds between two readings of the supervisor's tree (``docs/teardown.md`` has their cost).
TREE_INTERVAL_S = 0.5
#: Lines of ``tree.txt`` after which recording stops (about 1 MiB).
TREE_MAX_ENTRIES = 65536
#: Passes after which the tree is read whole again (every 10 s).
TREE_FULL_EVERY = 20
TREE_FILE = "tree.txt"
TREE_MAGIC = "cleanslate-tree"


def _write_state(path: str, state: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def _prctl(option: int, value: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _first_line(*paths: str) -> str | None:
    for path in paths:
        try:
            with open(path) as fh:
                value = fh.readline().strip()
        except OSError:
            continue
        if value:
            return value
    return None


def _user() -> str:
    uid = os.geteuid()
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return str(uid)


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as ``\\ooo``."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def cgroup_parent() -> tuple[str | None, str | None]:
    """(the directory of this process's cgroup v2, ``None``) or (``None``, why there is none)."""
    try:
        with open("/proc/self/cgroup") as fh:
            own = [line.strip()[3:] for line in fh if line.startswith("0::")]
    except OSError as exc:
        return None, f"cannot read /proc/self/cgroup: {exc.strerror}"
    if not own or not own[0].startswith("/"):
        return None, "no cgroup v2 hierarchy for this process"
    path = own[0]
    if path.endswith(" (deleted)"):
        return None, "this process's cgroup was removed"
    mounts: list[tuple[str, str, bool]] = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                head, sep, tail = line.partition(" - ")
                fields = head.split()
                if not sep or len(fields) < 6 or tail.split()[:1] != ["cgroup2"]:
                    continue
                mounts.append((_unescape(fields[3]), _unescape(fields[4]),
                               "ro" in fields[5].split(",")))
    except OSError as exc:
        return None, f"cannot read /proc/self/mountinfo: {exc.strerror}"
    if not mounts:
        return None, "no cgroup v2 file system is mounted"
    for root, point, read_only in sorted(mounts, key=lambda m: m[0] != "/"):
        if root == "/":
            relative = path
        elif path == root or path.startswith(root.rstrip("/") + "/"):
            relative = path[len(root.rstrip("/")):] or "/"
        else:
            continue
        if read_only:
            return None, f"the cgroup v2 file system at {point} is mounted read-only"
        directory = point.rstrip("/") + (relative if relative != "/" else "")
        if not os.path.isdir(directory):
            return None, f"this process's cgroup {directory} is not visible"
        return directory, None
    return None, "this process's cgroup is outside every cgroup v2 mount"


def make_cgroup(name: str) -> tuple[str | None, int | None, str | None]:
    """Create the run's cgroup: (its path, its inode number, ``None``) or (``None``, ``None``,
    why not)."""
    parent, why = cgroup_parent()
    if parent is None:
        return None, None, why
    path = f"{parent}/{name}"
    try:
        os.mkdir(path, 0o755)
        ino = os.lstat(path).st_ino
    except OSError as exc:
        if exc.errno in (1, 13):  # EPERM, EACCES
            return None, None, (f"not permitted to create {path} (not root and no delegated "
                                "cgroup subtree)")
        return None, None, f"cannot create {path}: {exc.strerror}"
    return path, ino, None


def proc_stat(pid: int) -> tuple[int, int] | None:
    """``(parent PID, start in clock ticks since boot)`` of ``pid``, ``None`` when it is gone or
    cannot be read."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = raw[raw.rfind(b")") + 2 :].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


class TreeRecorder:
    """Appends the supervisor's descendants to the tree file (see the module docstring).

    A pass lists ``/proc`` and reads the ``stat`` of the PIDs it has not judged yet, and of the
    parents of those (still the process judged, by start time?); a process outside the tree
    stays outside (the kernel re-parents an orphan to its nearest subreaper ancestor: this
    supervisor for its own tree). Every :data:`TREE_FULL_EVERY` passes everything is read
    again, so a PID reused between two passes is judged anew within that time."""

    def __init__(self, path: str, boot_id: str | None) -> None:
        self.me = os.getpid()
        self.known: dict[int, tuple[int, bool]] = {}  # pid: (start ticks, in the tree)
        self.recorded: set[tuple[int, int]] = set()
        self.passes = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                          | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        os.write(self.fd, f"{TREE_MAGIC} 1 {boot_id or '-'} "
                          f"{os.sysconf('SC_CLK_TCK')}\n".encode())

    def new_descendants(self) -> dict[int, int]:
        """``{pid: start ticks}`` of the descendants judged in this pass (one pass, above)."""
        if self.passes % TREE_FULL_EVERY == 0:
            self.known.clear()
        self.passes += 1
        live = {int(name) for name in os.listdir("/proc") if name.isdigit()}
        for pid in [pid for pid in self.known if pid not in live]:
            del self.known[pid]
        fresh: dict[int, tuple[int, int]] = {}
        for pid in live:
            if pid not in self.known and (found := proc_stat(pid)) is not None:
                fresh[pid] = found
        verdicts: dict[int, bool | None] = {}

        def judge(pid: int, depth: int = 0) -> bool | None:
            """Whether ``pid`` is in the tree now (``None``: not known in this pass)."""
            if pid == self.me:
                return True
            if pid not in live or depth > 1000:
                return False  # gone before the listing: its children were re-parented then
            if pid in verdicts:
                return verdicts[pid]
            verdicts[pid] = False  # a parent loop (a PID reused meanwhile) is not a tree
            now = fresh.get(pid)
            if now is None:
                now = proc_stat(pid)
                cached = self.known.get(pid)
                if now is None or cached is None:
                    verdicts[pid] = None  # exited meanwhile
                    return None
                if cached[0] == now[1]:
                    verdicts[pid] = cached[1]
                    return cached[1]
                fresh[pid] = now  # another process with that PID: judged anew
            verdicts[pid] = judge(now[0], depth + 1)
            return verdicts[pid]

        for pid in list(fresh):
            judge(pid)
        out: dict[int, int] = {}
        for pid, (_ppid, start) in fresh.items():
            verdict = verdicts.get(pid)
            if verdict is None:
                continue  # read again next pass
            self.known[pid] = (start, verdict)
            if verdict and pid != self.me:
                out[pid] = start
        return out

    def scan(self) -> None:
        room = TREE_MAX_ENTRIES - len(self.recorded)
        new = sorted(set(self.new_descendants().items()) - self.recorded)[:max(room, 0)]
        if new:
            os.write(self.fd, "".join(f"{pid} {start}\n" for pid, start in new).encode())
            self.recorded.update(new)

    def loop(self) -> None:
        while True:
            with contextlib.suppress(OSError):
                self.scan()
            time.sleep(TREE_INTERVAL_S)


def record_tree(state_path: str, boot_id: str | None) -> None:
    """Start recording the tree (a daemon thread; the first reading at once). Without it the
    run still has its marker and recorded PIDs: a failure here stops nothing."""
    try:
        recorder = TreeRecorder(os.path.join(os.path.dirname(state_path), TREE_FILE), boot_id)
        recorder.scan()
    except OSError:
        return
    threading.Thread(target=recorder.loop, name="tree", daemon=True).start()


def main() -> int:
    spec_path = sys.argv[1]
    with open(spec_path) as fh:
        spec = json.load(fh)
    # The spec holds the run's secrets: from here on they live only in our memory and in the
    # engine's environment.
    with contextlib.suppress(OSError):
        os.unlink(spec_path)
    argv: list[str] = spec["argv"]
    state_path: str = spec["state"]
    engine_umask = os.umask(0o077)
    if spec.get("daemonize"):
        if os.fork() != 0:
            os._exit(0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_NAME, b"cleanslate-sup")
    env = dict(os.environ)
    env.update(spec.get("env") or {})
    log_fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    devnull = os.open(os.devnull, os.O_RDONLY)
    state: dict[str, Any] = {
        "supervisor_pid": os.getpid(),
        "sid": os.getsid(0),
        "started": time.time(),
        "pid": None,
        "pgid": None,
        "exit_code": None,
        "exited_at": None,
        "error": None,
        "boot_id": _first_line("/proc/sys/kernel/random/boot_id"),
        "machine_id": _first_line("/etc/machine-id", "/var/lib/dbus/machine-id"),
        "user": _user(),
        "uid": os.geteuid(),
        "cgroup": None,
        "cgroup_id": None,
        "cgroup_error": spec.get("cgroup_error"),
    }
    cgroup = None
    cgroup_id = None
    if spec.get("cgroup"):
        cgroup, cgroup_id, state["cgroup_error"] = make_cgroup(str(spec["cgroup"]))
    # The engine's process says through this pipe whether it joined the cgroup; exec closes it.
    status_r, status_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except OSError as exc:
        state["error"] = f"fork failed: {exc}"
        _write_state(state_path, state)
        return 1
    if pid == 0:  # the engine
        try:
            os.close(status_r)
            os.setpgid(0, 0)
            if cgroup is not None:
                try:
                    with open(f"{cgroup}/cgroup.procs", "w") as fh:
                        fh.write("0\n")
                    os.write(status_w, b"joined")
                except OSError as exc:
                    os.write(status_w, f"cannot join {cgroup}: {exc.strerror}".encode())
            os.umask(engine_umask)
            os.dup2(devnull, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            if spec.get("cwd"):
                os.chdir(spec["cwd"])
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, f"cleanslate: cannot start {argv[0]}: {exc}\n".encode())
            os._exit(127)
    os.close(status_w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here, so the group exists before anyone signals it
    answer = b""
    with contextlib.suppress(OSError):
        while True:
            chunk = os.read(status_r, 4096)
            if not chunk:
                break
            answer += chunk
    os.close(status_r)
    if cgroup is not None:
        if answer == b"joined":
            state["cgroup"] = cgroup
            state["cgroup_id"] = cgroup_id
        else:
            state["cgroup_error"] = answer.decode(errors="replace") or "the engine did not join"
            with contextlib.suppress(OSError):
                os.rmdir(cgroup)
    state["pid"] = pid
    state["pgid"] = pid
    if state["cgroup"] is None:
        record_tree(state_path, state["boot_id"])
    _write_state(state_path, state)

    def forward(signum: int, _frame: Any) -> None:
        if state["exit_code"] is None:
            with contextlib.suppress(OSError):
                os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while True:
        try:
            child, status = os.wait()
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if child == pid:
            state["exit_code"] = os.waitstatus_to_exitcode(status)
            state["exited_at"] = time.time()
            _write_state(state_path, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
