"""The process tree of a snapshot: children, descendants and ancestors on forged tables (loops,
missing parents), zombies and kernel threads."""

from __future__ import annotations

from cleanslate.probe.snapshot import GpuReading, ProcessInfo, Snapshot, is_kernel_thread


def _proc(pid: int, ppid: int, **kw: object) -> ProcessInfo:
    fields: dict[str, object] = {"pgid": pid, "sid": pid, "state": "S", "comm": f"p{pid}",
                                 "cmdline": (f"p{pid}",), "create_time": 0.0, **kw}
    return ProcessInfo(pid=pid, ppid=ppid, **fields)  # type: ignore[arg-type]


def _snapshot(*procs: ProcessInfo) -> Snapshot:
    return Snapshot(host="h", taken_at="2026-12-02T00:00:00Z", elapsed_s=0.0,
                    processes=procs, gpu=GpuReading(backend="none", ok=True))


def test_children_and_descendants() -> None:
    snap = _snapshot(_proc(1, 0), _proc(10, 1), _proc(11, 10), _proc(12, 11), _proc(20, 1))
    tree = snap.tree
    assert [p.pid for p in tree.children(10)] == [11]
    assert tree.children(12) == ()
    assert tree.descendants([10]) == {10, 11, 12}
    assert tree.descendants([10], enter=lambda p: p.pid != 11) == {10}
    assert tree.descendants([99]) == {99}  # a root not seen is still named
    assert tree.descendants([1]) == {1}  # init's orphans are not its tree


def test_a_forged_parent_loop_ends_every_walk() -> None:
    snap = _snapshot(_proc(5, 7), _proc(6, 5), _proc(7, 6))
    assert snap.tree.descendants([5]) == {5, 6, 7}
    assert [p.pid for p in snap.tree.ancestors(5)] == [7, 6]
    assert [p.pid for p in _snapshot(_proc(8, 8)).tree.ancestors(8)] == []


def test_ancestors_stop_at_init_and_at_a_missing_parent() -> None:
    snap = _snapshot(_proc(1, 30), _proc(30, 0), _proc(10, 1), _proc(11, 10), _proc(40, 555))
    assert [p.pid for p in snap.tree.ancestors(11)] == [10, 1]
    assert snap.tree.ancestors(1) == []
    assert snap.tree.ancestors(40) == []
    assert snap.tree.ancestors(404) == []


def test_the_tree_follows_a_copy_with_other_processes() -> None:
    snap = _snapshot(_proc(1, 0), _proc(10, 1))
    assert snap.tree is snap.tree
    assert snap.by_pid[10].ppid == 1 and snap.process(10) is snap.by_pid[10]
    copy = snap.model_copy(update={"processes": (_proc(1, 0),)})
    assert copy.process(10) is None and snap.process(10) is not None
    assert copy == _snapshot(_proc(1, 0)) and "_tree" not in copy.model_dump()


def test_zombies() -> None:
    assert _proc(10, 1, state="Z").is_zombie
    assert not _proc(10, 1, state="D").is_zombie


def test_kernel_threads_are_known_by_more_than_their_parent() -> None:
    kthreadd = _proc(2, 0, pgid=0, sid=0, cmdline=(), comm="kthreadd")
    worker = _proc(80, 2, pgid=0, sid=0, cmdline=(), comm="kworker/0:1")
    assert is_kernel_thread(kthreadd) and is_kernel_thread(worker)
    # In a PID namespace PID 2 is an ordinary process, and so are its children.
    assert not is_kernel_thread(_proc(2, 1))
    assert not is_kernel_thread(_proc(80, 2))
    # A zombie has no command line either; a container's init is never a kernel thread.
    assert not is_kernel_thread(_proc(81, 2, pgid=0, sid=0, cmdline=(), state="Z"))
    assert not is_kernel_thread(_proc(1, 0, pgid=0, sid=0, cmdline=()))
