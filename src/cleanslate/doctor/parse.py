"""Pure parsers of what ``nvidia-smi`` prints: ``-q``, ``topo -m`` and ``topo -p2p``.

Host-independent and tested on real captures (``tests/fixtures/doctor/``,
``tests/fixtures/nvidia-h200x2/``). Each value keeps the line it came from, so a finding can
cite its evidence. ``N/A``, ``Not Supported`` and the like stay strings: an unknown is never a
zero.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from cleanslate.errors import CleanslateError

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE = re.compile(r"^(GPU|NIC)\d+$")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escapes (``topo -m`` underlines its header)."""
    return _ANSI.sub("", text)


@dataclass(frozen=True)
class TopoMatrix:
    """``nvidia-smi topo -m``: the link between each pair of devices (``NV18``, ``PHB``, ``SYS``,
    ``NODE``, ``PIX``, ``PXB``, ``X`` for itself) and each GPU's CPU and NUMA affinity.
    ``lines``: the raw row of each device, for evidence."""

    devices: tuple[str, ...]
    links: dict[tuple[str, str], str] = field(default_factory=dict)
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, str] = field(default_factory=dict)
    lines: dict[str, str] = field(default_factory=dict)

    def gpu_link(self, a: int, b: int) -> str | None:
        return self.links.get((f"GPU{a}", f"GPU{b}"))


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("\t")]


def parse_topo_matrix(text: str) -> TopoMatrix | None:
    """Parse ``nvidia-smi topo -m``; ``None`` when ``text`` holds no matrix."""
    lines = strip_ansi(text).splitlines()
    header_at = next((i for i, line in enumerate(lines)
                      if "\t" in line and any(_DEVICE.match(c) for c in _cells(line))
                      and not _DEVICE.match(line.split("\t", 1)[0].strip())), None)
    if header_at is None:
        return None
    names = [c for c in _cells(lines[header_at]) if c]
    devices = tuple(c for c in names if _DEVICE.match(c))
    links: dict[tuple[str, str], str] = {}
    cpu: dict[str, str] = {}
    numa: dict[str, str] = {}
    raw: dict[str, str] = {}
    for line in lines[header_at + 1:]:
        cells = _cells(line)
        if not cells or not _DEVICE.match(cells[0]):
            if raw:
                break  # the legend
            continue
        row, rest = cells[0], cells[1:]
        raw[row] = line.strip()
        for col, value in zip(devices, rest, strict=False):
            links[(row, col)] = value
        extra = rest[len(devices):]
        if row.startswith("GPU") and "CPU Affinity" in names:
            if len(extra) > 0:
                cpu[row] = extra[0]
            if len(extra) > 1 and "NUMA Affinity" in names:
                numa[row] = extra[1]
    return TopoMatrix(devices=devices, links=links, cpu_affinity=cpu, numa_affinity=numa,
                      lines=raw)


#: What the codes of ``topo -p2p`` mean (its legend).
P2P_CODES = {
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "NS": "not supported",
    "U": "unknown",
    "X": "self",
}


def parse_p2p_matrix(text: str) -> TopoMatrix | None:
    """Parse ``nvidia-smi topo -p2p r|w|n|a`` (the same layout as ``topo -m``, codes ``OK``,
    ``NS``, ``CNS``, ``GNS``, ``TNS``, ``U``, ``X``); ``None`` when ``text`` holds no matrix."""
    return parse_topo_matrix(text)


@dataclass(frozen=True)
class SmiValue:
    """One ``Key : Value`` of ``nvidia-smi -q``: its value and the line, stripped."""

    value: str
    line: str


@dataclass(frozen=True)
class SmiGpu:
    """One GPU of ``nvidia-smi -q``: ``fields`` by path (``"PCI/GPU Link Info/Link
    Width/Current"``)."""

    bus_id: str
    fields: dict[str, SmiValue]

    def get(self, path: str) -> SmiValue | None:
        return self.fields.get(path)


@dataclass(frozen=True)
class SmiLog:
    """``nvidia-smi -q``: the driver and CUDA versions and the GPUs in order (their index)."""

    driver: SmiValue | None
    cuda: SmiValue | None
    gpus: tuple[SmiGpu, ...]


class SmiParseError(CleanslateError, ValueError):
    """``nvidia-smi -q`` printed text that does not read as its log: the host's GPUs cannot be
    told. The message names the line."""


