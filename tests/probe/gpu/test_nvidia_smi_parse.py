"""The ``nvidia-smi`` CSV parsers on real outputs of a 2 x H200 host."""

from __future__ import annotations

import pytest

from cleanslate.probe.gpu.nvidia_smi import (
    APPS_QUERY_FIELDS,
    GPU_QUERY_FIELDS,
    parse_apps_query,
    parse_gpu_query,
    reading_from_outputs,
)
from cleanslate.probe.snapshot import GpuReading

from ._data import QUERY_22_FIELDS, UUID0, UUID1, output

#: What the ``*_apps*`` fixtures were asked for (the backend asked for a name column then;
#: it asks for :data:`APPS_QUERY_FIELDS` now).
NAMED_APPS_FIELDS = ("gpu_uuid", "pid", "process_name", "used_memory")


def reading(query: str, apps: str, nounits: bool = False) -> GpuReading:
    return reading_from_outputs(
        output(query), output(apps), query_fields=QUERY_22_FIELDS if nounits else GPU_QUERY_FIELDS,
        apps_fields=NAMED_APPS_FIELDS,
    )


def test_the_backend_asks_for_no_process_name() -> None:
    """A name is text the process chose, printed raw (a newline in it splits the row):
    ``tests/probe/gpu/test_nvidia_smi_names.py``."""
    assert "process_name" not in APPS_QUERY_FIELDS
    assert APPS_QUERY_FIELDS == ("gpu_uuid", "pid", "used_memory")


def test_the_22_field_list_is_the_header_of_the_fixtures() -> None:
    header = output("idle_query")[0].splitlines()[0]
    assert tuple(cell.split(" [")[0] for cell in header.split(", ")) == QUERY_22_FIELDS


@pytest.mark.parametrize("nounits", [False, True])
def test_idle_both_gpus_near_zero_and_na_retired_pages_is_unknown_not_a_problem(
    nounits: bool,
) -> None:
    r = reading("idle_query_nounits" if nounits else "idle_query", "idle_apps", nounits)
    assert r.ok, r.error
    assert r.backend == "nvidia-smi"
    assert r.driver_version == "580.159.04"
    assert [g.index for g in r.gpus] == [0, 1]
    assert [g.uuid for g in r.gpus] == [UUID0, UUID1]
    for gpu in r.gpus:
        assert gpu.source == "nvidia-smi"
        assert gpu.name == "NVIDIA H200"
        assert gpu.memory_used_mib is not None and gpu.memory_used_mib <= 4
        assert gpu.memory_total_mib == 143771
        assert gpu.memory_reserved_mib == 616
        assert gpu.processes == ()
        # [N/A] is unknown, never False or 0 ...
        assert gpu.retired_pages_pending is None
        assert gpu.unknown_fields == ("retired_pages_pending",)
        # ... and not a health problem: the GPU is otherwise fine.
        assert gpu.health == ()
        assert gpu.ecc_uncorrected == 0
        assert gpu.remapped_rows_pending is False
        assert gpu.remapped_rows_failure is False
    assert [g.pci_bus_id for g in r.gpus] == ["00000000:00:06.0", "00000000:00:07.0"]


@pytest.mark.parametrize("nounits", [False, True])
def test_busy_memory_and_processes_attached_by_uuid(nounits: bool) -> None:
    suffix = "_nounits" if nounits else ""
    r = reading(f"busy_query{suffix}", f"busy_apps{suffix}", nounits)
    assert r.ok, r.error
    gpu0, gpu1 = r.gpus
    assert gpu0.memory_used_mib == 41487
    assert [(p.pid, p.used_mib) for p in gpu0.processes] == [(584, 41478)]
    assert gpu1.memory_used_mib == 25627
    assert [(p.pid, p.used_mib) for p in gpu1.processes] == [(627, 20998), (665, 4614)]
    # process_name is the executable path nvidia-smi prints, not the renamed comm.
    assert gpu0.processes[0].name == "python3"
    assert {p.name for p in gpu1.processes} == {"/opt/venv/bin/python3"}
    assert gpu0.health == gpu1.health == ()


def test_units_and_nounits_read_the_same() -> None:
    with_units = reading("busy_query", "busy_apps")
    # power.draw differs between the two captures, but none of the fields we keep does.
    assert reading("busy_query_nounits", "busy_apps_nounits", nounits=True) == with_units


def test_final_query_is_clean() -> None:
    r = reading("final_query", "idle_apps")
    assert r.ok
    assert [g.memory_used_mib for g in r.gpus] == [0, 0]
    assert all(g.processes == () and g.health == () for g in r.gpus)


def test_idle_apps_is_header_only() -> None:
    assert parse_apps_query(*output("idle_apps")).processes == ()


