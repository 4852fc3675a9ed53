"""What a report says of a capacity search (a study whose objective is
``max_concurrency_under_slo`` or ``max_goodput``: each trial ran
:class:`cleanslate.bench.CapacitySearch` and keeps its answer, ``TrialRecord.capacity``).

Plain text and data (no rich, no matplotlib): the tables, the page, the exports and
``cleanslate tune``'s summary take their words from here, so they say the same:

- :func:`bracket_text`: ``c=96 [96, 104)``, the capacity with the bracket the boundary lies in;
- :func:`probes_text`: ``8 (tolerance)``, the probes the search used and what stopped it;
- :func:`findings_text`: the crash (``crashed at c=128 (cuda_error)``), unresolved probes and
  cliffs, short;
- :func:`capacity_document`: the JSON of the answer as the report's ``best`` and ``tune
  --json`` hold it (the trial records carry the whole :class:`CapacityResult` besides).
"""

from __future__ import annotations

import re

from cleanslate.bench import CAPACITY_OBJECTIVES, CapacityResult, Probe, ProbeVerdict, StopReason
from cleanslate.report._documents import CapacityCells, CapacityDocument, ProbeDocument

#: What stopped a search, in the words of the tables.
STOP_WORDS = {
    StopReason.TOLERANCE: "tolerance",
    StopReason.MAX_LOAD: "cap reached",
    StopReason.NOTHING_PASSES: "nothing passes",
    StopReason.CRASHED: "crashed",
    StopReason.MAX_PROBES: "probe limit",
    StopReason.INTERRUPTED: "interrupted",
}


def is_capacity_metric(metric: str) -> bool:
    """Whether a study's objective is the answer of a capacity search."""
    return metric in CAPACITY_OBJECTIVES


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def bracket_text(result: CapacityResult) -> str:
    """``c=96 [96, 104)``: the highest load that passed and the bracket ``[capacity, upper)``
    the boundary lies in; ``c=4096 (cap: every probe passed)`` when nothing above it failed;
    ``none (c=1 did not pass)`` when no probe passed."""
    if result.capacity is None:
        lowest = result.lowest_probe()
        return "none" if lowest is None else f"none ({result.label(lowest)} did not pass)"
    head = result.label(result.capacity)
    if result.upper is None and result.stopped_by == StopReason.MAX_LOAD:
        return f"{head} (cap: every probe passed)"
    if result.upper is None:
        return f"at least {head} (stopped: {result.stopped_by.value})"
    return f"{head} [{_num(result.capacity)}, {_num(result.upper)})"


def probes_text(result: CapacityResult) -> str:
    """``8 (tolerance)``; ``9 (tolerance, 2 extended)`` when probes were measured again."""
    extended = sum(1 for p in result.probes if p.measurements > 1)
    stop = STOP_WORDS.get(result.stopped_by, str(result.stopped_by))
    return f"{len(result.probes)} ({stop}{f', {extended} extended' if extended else ''})"


def probes_phrase(result: CapacityResult) -> str:
    """``8 probes (tolerance, 1 extended)``: :func:`probes_text` in a sentence."""
    return probes_text(result).replace(" (", " probes (", 1)


def crash_probe(result: CapacityResult) -> Probe | None:
    return next((p for p in result.probes if p.verdict == ProbeVerdict.CRASHED), None)


def crash_text(result: CapacityResult, *, detail: bool = False) -> str | None:
    """``crashed at c=128 (cuda_error)`` (with ``detail``: the search's own line, ``crashed at
    c=128 (cuda_error: illegal memory access)``); ``None`` when the server did not crash."""
    if result.crash is None:
        return None
    probe = crash_probe(result)
    if detail or probe is None or not probe.cause:
        return result.crash
    return f"crashed at {probe.label} ({probe.cause})"


_CLIFF = re.compile(r"fell (?P<fall>\d+%) from (?P<a>\S+) .*? to (?P<b>\S+) ")


def cliff_short(cliff: str) -> str:
    """``cliff c=16→c=32 -37%`` from the search's cliff line (the line itself when it is not
    in the search's words)."""
    found = _CLIFF.search(cliff)
    if found is None:
        return cliff
    return f"cliff {found['a']}→{found['b']} -{found['fall']}"


def other_failures(result: CapacityResult) -> list[str]:
    """Probes that were upper bounds for another reason than the SLOs or a crash: request
    errors and bad output (``errors at c=64``)."""
    words = {ProbeVerdict.ERRORS: "errors", ProbeVerdict.BAD_OUTPUT: "bad output"}
    return [f"{words[p.verdict]} at {p.label}" + (f" ({p.cause})" if p.cause and
                                                   p.verdict != ProbeVerdict.ERRORS else "")
            for p in result.probes if p.verdict in words]


def findings_text(result: CapacityResult) -> str:
    """What the search found besides the bracket, short: the crash, unresolved probes,
    errors and bad output, cliffs (``crashed at c=64 (cuda_error); unresolved c=48``);
    empty when there is none."""
    parts = []
    crash = crash_text(result)
    if crash:
        parts.append(crash)
    if result.unresolved:
        parts.append("unresolved " + ", ".join(result.label(x) for x in result.unresolved))
    parts += other_failures(result)
    parts += [cliff_short(c) for c in result.cliffs]
    return "; ".join(parts)


def probe_document(probe: Probe) -> ProbeDocument:
    """A probe as the summaries hold it: verdict, load, attainment with its interval and
    target, requests and measurements."""
    return {"index": probe.index, "label": probe.label, "load": probe.load,
            "verdict": probe.verdict.value, "attainment": probe.attainment,
            "ci_low": probe.attainment_low, "ci_high": probe.attainment_high,
            "target": probe.target, "requests": probe.requests,
            "measurements": probe.measurements, "output_throughput": probe.output_throughput,
            "cause": probe.cause}


def capacity_document(result: CapacityResult) -> CapacityDocument:
    """The answer of one search as JSON: ``capacity`` and ``upper`` (the bracket
    ``[capacity, upper)``), ``bracket`` and ``summary`` (the text), ``dimension``,
    ``stopped_by``, ``crash``, ``cliffs``, ``unresolved``, ``max_goodput``, and ``probes``
    (:func:`probe_document`, in probe order)."""
    return {"capacity": result.capacity, "upper": result.upper,
            "bracket": bracket_text(result), "summary": result.summary(),
            "dimension": result.dimension, "tolerance": result.tolerance,
            "stopped_by": result.stopped_by.value, "resolved": result.resolved,
            "crash": result.crash, "cliffs": list(result.cliffs),
            "unresolved": list(result.unresolved), "max_goodput": result.max_goodput,
            "probes": [probe_document(p) for p in result.probes]}


#: CSV columns of a capacity study (after ``best_level``).
CSV_COLUMNS = ("capacity", "capacity_upper", "capacity_bracket", "probes", "stopped_by",
               "crash", "unresolved", "cliffs")


def csv_fields(result: CapacityResult | None) -> CapacityCells:
    """:data:`CSV_COLUMNS` of one trial (empty cells without a search)."""
    if result is None:
        return {"capacity": None, "capacity_upper": None, "capacity_bracket": None,
                "probes": None, "stopped_by": None, "crash": None, "unresolved": None,
                "cliffs": None}
    return {"capacity": result.capacity, "capacity_upper": result.upper,
            "capacity_bracket": bracket_text(result), "probes": len(result.probes),
            "stopped_by": result.stopped_by.value, "crash": result.crash,
            "unresolved": " ".join(_num(x) for x in result.unresolved) or None,
            "cliffs": "; ".join(result.cliffs) or None}
