"""The commands a teardown sends to a host: signals that check each PID's start time, the run's
cgroup (read, ``cgroup.kill``, removal), the holders of ``/dev/shm`` files and user names. Each
is one of the package's stdlib-only scripts (:func:`cleanslate.hosts.run_script`); what they
print is typed here."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TypedDict

from cleanslate.hosts.base import Executor
from cleanslate.hosts.scripts import run_script
from cleanslate.teardown._records import ScopeSpec, Target


class SignalOutput(TypedDict):
    """What ``_signal_script.py`` prints: the PIDs signalled, gone, reused (another start
    time), zombies and in uninterruptible sleep, and an error per PID it could not signal."""

    sent: list[int]
    gone: list[int]
    reused: list[int]
    zombie: list[int]
    d_state: list[int]
    errors: dict[str, str]


class CgroupOutput(TypedDict, total=False):
    """What ``_cgroup_script.py`` prints (``ok`` false with ``refused`` when the path is not
    the run's cgroup, with ``error`` when it could not be read)."""

    ok: bool
    exists: bool
    members: list[int]
    killed: bool
    removed: bool
    refused: str
    error: str


class _ShmOutput(TypedDict):
    held: dict[str, list[int]]


class _UsersOutput(TypedDict):
    names: dict[str, str | None]


async def send_signal(executor: Executor, targets: Iterable[Target], signal: str,
                      timeout: float = 15.0, *, wait_s: float = 0.0) -> SignalOutput:
    """Signal targets that are still the same processes; ``signal`` ``"0"`` only tests them,
    after waiting up to ``wait_s`` seconds for all of them to exit (on the host, event-driven:
    see ``_signal_script.py``). Raises :class:`OSError` when the host cannot be asked."""
    listed = [{"pid": t.pid, "create_time": t.create_time}
              | ({} if t.boot_time is None else {"boot": t.boot_time}) for t in targets]
    if not listed:
        return SignalOutput(sent=[], gone=[], reused=[], zombie=[], d_state=[], errors={})
    payload: dict[str, object] = {"signal": signal, "targets": listed}
    if signal == "0" and wait_s > 0:
        payload["wait_s"] = wait_s
    done = await run_script(executor, "teardown._signal_script", payload,
                            timeout + (wait_s if signal == "0" else 0.0), output=SignalOutput,
                            what="the signal script")
    if done.output is None:
        raise OSError(f"could not signal processes on {executor.name}: "
                      f"{done.describe_failure()}")
    return done.output


async def wait_gone(executor: Executor, targets: list[Target], seconds: float) -> list[Target]:
    """Wait until every target is gone (or a zombie) or ``seconds`` pass; return the living.
    One command on the host, which returns the moment the last target exits."""
    if not targets:
        return []
    state = await send_signal(executor, targets, "0", wait_s=max(seconds, 0.0))
    dead = set(state["gone"]) | set(state["reused"]) | set(state["zombie"])
    return [t for t in targets if t.pid not in dead]


async def shm_in_use(executor: Executor, names: Iterable[str], directory: str = "/dev/shm",
                     timeout: float = 15.0) -> dict[str, list[int]]:
    """``{name: [pid, ..]}`` for the named ``/dev/shm`` files that a live process maps or holds
    open (matched by inode). Raises :class:`OSError` when the host cannot be read."""
    wanted = sorted(set(names))
    if not wanted:
        return {}
    done = await run_script(executor, "teardown._shm_holders_script",
                            {"dir": directory, "names": wanted}, timeout, output=_ShmOutput,
                            what="the /dev/shm holders script")
    if done.output is None or not isinstance(done.output.get("held"), dict):
        raise OSError(f"could not read /dev/shm holders on {executor.name}: "
                      f"{done.describe_failure()}")
    return done.output["held"]


async def cgroup_op(executor: Executor, cgroup: str, op: str = "members", *,
                    uid: int | None = None, cgroup_id: int | None = None, wait_s: float = 0.0,
                    timeout: float = 15.0) -> CgroupOutput:
    """Run ``op`` (``members``, ``kill``, ``remove``) on the run's cgroup, on the host, after
    checking that ``cgroup`` is a cgroup v2 directory owned by ``uid`` and, when given, the very
    one of inode ``cgroup_id`` (:mod:`cleanslate.teardown._cgroup_script`, whose answer this is:
    ``refused`` when it is not the run's cgroup, ``error`` when it could not be read)."""
    wait = max(wait_s, 0.0)
    done = await run_script(executor, "teardown._cgroup_script",
                            {"path": cgroup, "op": op, "uid": uid, "ino": cgroup_id,
                             "wait_s": wait}, timeout + wait, output=CgroupOutput,
                            what="the cgroup script")
    if not done.command.ok:
        return CgroupOutput(ok=False, error=f"could not read the cgroup {cgroup} on "
                                            f"{executor.name}: {done.describe_failure()}")
    data = done.output
    members = data.get("members", []) if data is not None else None
    if data is None or not isinstance(members, list) \
            or not all(isinstance(m, int) for m in members):
        return CgroupOutput(ok=False, error=f"an unreadable answer about the cgroup {cgroup}")
    return data


async def cgroup_members(executor: Executor, spec: ScopeSpec, *, checked: bool = False
                         ) -> tuple[frozenset[int] | None, str | None]:
    """(the PIDs in the run's cgroup, ``None``) ; (``None``, why the recorded path is not the
    run's cgroup); (``None``, ``None``) when it cannot be read.

    ``checked``: the path passed :func:`cgroup_op`'s check earlier in this teardown, so its
    ``cgroup.procs`` is read as a file (no command on the host). Every directory on that path is
    real (it was its own ``realpath``) and its last two are in a cgroup v2 file system, where no
    one can make a symbolic link and only a writer of the parent cgroup (the run's own user or
    root) can make a directory; ``cgroup.kill`` and the removal check again all the same."""
    assert spec.cgroup is not None
    if checked:
        try:
            raw = await executor.read_file(f"{spec.cgroup}/cgroup.procs", max_bytes=1 << 22)
        except FileNotFoundError:
            return frozenset(), None
        except OSError:
            return None, None
        try:
            return frozenset(int(line) for line in raw.split()), None
        except ValueError:
            return None, None
    data = await cgroup_op(executor, spec.cgroup, "members", uid=spec.uid,
                           cgroup_id=spec.cgroup_id)
    if data.get("refused"):
        return None, str(data["refused"])
    if not data.get("ok"):
        return None, None
    return frozenset(data.get("members", [])), None


async def read_cgroup_members(executor: Executor, cgroup: str, *, uid: int | None = None,
                              cgroup_id: int | None = None) -> frozenset[int] | None:
    """The PIDs in ``cgroup`` (an empty set when it no longer exists: a populated cgroup
    cannot be removed), or ``None`` when it cannot be read or is not a cgroup v2 directory
    owned by ``uid`` (and of inode ``cgroup_id``): see :func:`cgroup_op`."""
    return (await cgroup_members(executor, ScopeSpec(cgroup=cgroup, uid=uid,
                                                     cgroup_id=cgroup_id)))[0]


async def cgroup_kill(executor: Executor, spec: ScopeSpec) -> bool:
    """Write ``1`` to the run's ``cgroup.kill`` (SIGKILL to every member, forks included).
    ``False`` when the kernel has no ``cgroup.kill`` (before 5.14), it cannot be written, or
    the path is no longer the run's cgroup."""
    assert spec.cgroup is not None
    data = await cgroup_op(executor, spec.cgroup, "kill", uid=spec.uid,
                           cgroup_id=spec.cgroup_id)
    return bool(data.get("killed"))


async def user_names(executor: Executor, uids: Iterable[int | None],
                     cache: dict[int, str | None]) -> None:
    """Fill ``cache`` with the host's user names for ``uids`` (``None`` where unknown)."""
    wanted = sorted({u for u in uids if u is not None and u not in cache})
    if not wanted:
        return
    if executor.is_local:
        import pwd

        for uid in wanted:
            try:
                cache[uid] = pwd.getpwuid(uid).pw_name
            except KeyError:
                cache[uid] = None
        return
    done = await run_script(executor, "teardown._users_script", json.dumps(wanted), 15.0,
                            output=_UsersOutput, what="the user names script")
    names = done.output.get("names") if done.output is not None else None
    for uid in wanted:
        value = names.get(str(uid)) if isinstance(names, dict) else None
        cache[uid] = str(value) if value is not None else None


__all__ = ["CgroupOutput", "SignalOutput", "cgroup_kill", "cgroup_members", "cgroup_op",
           "read_cgroup_members", "send_signal", "shm_in_use", "user_names", "wait_gone"]