@pytest.mark.parametrize(
    ("stem", "code", "message"),
    [
        ("bad_field", 2, 'Field "memory.bogus" is not a valid field to query.'),
        ("bad_index", 6, "No devices were found"),
    ],
)
def test_nonzero_exit_is_not_ok_and_quotes_nvidia_smi(stem: str, code: int, message: str) -> None:
    r = reading_from_outputs(output(stem), output("idle_apps"))
    assert not r.ok
    assert r.gpus == ()
    assert r.error is not None
    assert message in r.error
    assert f"exited {code}" in r.error


def test_rejected_field_is_named() -> None:
    assert parse_gpu_query(*output("bad_field")).rejected_field == "memory.bogus"
    assert parse_gpu_query(*output("bad_index")).rejected_field is None


def test_failed_apps_query_makes_reading_not_ok_but_keeps_gpus() -> None:
    r = reading_from_outputs(output("busy_query"), output("bad_index"))
    assert not r.ok
    assert r.error is not None and "No devices were found" in r.error
    assert len(r.gpus) == 2


# Variations of the real rows, to reach the states a healthy test host cannot show on demand.
# Each starts from a real fixture line and changes one value.


def _busy_with(field: str, value: str, gpu: int = 0) -> str:
    text = output("busy_query")[0]
    header, *rows = text.splitlines()
    position = [c.split(" [")[0] for c in header.split(", ")].index(field)
    cells = rows[gpu].split(", ")
    cells[position] = value
    rows[gpu] = ", ".join(cells)
    return "\n".join([header, *rows]) + "\n"


@pytest.mark.parametrize(
    "value", ["[N/A]", "[Not Supported]", "[Unknown Error]", "[GPU requires reset]", "lots MiB"]
)
def test_unreadable_memory_used_is_unknown_never_zero(value: str) -> None:
    gpus = parse_gpu_query(_busy_with("memory.used", value), "", 0)
    assert gpus.error is None
    gpu0 = gpus.gpus[0]
    assert gpu0.memory_used_mib is None
    assert "memory_used_mib" in gpu0.unknown_fields
    troubled = value in ("[Unknown Error]", "[GPU requires reset]")
    assert bool(gpu0.health) is troubled
    if troubled:
        assert value in gpu0.health[0]
    assert gpus.gpus[1].memory_used_mib == 25627


def test_trouble_values_are_read_and_left_to_the_verdict() -> None:
    # Uncorrected ECC errors and pending remapping are values the verdict judges (against a
    # baseline); they are not repeated in `health`, which holds what the tool reported.
    text = _busy_with("ecc.errors.uncorrected.volatile.total", "3", gpu=1)
    gpu1 = parse_gpu_query(text, "", 0).gpus[1]
    assert gpu1.ecc_uncorrected == 3
    assert gpu1.health == ()
    pending = parse_gpu_query(_busy_with("remapped_rows.pending", "Yes"), "", 0).gpus[0]
    assert pending.remapped_rows_pending is True
    assert pending.health == ()


def test_unreadable_row_is_not_ok() -> None:
    text = output("busy_query")[0].rstrip("\n") + "\n3, GPU-truncated\n"
    r = reading_from_outputs((text, "", 0), output("busy_apps"))
    assert not r.ok
    assert r.error is not None and "cannot read" in r.error and "GPU-truncated" in r.error


def test_missing_index_is_not_ok() -> None:
    r = reading_from_outputs((_busy_with("index", "[N/A]"), "", 0), output("busy_apps"))
    assert not r.ok


def test_exit_zero_without_gpus_is_not_ok() -> None:
    header_only = output("busy_query")[0].splitlines()[0] + "\n"
    assert not reading_from_outputs((header_only, "", 0), output("idle_apps")).ok
    assert not reading_from_outputs(("", "", 0), output("idle_apps")).ok


def test_process_on_unlisted_gpu_is_not_ok() -> None:
    apps = output("busy_apps")[0].replace(UUID1, "GPU-not-in-the-gpu-list")
    r = reading_from_outputs(output("busy_query"), (apps, "", 0))
    assert not r.ok
    assert r.error is not None and "GPU-not-in-the-gpu-list" in r.error


def test_process_name_with_comma_space_stays_one_value() -> None:
    apps = output("busy_apps")[0].replace("/opt/venv/bin/python3", "/opt/a, b/python3")
    procs = parse_apps_query(apps, "", 0).processes
    assert [p.name for _, p in procs][1:] == ["/opt/a, b/python3"] * 2


def test_na_process_memory_is_unknown() -> None:
    apps = output("busy_apps")[0].replace("4614 MiB", "[N/A]")
    procs = dict((p.pid, p) for _, p in parse_apps_query(apps, "", 0).processes)
    assert procs[665].used_mib is None
    assert procs[627].used_mib == 20998


def test_apps_noheader_needs_the_field_list() -> None:
    procs = parse_apps_query(*output("busy_apps_nounits"), fields=NAMED_APPS_FIELDS).processes
    assert [(uuid, p.pid) for uuid, p in procs] == [(UUID0, 584), (UUID1, 627), (UUID1, 665)]
