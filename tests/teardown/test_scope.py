"""``resolve_scope`` on synthetic snapshots: every selection path and every exclusion.

A synthetic host (no live process is ever signalled here): PID 1 init, kthreadd (2) and a kernel
thread, an sshd and a login shell that runs this cleanslate process (the collector is its
child), and the run launched at ``T0``: its supervisor, engine root and workers. Each test adds
what it needs.
"""

from __future__ import annotations

from typing import Any

from cleanslate.probe.snapshot import (
    DeviceHolder,
    Gpu,
    GpuProcess,
    GpuReading,
    ListeningSocket,
    ProcessInfo,
    Snapshot,
)
from cleanslate.teardown import Protected, ScopeSpec
from cleanslate.teardown._tree import RecordedTree
from cleanslate.teardown.scope import (
    CGROUP,
    DESCENDANT,
    ENGINE,
    MARKER,
    NAMED,
    RECORDED,
    ROOT,
    SUPERVISOR,
    protected_pids,
    resolve_scope,
    same_process,
    scope_and_protected,
)

T0 = 1_700_000_000.0  # the run's recorded start
NOW = T0 + 600.0
RUN = "r-20231114-221320-abcd"
ME = 500  # this cleanslate process
COLLECTOR = 501
SUP, ROOTPID = 1000, 1001  # the run's supervisor (session leader) and engine root (group leader)


def proc(pid: int, ppid: int, pgid: int, sid: int, comm: str, cmdline: tuple[str, ...] = (),
         *, at: float = T0 + 1.0, marker: str | None = None, state: str = "S",
         uid: int = 0) -> ProcessInfo:
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pgid, sid=sid, state=state, comm=comm,
                       cmdline=cmdline, create_time=at, uid=uid, run_marker=marker,
                       environ_readable=marker is not None)


def host(*extra: ProcessInfo, **fields: Any) -> Snapshot:
    base = [
        proc(1, 0, 1, 1, "systemd", ("/sbin/init",), at=T0 - 9000),
        proc(2, 0, 0, 0, "kthreadd", at=T0 - 9000),
        proc(40, 2, 0, 0, "kworker/0:1", at=T0 - 9000),
        proc(300, 1, 300, 300, "sshd", ("sshd: /usr/sbin/sshd -D",), at=T0 - 8000),
        proc(400, 300, 400, 400, "bash", ("-bash",), at=T0 - 100),
        proc(ME, 400, ME, 400, "python", ("python", "-m", "cleanslate", "stop", RUN), at=NOW),
        proc(COLLECTOR, ME, COLLECTOR, COLLECTOR, "python", ("python", "-I", "-S", "-"), at=NOW),
        proc(SUP, 1, SUP, SUP, "cleanslate-sup", ("python", "-I", "-S", "supervise.py"),
             at=T0 + 0.3, marker=RUN),
        proc(ROOTPID, SUP, ROOTPID, SUP, "python",
             ("python", "-m", "vllm.entrypoints.openai.api_server", "--port", "8000"),
             at=T0 + 0.4, marker=RUN),
    ]
    gpu = fields.pop("gpu", GpuReading(backend="none", ok=True))
    return Snapshot(host="local", taken_at="2023-11-14T22:23:20Z", elapsed_s=0.1,
                    collector_pid=COLLECTOR, processes=(*base, *extra), gpu=gpu, **fields)


def run_spec(**overrides: Any) -> ScopeSpec:
    values: dict[str, Any] = dict(
        root=(ROOTPID, T0 + 0.4), supervisor=(SUP, T0 + 0.3), pgid=ROOTPID, sid=SUP,
        marker=RUN, signature="vllm", gpus=frozenset({0}), port=8000, not_before=T0,
        exclude_roots=frozenset({ME}))
    values.update(overrides)
    return ScopeSpec(**values)


def named(*pids: int) -> ScopeSpec:
    """``clean --pid``."""
    return ScopeSpec(pids=pids, exclude_roots=frozenset({ME}))


def whys(snapshot: Snapshot, spec: ScopeSpec, **kwargs: Any) -> dict[int, str]:
    return {t.pid: t.why for t in resolve_scope(snapshot, spec, now=NOW, **kwargs)}