#: A GPU section's first line: ``GPU 00000000:00:06.0`` (older drivers: ``GPU 0000:01:00.0``).
_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
#: The section of a GPU that lists its processes by name.
_PROCESSES = "Processes"


def parse_smi_q(text: str) -> SmiLog:
    """Parse ``nvidia-smi -q`` into nested paths by indentation (4 spaces a level).

    Each GPU's ``Processes`` section is skipped, up to the next GPU's first line:
    ``nvidia-smi`` prints each process's name (its ``argv[0]``) raw there, so a local user's
    CUDA process named with newlines can print any line, a field of the GPU included. What such
    a name could still do is refused, never read: raises :class:`SmiParseError` when the text
    has no ``Attached GPUs : N`` before the GPUs, when the GPU sections are not N, when a GPU is
    listed twice, when a field comes twice in one GPU's section, or when a line at the left
    margin among the GPUs is not a GPU's first line.
    """
    driver = cuda = None
    attached: int | None = None
    gpus: list[SmiGpu] = []
    buses: set[str] = set()
    current: dict[str, SmiValue] | None = None
    seen: set[str] = set()
    bus = ""
    skipping = False
    stack: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        header = _GPU_HEADER.match(raw)
        if header is not None:
            if current is not None:
                gpus.append(SmiGpu(bus, current))
            bus = header.group(1)
            if bus in buses:
                raise SmiParseError(f"line {number}: GPU {bus} is listed twice")
            if attached is None:
                raise SmiParseError(f"line {number}: a GPU before `Attached GPUs : N`")
            buses.add(bus)
            current, seen, stack, skipping = {}, set(), [], False
            continue
        if skipping:
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        key, sep, value = raw.strip().partition(":")
        key = key.strip()
        if current is None:
            if sep and key == "Driver Version":
                driver = SmiValue(value.strip(), raw.strip())
            elif sep and key == "CUDA Version":
                cuda = SmiValue(value.strip(), raw.strip())
            elif sep and key == "Attached GPUs":
                if attached is not None or not value.strip().isdigit():
                    raise SmiParseError(f"line {number}: {raw.strip()!r}")
                attached = int(value.strip())
            continue
        if indent == 0:
            raise SmiParseError(f"line {number}: {raw.strip()[:80]!r} in GPU {bus}'s section "
                                "is not a GPU's first line")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = "/".join([*(k for _, k in stack), key])
        if path == _PROCESSES:
            skipping = True
            continue
        if path in seen:
            raise SmiParseError(f"line {number}: {path} comes twice in GPU {bus}'s section")
        seen.add(path)
        if sep and value.strip() != "":
            current[path] = SmiValue(value.strip(), re.sub(r"\s+:", " :", raw.strip()))
        else:
            stack.append((indent, key))
    if current is not None:
        gpus.append(SmiGpu(bus, current))
    if attached is None:
        raise SmiParseError("no `Attached GPUs : N` line: not the output of `nvidia-smi -q`")
    if len(gpus) != attached:
        raise SmiParseError(f"{len(gpus)} GPU sections for `Attached GPUs : {attached}`")
    return SmiLog(driver, cuda, tuple(gpus))


def smi_int(value: SmiValue | None) -> int | None:
    """The leading integer of a value (``"16x"`` -> 16, ``"0 us"`` -> 0); ``None`` for ``N/A``."""
    if value is None:
        return None
    match = re.match(r"^-?\d+", value.value)
    return int(match.group(0)) if match else None


def smi_float(value: SmiValue | None) -> float | None:
    """The leading number of a value (``"700.00 W"`` -> 700.0); ``None`` for ``N/A``."""
    if value is None:
        return None
    match = re.match(r"^-?\d+(\.\d+)?", value.value)
    return float(match.group(0)) if match else None


def smi_bool(value: SmiValue | None, yes: tuple[str, ...] = ("Enabled", "Yes", "Active")
             ) -> bool | None:
    """``Enabled``/``Yes``/``Active`` -> True, ``Disabled``/``No``/``Not Active`` -> False,
    anything else (``N/A``) -> None."""
    if value is None:
        return None
    if value.value in yes:
        return True
    if value.value in ("Disabled", "No", "Not Active"):
        return False
    return None


__all__ = [
    "P2P_CODES",
    "SmiGpu",
    "SmiLog",
    "SmiParseError",
    "SmiValue",
    "TopoMatrix",
    "parse_p2p_matrix",
    "parse_smi_q",
    "parse_topo_matrix",
    "smi_bool",
    "smi_float",
    "smi_int",
    "strip_ansi",
]
