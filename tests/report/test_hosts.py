"""The hosts' doctor snapshots in a report: the console table, ``--format json`` and the HTML
page's Hosts section, with the real H200 capture's GPU row, a snapshot that failed, and a host
whose text (GPU name, kernel, evidence) is hostile markup, printed as text and escaped."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from cleanslate.doctor import HostDoctor
from cleanslate.doctor.report import DoctorSeverity
from cleanslate.doctor.snapshot import GpuRow, HostSnapshot, SnapshotFinding
from cleanslate.report import load_report, print_report, render_html, study_document
from cleanslate.store import HostRecord, Store
from tests.doctor.captures import H200X1
from tests.report.conftest import load_recorded

HOSTILE_NAME = "NVIDIA <script>alert(1)</script> [bold red]H200[/]"
HOSTILE_KERNEL = "6.1</code><img src=x onerror=alert(2)>"
HOSTILE_EVIDENCE = "lspci: <iframe src=//x></iframe> $\\frac{a}{b}$"


def h200_snapshot() -> HostSnapshot:
    [host] = json.loads((H200X1 / "doctor-report.json").read_text())["hosts"]
    host.pop("exit_code")
    return HostSnapshot.of(HostDoctor.model_validate(host), taken_at=1_790_000_000.0)


def hostile_snapshot() -> HostSnapshot:
    return HostSnapshot(
        host="evil", taken_at=1_790_000_000.0, elapsed_s=0.3, driver_present=True,
        driver="580<b>", cuda="13.0", kernel=HOSTILE_KERNEL, shm_bytes=64 * 2**20,
        gpus=(GpuRow(index=0, name=HOSTILE_NAME, uuid="GPU-<u>", pcie_gen=4, pcie_gen_max=5,
                     pcie_width=8, pcie_width_max=16),),
        findings=(SnapshotFinding(code="pcie_width_downtrained", severity=DoctorSeverity.ERROR,
                                  message="GPU 0 <marquee>x8 of x16</marquee>",
                                  consequence="a fraction [/] of the bandwidth", gpus=(0,),
                                  evidence=(HOSTILE_EVIDENCE,)),))


@pytest.fixture(scope="module")
def hosts_store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The recorded studies, ``quickstart`` with three host snapshots: the H200 capture, one
    that failed and a hostile one."""
    folder = tmp_path_factory.mktemp("hosts")
    url = f"sqlite:///{folder / 'cleanslate.db'}"
    load_recorded(url)
    store = Store(url)
    store.save_host(HostRecord(study="quickstart", host="gpu-h200", snapshot=h200_snapshot()))
    failed = HostSnapshot.failed("gone", "`python3 -I - ...` timed out after 30.0 s",
                                 elapsed_s=30.0, taken_at=1_790_000_500.0)
    store.save_host(HostRecord(study="quickstart", host="gone", snapshot=failed))
    store.save_host(HostRecord(study="quickstart", host="evil", snapshot=hostile_snapshot()))
    store.close()
    return url


def _page(url: str, name: str) -> str:
    store = Store(url, create=False)
    try:
        return render_html([load_report(store, name)], plots=[])
    finally:
        store.close()


def test_the_page_has_a_hosts_section_with_the_h200_row(hosts_store: str) -> None:
    html = _page(hosts_store, "quickstart")
    assert '<h2 id="Hosts-quickstart">Hosts</h2>' in html
    assert '<a href="#Hosts-quickstart">Hosts</a>' in html
    section = html.split('<h2 id="Hosts-quickstart">', 1)[1].split("<h2", 1)[0]
    h200 = section.split('id="host-quickstart-0"', 1)[1].split('<div class="host', 1)[0]
    assert "<h3>gpu-h200</h3>" in h200
    for cell in ("<td>NVIDIA H200</td>", "GPU-37a88d38-c361-3f15-077c-e1be989b431f",
                 "00000000:00:06.0", "<td>gen 5 x16 of gen 5 x16</td>", "<td>Idle</td>",
                 "<td>700 W of 700 W</td>", "580.159.04", "13.0", "128.0 GiB",
                 "firecracker"):
        assert cell in h200, cell
    assert "running in a virtual machine: firecracker" in h200
    failed = section.split('id="host-quickstart-2"', 1)[1].split("</div>", 1)[0]
    assert 'class="host failed"' in section
    assert "The doctor snapshot failed after 30.0 s" in failed and "timed out" in failed