# -- selection paths ----------------------------------------------------------------------------


def test_root_and_supervisor_need_their_recorded_start_time() -> None:
    assert whys(host(), run_spec()) == {SUP: SUPERVISOR, ROOTPID: ROOT}
    reused = run_spec(root=(ROOTPID, T0 + 5.0), supervisor=(SUP, T0 - 50.0), marker=None,
                      pgid=None, sid=None)
    assert whys(host(), reused) == {}


def test_marker_selects_a_reparented_process() -> None:
    orphan = proc(1200, 1, 1200, 1200, "python", ("python", "helper.py"), marker=RUN)
    other = proc(1201, 1, 1201, 1201, "python", ("python", "helper.py"), marker="r-other")
    assert whys(host(orphan, other), run_spec())[1200] == MARKER
    assert 1201 not in whys(host(orphan, other), run_spec())


def on_gpu(*pids: int, index: int = 0) -> GpuReading:
    """A GPU reading where ``pids`` hold memory on GPU ``index``."""
    return GpuReading(backend="sim", ok=True, gpus=(
        Gpu(index=index, source="sim",
            processes=tuple(GpuProcess(pid=p, used_mib=100) for p in pids)),))


def left_alone(snapshot: Snapshot, spec: ScopeSpec, **kwargs: Any) -> dict[int, str]:
    """``{pid: reason}`` of the processes a path matched but that were not selected."""
    return {t.pid: str(t.protected)
            for t in scope_and_protected(snapshot, spec, now=NOW, **kwargs)[1]}


BOOT_ID = "6f1c2a9e-0d4b-4c55-9a57-1d2e3f405162"
BOOT_TIME = T0 - 10_000.0


def booted(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with the boot that :func:`tree` entries are written on."""
    return snapshot.model_copy(update={"boot_id": BOOT_ID, "boot_time": BOOT_TIME})


def tree(*entries: tuple[int, float], boot_id: str = BOOT_ID) -> RecordedTree:
    """A recorded tree naming ``(pid, create_time)`` entries (as seconds after the boot)."""
    return RecordedTree(boot_id=boot_id,
                        entries=tuple((pid, at - BOOT_TIME) for pid, at in entries))


def orphaned_workers() -> Snapshot:
    """Supervisor and API server SIGKILLed; the renamed workers (environ wiped by
    setproctitle: no marker) re-parented to PID 1, one holding the run's GPU."""
    core = proc(1002, 1, ROOTPID, SUP, "VLLM::EngineCor", ("VLLM::EngineCore",), at=T0 + 20)
    worker = proc(1003, 1, ROOTPID, SUP, "VLLM::Worker", ("VLLM::Worker",), at=T0 + 25)
    snapshot = host(core, worker, gpu=on_gpu(1002))
    without_parents = tuple(p for p in snapshot.processes if p.pid not in (SUP, ROOTPID))
    return booted(snapshot.model_copy(update={"processes": without_parents}))


def test_workers_found_only_by_their_group_are_reported_not_selected() -> None:
    """Issue 35: a number is no evidence, with or without a holding (a reused number of the
    same user in the run's window can hold its GPU): both workers are reported, with why."""
    snapshot = orphaned_workers()
    assert whys(snapshot, run_spec()) == {}
    reported = left_alone(snapshot, run_spec())
    assert set(reported) == {1002, 1003}
    assert "holding the run's GPU or port" in reported[1002]
    assert "environment cannot be read" in reported[1003]
    assert all("not among the processes the run's supervisor recorded" in why
               for why in reported.values())


def test_the_recorded_tree_selects_the_workers_and_their_children() -> None:
    """The same workers, recorded by the supervisor with their start times: selected, with
    the children they started since (found before the first signal)."""
    child = proc(1009, 1003, 1009, 1009, "python", ("python", "-c", "x"), at=T0 + 200)
    snapshot = booted(orphaned_workers().model_copy(update={"processes": (
        *orphaned_workers().processes, child)}))
    recorded = tree((1002, T0 + 20), (1003, T0 + 25), (SUP, T0 + 0.3))
    assert whys(snapshot, run_spec(), recorded=recorded) == {
        1002: RECORDED, 1003: RECORDED, 1009: DESCENDANT}
    assert left_alone(snapshot, run_spec(), recorded=recorded) == {}


def test_a_recorded_pid_that_names_another_process_now_selects_nothing() -> None:
    """A recorded PID selects only the process with the recorded start time, on the boot the
    tree was written on, started after the run (less the slack): never a reused PID, a
    process of another boot, or one older than the run (a planted entry)."""
    snapshot = orphaned_workers()
    assert whys(snapshot, run_spec(), recorded=tree((1002, T0 + 20.03))) == {}
    assert whys(snapshot, run_spec(), recorded=tree((1002, T0 + 20.01))) == {1002: RECORDED}
    other_boot = tree((1002, T0 + 20), boot_id="00000000-0000-4000-8000-000000000000")
    assert whys(snapshot, run_spec(), recorded=other_boot) == {}
    assert whys(snapshot, run_spec(not_before=T0 + 30), recorded=tree((1002, T0 + 20))) == {}
    unbooted = snapshot.model_copy(update={"boot_time": None})  # start times not comparable
    assert whys(unbooted, run_spec(), recorded=tree((1002, T0 + 20))) == {}


def test_a_known_cgroup_turns_the_tree_off_and_protection_holds() -> None:
    snapshot = orphaned_workers()
    spec = run_spec(cgroup="/sys/fs/cgroup/cleanslate-" + RUN)
    assert whys(snapshot, spec, cgroup_members=frozenset(),
                recorded=tree((1002, T0 + 20))) == {}
    # Our own shell and PID 1, recorded with their start times: never selected.
    recorded = tree((400, T0 - 100), (1, T0 - 9000))
    targets, refused = scope_and_protected(snapshot, run_spec(not_before=T0 - 20_000),
                                           recorded=recorded, now=NOW)
    assert targets == []
    assert {(t.pid, t.why, t.protected) for t in refused if t.pid in (1, 400)} == {
        (1, RECORDED, Protected.INIT), (400, RECORDED, Protected.ANCESTOR)}


def test_session_member_holding_the_port_is_reported() -> None:
    worker = proc(1004, 1, 1004, SUP, "VLLM::Worker", ("VLLM::Worker",), at=T0 + 25)
    sockets = (ListeningSocket(port=8000, address="0.0.0.0", inode=9, pids=(1004,)),)
    assert 1004 not in whys(host(worker, sockets=sockets), run_spec())
    assert "holding the run's GPU or port" in left_alone(host(worker, sockets=sockets),
                                                         run_spec())[1004]
    assert 1004 not in whys(host(worker), run_spec())  # the signature alone: reported
    assert 1004 in left_alone(host(worker), run_spec())


def test_a_bare_group_or_session_number_selects_nothing() -> None:
    """PID reuse or a shared store: an unrelated setsid'd process with the run's numbers, started
    after the run, carrying neither the engine's signature nor a holding of its GPUs or port."""
    stranger = proc(ROOTPID + 7, 1, ROOTPID, SUP, "sleep", ("sleep", "600"), at=T0 + 30)
    assert ROOTPID + 7 not in whys(host(stranger), run_spec())
    command_run = run_spec(signature="command")  # no signature at all
    assert ROOTPID + 7 not in whys(host(stranger), command_run)
    readable = stranger.model_copy(update={"environ_readable": True})
    assert ROOTPID + 7 not in left_alone(host(readable), run_spec())  # nothing to report


def reused_numbers(leader_at: float) -> Snapshot:
    """The run is dead (no supervisor, no root); PID ``SUP`` and ``ROOTPID`` are now another
    session's leader and group leader (started at ``leader_at``), with a member that looks like
    the engine and one that holds the run's GPU and port."""
    base = [p for p in host().processes if p.pid not in (SUP, ROOTPID)]
    leader = proc(SUP, 1, SUP, SUP, "sim::scheduler", ("sim::scheduler_TP0",), at=leader_at)
    group = proc(ROOTPID, SUP, ROOTPID, SUP, "VLLM::Worker", ("VLLM::Worker",),
                 at=leader_at + 1)
    job = proc(1080, ROOTPID, ROOTPID, SUP, "python", ("python", "train.py"), at=leader_at + 2)
    sockets = (ListeningSocket(port=8000, address="0.0.0.0", inode=9, pids=(1080,)),)
    return host(gpu=on_gpu(SUP, ROOTPID, 1080), sockets=sockets).model_copy(
        update={"processes": (*base, leader, group, job)})


def test_a_reused_group_or_session_number_selects_nothing() -> None:
    """Issue 23: without a cgroup, a dead run's recorded session and group numbers, reused by
    another session that looks like an engine and holds the run's GPU and port, selected it.
    The numbers name their leaders (the recorded supervisor and root, with start times): a
    live PID with another start time means the number was reused."""
    snapshot = reused_numbers(T0 + 100)
    assert whys(snapshot, run_spec()) == {}
    reported = left_alone(snapshot, run_spec())
    assert set(reported) == {SUP, ROOTPID, 1080}
    assert all("was reused" in why for why in reported.values())
    # Only the group number recorded: its leader (the root) tells the same.
    assert whys(snapshot, run_spec(sid=None)) == {}
    # Numbers whose leader was not recorded: reported all the same.
    unknown = run_spec(root=None, supervisor=None)
    assert whys(snapshot, unknown) == {}
    assert set(left_alone(snapshot, unknown)) == {SUP, ROOTPID, 1080}


def test_a_number_carried_by_a_process_older_than_the_run_was_reused() -> None:
    """Every process carrying a group or session number is the run's or none is (the kernel
    gives no new process a PID that a live group or session still carries): one that started
    before the run proves the number is someone else's, for its fellow members too."""
    old = proc(1090, 1, 1090, 1090, "bash", ("bash",), at=T0 - 500)
    job = proc(1091, 1090, 1090, 1090, "python", ("python", "train.py"), at=T0 + 50)
    spec = run_spec(root=None, supervisor=None, pgid=1090, sid=1090, marker=None)
    snapshot = host(old, job, gpu=on_gpu(1091))
    assert whys(snapshot, spec) == {}
    assert "before the run" in left_alone(snapshot, spec)[1091]
    alone = host(job, gpu=on_gpu(1091))  # without the older member: still only reported
    assert whys(alone, spec) == {}
    assert "not among" in left_alone(alone, spec)[1091]


def test_another_users_process_found_by_number_is_not_selected() -> None:
    """Issue 23: another user's GPU job with the run's numbers (its leader gone, so nothing
    says the number was reused) is not the run's: the run's user is recorded."""
    job = proc(1095, 1, ROOTPID, SUP, "python", ("python", "train.py"), at=T0 + 50, uid=65534)
    snapshot = host(job, gpu=on_gpu(1095))
    without_leaders = tuple(p for p in snapshot.processes if p.pid not in (SUP, ROOTPID))
    snapshot = snapshot.model_copy(update={"processes": without_leaders})
    assert whys(snapshot, run_spec(uid=0)) == {}
    assert "owned by uid 65534" in left_alone(snapshot, run_spec(uid=0))[1095]
    assert whys(snapshot, run_spec(uid=65534)) == {}
    assert whys(snapshot, run_spec()) == {}  # an old record: no uid kept
    assert "not among" in left_alone(snapshot, run_spec())[1095]


def test_group_member_outside_the_run_window_is_not_selected() -> None:
    after = proc(1011, 1, ROOTPID, SUP, "VLLM::Worker", ("VLLM::Worker",), at=T0 + 400.0)
    stopped = run_spec(not_after=T0 + 300.0)
    # Reported (never selected) only inside the run's window.
    assert 1011 in left_alone(host(after, gpu=on_gpu(1011)), run_spec())  # no end: now
    assert 1011 not in left_alone(host(after, gpu=on_gpu(1011)), stopped)
    within_slack = proc(1012, 1, ROOTPID, SUP, "VLLM::Worker", ("VLLM::Worker",), at=T0 - 0.9)
    assert 1012 in left_alone(host(within_slack, gpu=on_gpu(1012)), run_spec())
    before = proc(1010, 1, ROOTPID, SUP, "VLLM::Worker", ("VLLM::Worker",), at=T0 - 10.0)
    assert 1010 not in left_alone(host(before, gpu=on_gpu(1010)), run_spec())
    for snapshot in (host(after, gpu=on_gpu(1011)), host(within_slack, gpu=on_gpu(1012))):
        assert whys(snapshot, run_spec()) == {SUP: SUPERVISOR, ROOTPID: ROOT}


HOLDS = "holding the run's GPU or port"


def test_port_holding_is_reported_for_a_group_member_without_signature() -> None:
    server = proc(1020, 1, ROOTPID, SUP, "my-server", ("my-server", "--port", "8000"),
                  at=T0 + 3)
    sockets = (ListeningSocket(port=8000, address="0.0.0.0", inode=99, pids=(1020,)),)
    spec = run_spec(signature="command")
    assert 1020 not in whys(host(server, sockets=sockets), spec)
    assert HOLDS in left_alone(host(server, sockets=sockets), spec)[1020]
    elsewhere = (ListeningSocket(port=9000, address="0.0.0.0", inode=99, pids=(1020,)),)
    assert HOLDS not in left_alone(host(server, sockets=elsewhere), spec)[1020]


def test_gpu_holding_is_reported_for_a_group_member_without_signature() -> None:
    holder = proc(1030, 1, ROOTPID, SUP, "python", ("python", "train.py"), at=T0 + 3)
    spec = run_spec(signature="command")
    assert 1030 not in whys(host(holder, gpu=on_gpu(1030)), spec)
    assert HOLDS in left_alone(host(holder, gpu=on_gpu(1030)), spec)[1030]
    assert HOLDS not in left_alone(host(holder, gpu=on_gpu(1030, index=1)), spec)[1030]
    devices = (DeviceHolder(pid=1030, devices=("/dev/nvidia0", "/dev/nvidiactl")),)
    assert HOLDS in left_alone(host(holder, device_holders=devices), spec)[1030]
    ctl_only = (DeviceHolder(pid=1030, devices=("/dev/nvidiactl", "/dev/nvidia-uvm")),)
    assert HOLDS not in left_alone(host(holder, device_holders=ctl_only), spec)[1030]


def test_cgroup_members_are_selected_whatever_they_did() -> None:
    """setsid'd, renamed, re-executed without the marker, re-parented: still a member."""
    ghost = proc(1040, 1, 1040, 1040, "sleep", ("renamed",), at=T0 + 8)
    assert whys(host(ghost), run_spec(cgroup="/sys/fs/cgroup/cleanslate-" + RUN),
                cgroup_members={ROOTPID, 1040})[1040] == CGROUP


def test_a_known_cgroup_turns_the_number_paths_off() -> None:
    """With the run's cgroup readable, a group member outside it is not the run's (even with
    the signature): nothing of the run leaves its cgroup."""
    worker = proc(1050, 1, ROOTPID, SUP, "VLLM::Worker", ("VLLM::Worker",), at=T0 + 25)
    spec = run_spec(cgroup="/sys/fs/cgroup/cleanslate-" + RUN)
    busy = host(worker, gpu=on_gpu(1050))
    assert 1050 not in whys(busy, spec, cgroup_members={ROOTPID})
    assert 1050 not in whys(busy, spec, cgroup_members=frozenset())  # cgroup gone
    assert 1050 not in left_alone(busy, spec, cgroup_members={ROOTPID})
    assert 1050 in left_alone(busy, spec, cgroup_members=None)  # no cgroup: reported


def test_cgroup_member_that_started_before_the_run_is_not_selected() -> None:
    old = proc(1060, 1, 1060, 1060, "sleep", ("sleep", "1"), at=T0 - 100)
    assert 1060 not in whys(host(old), run_spec(cgroup="/x/cleanslate-" + RUN),
                            cgroup_members={1060})


def test_named_engine_and_descendants() -> None:
    parent = proc(2000, 1, 2000, 2000, "python", ("python", "server.py"), at=T0 - 50)
    child = proc(2001, 2000, 2000, 2000, "python", ("python", "worker.py"), at=T0 - 49)
    grandchild = proc(2002, 2001, 2002, 2002, "sleep", ("sleep", "9"), at=T0 - 48)
    zombie = proc(2003, 2000, 2000, 2000, "python", (), at=T0 - 47, state="Z")
    stray = proc(2100, 1, 2100, 2100, "sglang::schedul", ("sglang::scheduler_TP0",))
    snapshot = host(parent, child, grandchild, zombie, stray)
    assert whys(snapshot, named(2000)) == {2000: NAMED, 2001: DESCENDANT, 2002: DESCENDANT}
    engine = ScopeSpec(engine="sglang", exclude_roots=frozenset({ME}))
    assert whys(snapshot, engine) == {2100: ENGINE}


# -- never selected -----------------------------------------------------------------------------


def test_protected_processes_and_why() -> None:
    member = proc(600, 400, 600, 400, "sleep", ("sleep", "100"))  # a job of our shell
    child = proc(601, ME, 601, 601, "python", ("python", "-I", "-S", "-"))
    protected = protected_pids(host(member, child), {ME})
    assert protected[1] == Protected.INIT
    assert protected[2] == Protected.KTHREAD and protected[40] == Protected.KTHREAD
    assert protected[400] == Protected.ANCESTOR and protected[300] == Protected.ANCESTOR
    assert protected[600] == Protected.SESSION
    assert protected[ME] == Protected.OWN
    assert protected[601] == Protected.OWN and protected[COLLECTOR] == Protected.OWN
    assert SUP not in protected and ROOTPID not in protected


def test_pid_1_is_never_selected_nor_expanded() -> None:
    """``clean --pid 1`` once listed every process on the host (descendants of PID 1)."""
    targets, refused = scope_and_protected(host(), named(1),
                                           now=NOW)
    assert targets == []
    assert [(t.pid, t.protected) for t in refused] == [(1, Protected.INIT)]


def test_the_calling_shell_is_never_selected() -> None:
    """``clean --pid $$`` once listed the calling shell."""
    targets, refused = scope_and_protected(host(), named(400),
                                           now=NOW)
    assert targets == []
    assert refused[0].pid == 400 and refused[0].protected == Protected.ANCESTOR


def test_no_path_reaches_a_protected_process() -> None:
    """Init that looks like vLLM (a container), a kernel thread named like an engine, our shell
    carrying the run's marker and numbers, a session member with the signature, our own child:
    none is selected by root, marker, group, session, engine, named, cgroup or descendant."""
    init = proc(1, 0, ROOTPID, SUP, "vllm", ("vllm", "serve", "m"), at=T0 + 1, marker=RUN)
    kthread = proc(41, 2, 0, 0, "vllm", at=T0 + 2)
    shell = proc(400, 300, ROOTPID, SUP, "bash", ("-bash",), at=T0 + 2, marker=RUN)
    job = proc(600, 400, ROOTPID, 400, "VLLM::Worker", ("VLLM::Worker",), at=T0 + 2,
               marker=RUN)
    snapshot = host(kthread, job)
    processes = [p for p in snapshot.processes if p.pid not in (1, 400)] + [init, shell]
    snapshot = snapshot.model_copy(update={"processes": tuple(processes)})
    protected = {1, 41, 400, 600, ME, COLLECTOR, 300, 2, 40}
    for spec, members in (
        (run_spec(root=(1, T0 + 1)), None),
        (run_spec(), None),
        (run_spec(cgroup="/x/cleanslate-" + RUN), frozenset({1, 41, 400, 600})),
        (ScopeSpec(engine="vllm", exclude_roots=frozenset({ME})), None),
        (ScopeSpec(pids=(1, 41, 400, 600, ME, 300), exclude_roots=frozenset({ME})), None),
    ):
        chosen = set(whys(snapshot, spec, cgroup_members=members))
        assert not chosen & protected, (spec, chosen & protected)


def test_descendant_walk_stops_at_protected_processes() -> None:
    """A named process's descendants are taken, except a child in our session (a job of our
    shell it adopted), and the walk does not go through that child to its own children."""
    parent = proc(2000, 1, 2000, 2000, "supervisord", ("supervisord",), at=T0 - 9000)
    child = proc(2001, 2000, 2001, 2001, "python", ("python", "app.py"), at=T0 - 8000)
    ours = proc(2002, 2000, 2002, 400, "sleep", ("sleep", "100"), at=T0 - 50)
    under_ours = proc(2003, 2002, 2003, 2003, "sleep", ("sleep", "100"), at=T0 - 40)
    targets, refused = scope_and_protected(
        host(parent, child, ours, under_ours), named(2000),
        now=NOW)
    assert {t.pid for t in targets} == {2000, 2001}
    assert [(t.pid, t.why, t.protected) for t in refused] == [
        (2002, DESCENDANT, Protected.SESSION)]


def test_naming_an_ancestor_of_ours_is_refused() -> None:
    """A tmux server that runs our shell is our ancestor: refused, and so not expanded."""
    tmux = proc(350, 1, 350, 350, "tmux: server", ("tmux",), at=T0 - 9000)
    other_pane = proc(351, 350, 351, 351, "bash", ("-bash",), at=T0 - 8000)
    snapshot = host(tmux, other_pane)
    processes = [p.model_copy(update={"ppid": 350}) if p.pid == 400 else p
                 for p in snapshot.processes]
    snapshot = snapshot.model_copy(update={"processes": tuple(processes)})
    targets, refused = scope_and_protected(snapshot, named(350),
                                           now=NOW)
    assert targets == []
    assert [(t.pid, t.protected) for t in refused] == [(350, Protected.ANCESTOR)]


def test_session_zero_protects_nothing() -> None:
    """In a PID namespace a session whose leader is outside reads as 0: not a session key."""
    inside = [p.model_copy(update={"sid": 0}) if p.pid in (400, ME) else p
              for p in host().processes]
    stray = proc(700, 1, 700, 0, "sglang::schedul", ("sglang::scheduler_TP0",))
    snapshot = host().model_copy(update={"processes": (*inside, stray)})
    assert whys(snapshot, ScopeSpec(engine="sglang", exclude_roots=frozenset({ME}))) == {
        700: ENGINE}


def test_pid_2_in_a_pid_namespace_is_an_ordinary_process() -> None:
    """Only the host's kthreadd is PID 2 without a command line; inside a PID namespace PID 2
    is whatever started second, and an engine there is selectable."""
    inside = [p for p in host().processes if p.pid not in (2, 40)]
    engine = proc(2, 1, 2, 2, "sglang::schedul", ("sglang::scheduler_TP0",))
    snapshot = host().model_copy(update={"processes": (*inside, engine)})
    assert 2 not in protected_pids(snapshot, {ME})
    assert whys(snapshot, ScopeSpec(engine="sglang", exclude_roots=frozenset({ME}))) == {
        2: ENGINE}


def test_remote_snapshot_protects_the_collectors_ssh_ancestors() -> None:
    """No local PIDs (remote host): the collector's ancestors (sshd, the login shell) and its
    session are protected all the same."""
    protected = protected_pids(host(), ())
    assert {300, 400, 1, 2, 40} <= set(protected)


def test_targets_carry_their_uid() -> None:
    worker = proc(1070, 1, 1070, 1070, "x", ("x",), marker=RUN, uid=1001)
    (target,) = [t for t in resolve_scope(host(worker), run_spec(), now=NOW) if t.pid == 1070]
    assert target.uid == 1001 and target.as_dict()["uid"] == 1001


def test_targets_carry_their_snapshots_boot_time_and_compare_times_since_boot() -> None:
    """A target keeps the boot time its start time was read against; a later snapshot whose
    ``btime`` moved by a whole second (a clock adjustment) still sees the same process, and a
    process started at another time since boot is still another process."""
    boot = T0 - 9500.0
    (target,) = [t for t in resolve_scope(host(boot_time=boot), run_spec(), now=NOW)
                 if t.pid == ROOTPID]
    assert target.boot_time == boot
    moved = proc(ROOTPID, SUP, ROOTPID, SUP, "python", at=T0 + 0.4 + 1.0)  # btime + 1 s
    assert same_process(moved, target.create_time, target.boot_time, boot + 1.0)
    assert not same_process(moved, target.create_time)  # without boot times: 1 s apart
    other = proc(ROOTPID, SUP, ROOTPID, SUP, "python", at=T0 + 0.4 + 1.5)
    assert not same_process(other, target.create_time, target.boot_time, boot + 1.0)
    # another boot an hour later, a process at the same time since its boot: not the target
    rebooted = proc(ROOTPID, SUP, ROOTPID, SUP, "python", at=T0 + 0.4 + 3600.0)
    assert not same_process(rebooted, target.create_time, target.boot_time, boot + 3600.0)