def test_hostile_host_text_is_escaped_in_the_page(hosts_store: str) -> None:
    html = _page(hosts_store, "quickstart")
    for raw in ("<script>alert", "<img src=x", "<iframe", "<marquee>", "580<b>", "GPU-<u>"):
        assert raw not in html, raw
    assert "NVIDIA &lt;script&gt;alert(1)&lt;/script&gt; [bold red]H200[/]" in html
    assert "6.1&lt;/code&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert "lspci: &lt;iframe src=//x&gt;&lt;/iframe&gt; $\\frac{a}{b}$" in html
    # The downtrained link is marked, as text.
    assert '<span class="down">gen 4 x8 of gen 5 x16</span>' in html


def test_the_console_shows_each_host_and_its_findings_as_text(hosts_store: str) -> None:
    store = Store(hosts_store, create=False)
    try:
        report = load_report(store, "quickstart")
    finally:
        store.close()
    out = io.StringIO()
    print_report(Console(file=out, width=400, no_color=True), report)
    text = out.getvalue()
    assert "hosts of quickstart (doctor snapshots)" in text
    assert "1 x NVIDIA H200" in text and "0: PCIe gen 5 x16 of gen 5 x16" in text
    assert "580.159.04 (CUDA 13.0)" in text and "128.0 GiB" in text
    assert "snapshot failed: `python3 -I - ...` timed out after 30.0 s" in text
    assert HOSTILE_NAME in text  # rich markup in host text is shown, not interpreted
    assert "error: GPU 0 <marquee>x8 of x16</marquee> (a fraction [/] of the bandwidth)" in text


def test_json_carries_every_snapshot_with_its_summary(hosts_store: str) -> None:
    store = Store(hosts_store, create=False)
    try:
        document = study_document(load_report(store, "quickstart"))
    finally:
        store.close()
    hosts = {h["host"]: h for h in document["hosts"]}
    assert list(hosts) == ["gpu-h200", "evil", "gone"]  # in the order they were taken
    h200 = hosts["gpu-h200"]
    assert h200["version"] == 1 and h200["gpus"][0]["name"] == "NVIDIA H200"
    assert h200["gpus"][0]["pcie_width"] == 16 and h200["driver"] == "580.159.04"
    assert h200["summary"].startswith("driver 580.159.04 CUDA 13.0; 1 x NVIDIA H200")
    assert {f["code"] for f in h200["findings"]} == {"virtual_machine", "dockerenv"}
    assert hosts["gone"]["error"].endswith("timed out after 30.0 s") and hosts["gone"]["gpus"] == []
    json.dumps(document)  # plain JSON


def test_a_snapshot_taken_on_a_real_h200_renders_its_gpu_row(tmp_path: Path) -> None:
    """``h200x1/snapshot.json``: what ``snapshot_host`` recorded on an H200 VM."""
    snap = HostSnapshot.model_validate_json((H200X1 / "snapshot.json").read_text())
    assert snap.error is None and snap.driver == "580.159.04" and len(snap.gpus) == 1
    url = f"sqlite:///{tmp_path / 'c.db'}"
    load_recorded(url)
    store = Store(url)
    store.save_host(HostRecord(study="report-tiny", host="h200", snapshot=snap))
    store.close()
    html = _page(url, "report-tiny")
    row = html.split('id="host-report-tiny-0"', 1)[1].split("</table>", 1)[0]
    for cell in ("<td>NVIDIA H200</td>", "GPU-19badb04-fda7-e8f7-c7f7-f988d5b56128",
                 "<td>gen 5 x16 of gen 5 x16</td>", "<td>on</td>", "<td>Idle</td>",
                 "<td>700 W of 700 W</td>"):
        assert cell in row, cell


def test_a_study_without_snapshots_says_so(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'c.db'}"
    load_recorded(url)
    html = _page(url, "report-tiny")
    assert "No doctor snapshot is recorded for this study" in html
    store = Store(url, create=False)
    try:
        report = load_report(store, "report-tiny")
    finally:
        store.close()
    assert report.hosts == () and study_document(report)["hosts"] == []
    out = io.StringIO()
    print_report(Console(file=out, width=200), report)
    assert "doctor snapshots" not in out.getvalue()
