"""One self-contained HTML page for one study (or two side by side).

Self-contained: the CSS is inline, the plots are base64 PNGs in ``data:`` URLs, there is no
script, no font, no CDN: the page renders the same from a file, an e-mail attachment or an
air-gapped host. Every text from the store (parameters, causes, log tails, findings) is
HTML-escaped.
"""

from __future__ import annotations

import base64
import datetime as _dt
import re
from collections.abc import Iterable
from html import escape
from typing import Any

from cleanslate import __version__
from cleanslate.bench import bound_by
from cleanslate.bench import bound_lines as bench_bound_lines
from cleanslate.doctor.snapshot import GpuRow, HostSnapshot
from cleanslate.report._bench import BenchReport
from cleanslate.report._bounds import bound_cell, moved, trial_bound_lines
from cleanslate.report._capacity import bracket_text, crash_text, probes_phrase
from cleanslate.report._console import (
    CAPACITY_HEADERS,
    best_capacity_text,
    best_lines,
    capacity_cells,
    metric_text,
    runs_text,
    value_text,
)
from cleanslate.report._data import (
    LEVEL_COLUMNS,
    StudyReport,
    TrialView,
    comparable,
    format_value,
    level_concurrency,
    params_text,
    safe_url,
    shared_configs,
    show,
)
from cleanslate.report._guided import guided_timeline
from cleanslate.report._plots import (
    MAX_CAPACITY_PLOTS,
    MAX_PANELS,
    Plot,
    capacity_plot_name,
    level_plots,
    render_plots,
)
from cleanslate.stats import TOO_FEW, Outcome
from cleanslate.store import level_metric
from cleanslate.verdict.findings import Finding

_CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --bg: #ffffff; --panel: #f6f7f9;
  --good: #1b5e20; --good-bg: #e3f2e5; --bad: #b71c1c; --bad-bg: #fde8e8; --warn: #8a5300;
  --warn-bg: #fff3d6; --accent: #1f4e9a; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
  Roboto, "DejaVu Sans", sans-serif; color: var(--fg); background: var(--bg); }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 32px 0 10px; padding-bottom: 4px; border-bottom: 2px solid
  var(--line); }
h3 { font-size: 15px; margin: 18px 0 6px; }
p { margin: 6px 0; }
.meta { color: var(--muted); }
.meta b { color: var(--fg); font-weight: 600; }
.banner { margin: 14px 0; padding: 10px 14px; border-radius: 6px; border: 1px solid #e0b44c;
  background: var(--warn-bg); color: var(--warn); }
.best { padding: 12px 16px; border-radius: 8px; background: var(--good-bg); border: 1px solid
  #b9dcbc; }
.none { padding: 12px 16px; border-radius: 8px; background: var(--bad-bg); border: 1px solid
  #f1b9b9; }
table { border-collapse: collapse; margin: 6px 0 12px; font-size: 13px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: var(--panel); font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.best-row td { background: #f0f8f1; font-weight: 600; }
tr.tied-row td { background: #f3f7fd; }
.wide { overflow-x: auto; max-width: 100%; }
pre { background: #0f1419; color: #e6e6e6; padding: 10px 12px; border-radius: 6px;
  overflow-x: auto; white-space: pre-wrap; word-break: break-all; font: 12px/1.4
  ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; margin: 6px 0 12px; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px;
  font-weight: 600; white-space: nowrap; }
.b-feasible, .b-clean, .b-ok { background: var(--good-bg); color: var(--good); }
.b-infeasible, .b-dirty, .b-crashed, .b-errors { background: var(--bad-bg); color: var(--bad); }
.b-unknown, .b-slo_miss, .b-infra_failed, .b-running, .b-warning, .b-interrupted, .b-none,
.b-unresolved { background: var(--warn-bg); color: var(--warn); }
.b-pass { background: var(--good-bg); color: var(--good); }
.b-fail, .b-bad_output { background: var(--bad-bg); color: var(--bad); }
.capacity { border-left: 4px solid var(--line); padding: 2px 0 2px 12px; margin: 14px 0; }
.capacity figure img { max-width: 760px; }
.nowrap { white-space: nowrap; }
.b-error { background: var(--bad-bg); color: var(--bad); }
.b-best, .b-win { background: var(--good-bg); color: var(--good); }
.b-tie { background: #e3ecf9; color: var(--accent); }
.b-undecided, .b-undecidedtoofewmeasurements, .b-tietoofewmeasurements,
.b-oneruneachnointerval, .b-onerunonasidenointerval { background: var(--panel);
  color: var(--muted); }
.b-loss, .b-losstoofewmeasurements { background: var(--bad-bg); color: var(--bad);
  font-weight: 400; }
.b-info { background: var(--panel); color: var(--muted); }
.host { border-left: 4px solid var(--line); padding: 2px 0 2px 12px; margin: 14px 0; }
.host.failed { border-left-color: var(--bad); }
.consequence { color: var(--muted); }
figure { margin: 12px 0 24px; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 6px; }
figcaption { color: var(--muted); font-size: 13px; margin-top: 4px; }
.failure { border-left: 4px solid var(--bad); padding: 2px 0 2px 12px; margin: 14px 0; }
.up { color: var(--good); font-weight: 600; }
.down { color: var(--bad); font-weight: 600; }
ul.findings { margin: 0; padding-left: 18px; }
ul.bound { margin: 0 0 12px; padding-left: 18px; color: var(--muted); font-size: 13px; }
details { margin: 6px 0; }
summary { cursor: pointer; font-weight: 600; }
nav { margin: 14px 0 0; font-size: 13px; }
nav a { margin-right: 14px; color: var(--accent); }
footer { margin-top: 40px; color: var(--muted); font-size: 12px; }
"""


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _badge(text: str | None) -> str:
    text = text or "-"
    cls = re.sub(r"[^a-z_]", "", text.lower()) or "none"
    return f'<span class="badge b-{cls}">{_e(text)}</span>'


def _id(*parts: Any) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9_-]+", "_", str(p)) for p in parts)


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], *,
           row_classes: Iterable[str] | None = None, numeric: set[int] | None = None) -> str:
    """A table from already-escaped cell HTML."""
    numeric = numeric or set()
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    classes = list(row_classes) if row_classes is not None else None
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td class="num">{c}</td>' if j in numeric else f"<td>{c}</td>"
                        for j, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return (f'<div class="wide"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def _when(epoch: float | None) -> str:
    if not epoch:
        return "-"
    return _dt.datetime.fromtimestamp(epoch, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _params_html(params: dict[str, Any]) -> str:
    return " ".join(f"<code>{_e(k)}={_e(show(v))}</code>" for k, v in params.items())


# -- sections ------------------------------------------------------------------------------------


def _header(report: StudyReport) -> str:
    counts: dict[str, int] = {}
    for t in report.trials:
        counts[t.status] = counts.get(t.status, 0) + 1
    count_text = ", ".join(f"{n} {s}" for s, n in counts.items()) or "no trials"
    slo = ", ".join(f"{k} ≤ {v:g}" for k, v in report.slo.items()) or "none"
    spec = report.spec
    levels = ", ".join(str(c) for c in spec.get("concurrency") or []) or "-"
    search = spec.get("capacity")
    if report.capacity:
        levels = ("searched (capacity under the SLOs"
                  + (f": {_compact(search)}" if isinstance(search, dict) and search else "")
                  + ")")
    return (
        f'<p class="meta"><b>engine</b> {_e(report.engine)} · <b>model</b> {_e(report.model)}'
        f" · <b>host</b> {_e(spec.get('host') or 'local')} · <b>strategy</b> "
        f"{_e(report.strategy)} · <b>objective</b> {_e(report.direction)} "
        f"<code>{_e(report.metric)}</code> · <b>SLOs</b> {_e(slo)} · <b>concurrency</b> "
        f"{_e(levels)} · <b>workload</b> <code>{_e(_compact(spec.get('workload')))}</code></p>"
        f'<p class="meta"><b>trials</b> {len(report.trials)} ({_e(count_text)}) · '
        f"<b>status</b> {_e(report.status)} · <b>started</b> {_e(_when(report.created_at))} · "
        f"<b>time spent</b> {_e(_duration(report.elapsed_s))}</p>"
        + _statistics_meta(report)
        + (f'<p class="meta"><b>fixed flags</b> {_params_html(spec.get("fixed") or {})}</p>'
           if spec.get("fixed") else "")
    )


def _statistics_meta(report: StudyReport) -> str:
    """The study's ``statistics:`` and what they cost, when it measured anything twice."""
    stats = report.statistics
    if not (report.replicated or stats.racing or stats.fixed_count() > 1):
        return ""
    return (f'<p class="meta" id="{_id("statistics", report.name)}"><b>statistics</b> '
            f"replicates {_e(stats.replicates)} · tie margin {stats.tie_margin * 100:g} % · "
            f"confidence {stats.confidence * 100:g} % · at most {stats.max_replicates} "
            f"measurements · <b>cost</b> "
            f"{_e(report.standing.cost_text().removeprefix('statistics: '))}</p>")


def _compact(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "" if value is None else str(value)


def _sim_banner(reports: list[StudyReport]) -> str:
    sim = [r.name for r in reports if r.simulated]
    if not sim:
        return ""
    which = ("this study is" if len(reports) == 1 else
             f"{'study' if len(sim) == 1 else 'studies'} {', '.join(sim)} "
             f"{'is' if len(sim) == 1 else 'are'}")
    return (f'<div class="banner" id="simulated"><b>Simulated engine.</b> The engine of '
            f"{_e(which)} cleanslate's simulated one (<code>engine: sim</code>): a test "
            "double with a performance model, no GPU and no real model. Its numbers show how "
            "the tool works, not how any hardware performs.</div>")


def _best_section(report: StudyReport) -> str:
    best = report.best
    if best is None:
        return ('<div class="none" id="no-best"><b>No feasible configuration.</b> Every trial '
                "failed or missed the SLOs; see the failures below.</div>")
    figures = [(h, metric_text(report, best, k)) for k, h, _ in LEVEL_COLUMNS]
    figure_text = " · ".join(f"<b>{_e(h)}</b> {_e(v)}" for h, v in figures)
    runs = best.interval(report.confidence)
    if runs is not None and runs.n > 1:
        figure_text = f"mean of {runs_text(runs.n)}: {figure_text}"
    lines = best_lines(report)
    standing = report.standing

    def linked(numbers: tuple[int, ...]) -> str:
        out = []
        for n in numbers:
            comp = standing.comparisons.get(n)
            t = report.trial(n)
            what = _e(report.short_params(t)) if t is not None else ""
            out.append(f'<a href="#{_id("trial", report.name, n)}">#{n}</a> {what}'
                       + (f" ({_e(comp.text())})" if comp is not None else ""))
        return "; ".join(out)

    ties = (f'<p class="tied-with"><span class="badge b-tie">tie</span> with the best: '
            f"{linked(standing.tied)}</p>" if standing.tied else "")
    undecided = (f'<p class="undecided-with"><span class="badge b-undecided">undecided</span> '
                 f"against the best: {linked(standing.undecided)}</p>"
                 if standing.undecided else "")
    cost = "".join(f'<p class="meta">{_e(line)}</p>' for line in lines[1:]
                   if line.startswith(("statistics:", "host effects", "capacity")))
    return (
        f'<div class="best" id="{_id("best", report.name)}">'
        f"<p><b>Best configuration: trial #{best.number}</b> ({_e(lines[0])})</p>"
        f'<p class="best-params">{_params_html(best.record.params)}</p>'
        f"<p>{figure_text}</p>"
        + "".join(f'<p class="bound-best">{_e(line)}</p>'
                  for line in trial_bound_lines(best.record))
        + f"{ties}{undecided}{cost}"
        "<p><b>Launch command</b></p>"
        f'<pre class="launch">{_e(best.launch_command or "(not recorded)")}</pre></div>'
    )


def _trials_table(report: StudyReport) -> str:
    factors = report.factors
    marks = report.replicated or bool(report.standing.tied or report.standing.undecided)
    extra = ["vs best", f"{report.metric} ({report.confidence * 100:g} %)"] if marks else []
    if report.capacity:
        extra += list(CAPACITY_HEADERS)
    headers = ["#", *factors, "status", "cause", *extra, "best level", "bound by",
               *(h for _, h, _ in LEVEL_COLUMNS), "host before", "host after"]
    rows = []
    classes = []
    best = report.best
    first_metric = 4 + len(factors) + len(extra)
    for t in report.sorted_trials():
        r = t.record
        mark = report.mark(t)
        cells = ([_badge(mark) if mark else "", _e(value_text(report, t))] if marks else [])
        if report.capacity:
            bracket, probes, found = capacity_cells(t)
            cells += [(f'<a class="nowrap" href="#{_id("capacity", report.name, t.number)}">'
                       f"{_e(bracket)}</a>" if t.capacity is not None else _e(bracket)),
                      _e(probes), _e(found)]
        rows.append([
            f'<a href="#{_id("trial", report.name, t.number)}">#{t.number}</a>',
            *(_e(show(r.params.get(f)) if f in r.params else "") for f in factors),
            _badge("crashed") if t.crash_text is not None else _badge(r.status),
            _e(t.crash_text.removeprefix("crashed ") if t.crash_text is not None
               else r.cause or ""),
            *cells,
            _e(r.best_level or "-"),
            _e(bound_cell(r)),
            *(_e(metric_text(report, t, k)) for k, _, _ in LEVEL_COLUMNS),
            _badge(t.host_verdict("before")),
            _badge(t.host_verdict("after")),
        ])
        classes.append("best-row" if t is best else "tied-row" if mark == Outcome.TIE else "")
    numeric = set(range(first_metric + 1, first_metric + 1 + len(LEVEL_COLUMNS)))
    if marks:
        numeric.add(first_metric - 2 - (len(CAPACITY_HEADERS) if report.capacity else 0))
    note = (f" With several runs (measurements, each on a new server) a figure is their mean "
            f"± the half-width of its {report.confidence * 100:g} % Student-t interval; "
            f"<b>vs best</b>: <b>tie</b>, {_e(Outcome.TIE.meaning)}; <b>undecided</b>, "
            f"{_e(Outcome.UNDECIDED.meaning)}; <b>loss</b>, {_e(Outcome.LOSS.meaning)} (a "
            "race or the paired measurements against the best)." if marks else "")
    if report.capacity:
        note += (" <b>capacity</b>: the highest load that passed, with the bracket "
                 "<code>[capacity, upper)</code> the boundary lies in (the search's "
                 "tolerance, or wider where it stopped early); the figures are those of the "
                 "capacity probe.")
    return (f'<p class="meta">Sorted by the objective ({_e(report.direction)} '
            f"<code>{_e(report.metric)}</code>), best first; the figures are those of each "
            f"trial's best level that met the SLOs; <b>bound by</b>: the bottleneck verdict "
            "at that level and at the first level that missed an SLO or crashed "
            f"(<code>?</code>: likely, from the client's figures alone).{note}</p>"
            + _table(headers, rows, row_classes=classes, numeric=numeric))


def _ablation_table(report: StudyReport) -> str:
    effects = report.ablation_effects()
    base = report.baseline_trial()
    if report.strategy != "ablation":
        return ""
    if not effects or base is None:
        return "<p>No one-flag change against a finished baseline to show.</p>"
    rows = []
    for e in effects:
        if e.change_pct is None:
            change = (f'<span class="down">infeasible: {_e(e.cause)}</span>' if e.cause else
                      "no baseline value")
        elif e.in_noise:
            change = f'<span class="meta">{_e(e.effect_text)}</span>'
        else:
            change = (f'<span class="{"up" if e.better else "down"}">'
                      f"{_e(e.effect_text)}</span>")
        before, after = moved(e)
        bound = (f"{_e(before.cell if before else '-')} → {_e(after.cell if after else '-')}"
                 if before is not None or after is not None else "-")
        rows.append([f'<a href="#{_id("trial", report.name, e.trial.number)}">'
                     f"#{e.trial.number}</a>", f"<code>{_e(e.factor)}</code>",
                     _e(show(e.baseline_value)), _e(show(e.value)),
                     _e(value_text(report, e.trial)), change, bound])
    return (f"<p>Against the baseline, trial #{base.number} "
            f"({_e(report.metric)} = {_e(value_text(report, base))}). A change whose "
            "interval holds 0 is a <b>tie</b> (inside the tie margin) or <b>undecided</b> "
            f"(marked <b>{TOO_FEW}</b> when two measurements give an interval wider than the "
            "change). <b>bound by</b>: what bound the "
            "baseline and the change, at each one's best level.</p>"
            + _table(["trial", "flag", "baseline", "changed to", report.metric, "change",
                      "bound by (baseline → change)"], rows, numeric={4, 5}))


def _failures(report: StudyReport) -> str:
    failures = report.failures
    if not failures:
        return "<p>Every trial was feasible.</p>"
    out = []
    for t in failures:
        r = t.record
        tail = t.log_tail
        excerpt = t.log_excerpt
        # a crash is said first, with its level, whatever the status (text, escaped)
        head = (f'{_badge("crashed")} {_e(t.crash_text.removeprefix("crashed "))}'
                if t.crash_text is not None
                else f"{_badge(r.status)} {_e(r.cause or '')}")
        out.append(
            f'<div class="failure"><h3>Trial #{t.number} {head}</h3>'
            f"<p>{_params_html(r.params)}</p>"
            + (f"<p>{_e(r.detail)}</p>" if r.detail else "")
            + (f'<pre class="log">{_e(excerpt)}</pre>' if excerpt else "")
            + (f'<details><summary>whole log tail</summary><pre class="log">{_e(tail)}</pre>'
               "</details>" if tail else "<p class=\"meta\">no log tail recorded</p>")
            + "</div>")
    return "".join(out)


def _findings_html(findings: list[Finding]) -> str:
    if not findings:
        return ""
    items = "".join(f"<li>{_badge(f.severity)} {_e(f.kind)}: {_e(f.message)}</li>"
                    for f in findings)
    return f'<ul class="findings">{items}</ul>'


def _hosts(report: StudyReport) -> str:
    rows = []
    for t in sorted(report.trials, key=lambda t: t.number):
        rows.append([
            f'<a href="#{_id("trial", report.name, t.number)}">#{t.number}</a>',
            _e(t.record.host or (t.run.host if t.run else "") or "-"),
            f"<code>{_e(t.record.run_id or '-')}</code>",
            _badge(t.host_verdict("before")) + _findings_html(t.host_findings("before")),
            _badge(t.host_verdict("after")) + _findings_html(t.host_findings("after")),
        ])
    return ("<p class=\"meta\">The host check before each launch and after each teardown "
            "(errors and unknowns make a host dirty or unknown; warnings are listed but do "
            "not).</p>"
            + _table(["trial", "host", "run", "before", "after"], rows))


def _yes(value: bool | None) -> str:
    return "?" if value is None else ("on" if value else "off")


def _bytes(count: int | None) -> str:
    if count is None:
        return "?"
    return f"{count / 2**30:,.1f} GiB" if count >= 2**30 else f"{count / 2**20:,.0f} MiB"


def _gpu_cells(gpu: GpuRow) -> list[str]:
    narrow = (gpu.pcie_width is not None and gpu.pcie_width_max is not None
              and gpu.pcie_width < gpu.pcie_width_max)
    pcie = _e(gpu.pcie_text())
    ecc = _yes(gpu.ecc)
    if gpu.ecc_uncorrected_volatile:
        ecc += f", {gpu.ecc_uncorrected_volatile} uncorrected"
    memory = ", ".join(gpu.memory_problems)
    power = "?" if gpu.power_limit_w is None else f"{gpu.power_limit_w:g} W"
    if gpu.power_default_w is not None:
        power += f" of {gpu.power_default_w:g} W"
    events = "?" if gpu.clock_events is None else (", ".join(gpu.clock_events) or "none")
    return [str(gpu.index), _e(gpu.name or "?"), f"<code>{_e(gpu.uuid or '?')}</code>",
            f"<code>{_e(gpu.pci_bus_id or '?')}</code>",
            f'<span class="down">{pcie}</span>' if narrow else pcie,
            _e(_yes(gpu.persistence)), _e(_yes(gpu.mig)),
            _e(ecc) + (f' <span class="down">{_e(memory)}</span>' if memory else ""),
            _e(events), _e(power)]


def _snapshot_html(snap: HostSnapshot) -> str:
    """One host's snapshot: its header line, GPUs, pairs and findings (every text escaped)."""
    if snap.error is not None:
        return (f'<p class="down">The doctor snapshot failed after {snap.elapsed_s:.1f} s: '
                f"{_e(snap.error)}</p>")
    where = " in ".join(w for w in (snap.container, snap.virtualization) if w)
    parts = [
        f'<p class="meta"><b>driver</b> {_e(snap.driver or "none")} · <b>CUDA</b> '
        f"{_e(snap.cuda or '-')} · <b>GPUs</b> {_e(snap.gpu_summary())} · <b>runs in</b> "
        f"{_e(where or 'no VM or container seen')} · <b>kernel</b> "
        f"<code>{_e(snap.kernel or '?')}</code> · <b>/dev/shm</b> {_e(_bytes(snap.shm_bytes))}"
        f" · <b>taken</b> {_e(_when(snap.taken_at))} in {snap.elapsed_s:.2f} s</p>"]
    if snap.gpus:
        parts.append(_table(["GPU", "name", "UUID", "PCI bus", "PCIe (current of max)",
                             "persistence", "MIG", "ECC", "clock events", "power limit"],
                            [_gpu_cells(g) for g in snap.gpus], numeric={0}))
    if snap.pairs:
        parts.append(_table(["pair", "link", "P2P read", "P2P write"],
                            [[_e(f"{p.a}-{p.b}"), _e(p.link or "?"), _badge(p.p2p_read or "?"),
                              _badge(p.p2p_write or "?")] for p in snap.pairs]))
    if snap.findings:
        items = []
        for f in snap.findings:
            evidence = "".join(f"<br><code>{_e(line)}</code>" for line in f.evidence)
            gpus = f" (GPU {_e(', '.join(map(str, f.gpus)))})" if f.gpus else ""
            items.append(f"<li>{_badge(f.severity)} <b>{_e(f.message)}</b>{gpus}"
                         f'<br><span class="consequence">{_e(f.consequence)}</span>'
                         f"{evidence}</li>")
        parts.append(f'<ul class="findings">{"".join(items)}</ul>')
    else:
        parts.append("<p>No findings.</p>")
    if snap.truncated:
        parts.append(f'<p class="meta">cut to the snapshot\'s bounds: '
                     f"{_e(', '.join(snap.truncated))}</p>")
    return "".join(parts)


def _hosts_section(report: StudyReport) -> str:
    """The doctor snapshot of each host the study ran on."""
    if not report.hosts:
        return ('<p class="meta">No doctor snapshot is recorded for this study (it ran before '
                "cleanslate recorded them).</p>")
    out = ['<p class="meta">What <code>cleanslate doctor</code> found on each host before its '
           "first trial (quick mode: no bandwidth measured).</p>"]
    for i, record in enumerate(report.hosts):
        failed = " failed" if record.snapshot.error is not None else ""
        out.append(f'<div class="host{failed}" id="{_id("host", report.name, i)}">'
                   f"<h3>{_e(record.label)}</h3>{_snapshot_html(record.snapshot)}</div>")
    return "".join(out)


def _levels_detail(report: StudyReport, t: TrialView) -> str:
    r = t.record
    keys = [("output_throughput", "output tok/s"), ("total_token_throughput", "total tok/s"),
            ("request_throughput", "req/s"), ("p50_ttft_ms", "TTFT p50"),
            ("p99_ttft_ms", "TTFT p99"), ("median_tpot_ms", "TPOT p50"),
            ("p99_tpot_ms", "TPOT p99"), ("mean_itl_ms", "ITL mean"),
            ("completed", "done"), ("failed", "failed")]
    rows = []
    for level in r.levels:
        conc = level_concurrency(level)
        rows.append([_e(level.label), _e(f"{conc:g}" if conc else "-"),
                     _badge(t.level_verdict(level)),
                     *(_e(format_value(level_metric(level, k), k)) for k, _ in keys),
                     _e(bound_by(level.bottleneck))])
    levels = (_table(["level", "load", "verdict", *(h for _, h in keys), "bound by"], rows,
                     numeric=set(range(3, 3 + len(keys))))
              if rows else '<p class="meta">no level was measured</p>')
    if rows and len(r.counted()) > 1:  # beside a mean, these are one run's: said so
        levels = (f'<p class="meta">levels of its first run (the trials table shows the mean of '
                  f"{runs_text(len(r.counted()))})</p>" + levels)
    said = bench_bound_lines(r.levels)
    if said:
        levels += ('<ul class="bound">' + "".join(f"<li>{_e(line)}</li>" for line in said)
                   + "</ul>")
    levels += _replicates_html(report, t)
    phases = " · ".join(f"{_e(k.removesuffix('_s'))} {v:.1f} s" for k, v in r.phases.items())
    status = _badge(r.status) + (f" {_e(t.cause_text)}" if t.cause_text else "")
    return (
        f'<details id="{_id("trial", report.name, t.number)}" class="trial"'
        f"{' open' if t is report.best else ''}>"
        f"<summary>Trial #{t.number}: {_e(report.short_params(t))}</summary>"
        f"<p>{status}</p><p>{_params_html(r.params)}</p>{levels}"
        + (f'<p class="meta">phases: {phases}</p>' if phases else "")
        + (f'<p class="meta">launch command</p><pre>{_e(t.launch_command)}</pre>'
           if t.launch_command else "")
        + "</details>")


def _replicates_html(report: StudyReport, t: TrialView) -> str:
    """A trial's measurements (seed, slot, race pair, value, why one does not count) and the
    races it ran, when it was measured more than once."""
    r = t.record
    out = ""
    if len(r.replicates) > 1:
        searched = any(rep.capacity is not None for rep in r.replicates)
        rows = [[str(rep.index), str(rep.seed), _e(rep.slot or rep.host or "-"),
                 _e("-" if rep.pair is None else rep.pair),
                 _e("-" if rep.against is None else f"#{rep.against}"), _badge(rep.status),
                 _e(format_value(rep.value, report.metric)), _e(rep.best_level or "-"),
                 *([_e(f"{bracket_text(rep.capacity)}, {len(rep.capacity.probes)} probes")
                    if rep.capacity is not None else "-"] if searched else []),
                 _e(rep.discarded or ""), _e(f"{rep.gpu_s:,.0f}")] for rep in r.replicates]
        out += ('<p class="meta">measurements (each a new server; the members of a race pair '
                "share their seed)</p>"
                + _table(["#", "seed", "slot", "pair", "against", "status", report.metric,
                          "best level", *(["capacity [bracket)"] if searched else []),
                          "discarded", "GPU-s"], rows,
                         numeric={0, 1, 6, 10 if searched else 9}))
    if r.races:
        rows = [[f'<a href="#{_id("trial", report.name, race.against)}">#{race.against}</a>',
                 _badge(race.outcome), _e(f"{race.diff * 100:+.1f} %"),
                 _e(f"[{race.low * 100:+.1f}, {race.high * 100:+.1f}] %"
                    if race.low is not None and race.high is not None else "none"),
                 str(race.pairs), _e(race.slot or "-")] for race in r.races]
        out += ('<p class="meta">races run as a challenger</p>'
                + _table(["against", "outcome", "difference", "interval", "pairs", "slot"],
                         rows, numeric={2, 4}))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f} %"


def _probes_table(t: TrialView) -> str:
    """A capacity trial's probes in the order measured: load, verdict, attainment (the worst
    check's share) with its Wilson interval against its target, requests, measurements (1 and
    the extensions), output tokens/s, and why it did not pass."""
    result = t.capacity
    assert result is not None
    rows = []
    for p in result.probes:
        interval = (f"[{p.attainment_low * 100:.1f}, {p.attainment_high * 100:.1f}] %"
                    if p.attainment_low is not None and p.attainment_high is not None else "-")
        why = ": ".join(x for x in (p.cause, p.detail) if x)
        if p.warnings:
            why += (" · " if why else "") + "; ".join(p.warnings)
        rows.append([str(p.index + 1), _e(p.label), _badge(p.verdict.value),
                     _e(_pct(p.attainment)), _e(interval), _e(_pct(p.target)),
                     f"{p.requests:,}", str(p.measurements),
                     _e(format_value(p.output_throughput, "output_throughput")), _e(why)])
    return _table(["probe", "load", "verdict", "attainment", "interval", "target",
                   "requests", "measurements", "output tok/s", "why not passed"], rows,
                  numeric={0, 3, 4, 5, 6, 7, 8})


def _capacity_section(report: StudyReport, plots: list[Plot], multi: bool) -> str:
    """Per trial with a capacity search (best first): the answer, the probes and the plot of
    the probe sequence."""
    by_name = {p.name: p for p in plots}
    slo = report.capacity_trials[0].capacity if report.capacity_trials else None
    out = []
    if slo is not None:
        targets = ", ".join(f"{k} ≤ {v:g} ms" for k, v in slo.slo.limits.items())
        aim = (f"at least {slo.slo.attainment * 100:g} % of requests meeting every limit"
               if slo.slo.attainment is not None else "each percentile's share of samples "
               "within its limit")
        out.append(f'<p class="meta">Each trial searched the most load it serves within the '
                   f"SLOs ({_e(targets)}; {_e(aim)}): doubling from "
                   f"{_e(slo.label(slo.start))}, then bisecting to a tolerance of "
                   f"{slo.tolerance * 100:g} %. A probe passes when the low end of every "
                   f"check's {slo.slo.confidence * 100:g} % Wilson interval is at or above its "
                   "target, fails when one interval lies below it; a probe whose interval "
                   "holds the target is measured again and, still straddling, is "
                   "<b>unresolved</b>, never counted as passing.</p>")
    else:
        out.append('<p class="meta">No trial has a capacity search recorded.</p>')
    for rank, t in enumerate(report.capacity_trials):
        result = t.capacity
        assert result is not None
        lines = [f"<p><b>{_e(bracket_text(result))}</b> · {_e(probes_phrase(result))}"
                 + (f' · <span class="down">{_e(crash_text(result, detail=True))}</span>'
                    if result.crash else "") + "</p>",
                 f'<p class="meta">{_e(result.summary())}</p>']
        if result.cliffs:
            lines.append("".join(f'<p class="down">{_e(c)}</p>' for c in result.cliffs))
        plot = by_name.get(capacity_plot_name(report.name, t.number, multi))
        figure = _plots_html([plot]) if plot is not None else (
            f'<p class="meta">(no plot: at most {MAX_CAPACITY_PLOTS} trials of a study are '
            "drawn, the best first)</p>" if rank >= MAX_CAPACITY_PLOTS else "")
        out.append(f'<div class="capacity" id="{_id("capacity", report.name, t.number)}">'
                   f'<h3><a href="#{_id("trial", report.name, t.number)}">Trial '
                   f"#{t.number}</a>: {_e(report.short_params(t))}</h3>{''.join(lines)}"
                   f"{_probes_table(t)}{figure}</div>")
    return "".join(out)


def _plots_html(plots: list[Plot]) -> str:
    out = []
    for plot in plots:
        data = base64.b64encode(plot.png).decode("ascii")
        out.append(f'<figure id="{_id("plot", plot.name)}"><img alt="{_e(plot.title)}" '
                   f'src="data:image/png;base64,{data}"><figcaption><b>{_e(plot.title)}.</b> '
                   f"{_e(plot.caption)}</figcaption></figure>")
    return "".join(out)


def _comparison(reports: list[StudyReport]) -> str:
    """The studies side by side: one column per study."""
    bests = [r.best for r in reports]
    rows: list[list[str]] = [
        ["engine", *(_e(r.engine + (" (simulated)" if r.simulated else "")) for r in reports)],
        ["model", *(_e(r.model) for r in reports)],
        ["strategy", *(_e(r.strategy) for r in reports)],
        ["objective", *(_e(f"{r.direction} {r.metric}") for r in reports)],
        ["trials", *(_e(f"{len(r.results)} results, "
                        f"{sum(1 for t in r.trials if t.feasible)} feasible") for r in reports)],
        ["best trial", *(_e(f"#{b.number}") if b else "none" for b in bests)],
        ["best configuration", *(_params_html(b.record.params) if b else "-" for b in bests)],
        ["best level", *(_e(b.record.best_level) if b else "-" for b in bests)],
    ]
    rows.append(["best value", *(_e(value_text(r, b)) if b else "-"
                                 for r, b in zip(reports, bests, strict=True))])
    rows.append(["tied with best", *(_e(", ".join(f"#{n}" for n in r.standing.tied) or "-")
                                     for r in reports)])
    if any(r.capacity for r in reports):
        rows.append(["best's capacity [bracket)", *(_e(best_capacity_text(b)) for b in bests)])
    for key, header, _ in LEVEL_COLUMNS:
        rows.append([header, *(_e(metric_text(r, b, key)) if b else "-"
                               for r, b in zip(reports, bests, strict=True))])
    rows.append(["launch command", *(f"<code>{_e(b.launch_command)}</code>" if b else "-"
                                     for b in bests)])
    return (_table(["", *(r.name for r in reports)],
                   [[f"<b>{_e(row[0])}</b>", *row[1:]] for row in rows])
            + "".join(_differences(reports[0], b) for b in reports[1:]))


def _differences(a: StudyReport, b: StudyReport) -> str:
    """The configurations both studies ran, ``b`` against ``a`` with the interval and
    verdict."""
    title = f'<h3 id="{_id("differences", b.name)}">{_e(b.name)} against {_e(a.name)}</h3>'
    why = comparable(a, b)
    if why is not None:
        return f"{title}<p>{_e(why)}</p>"
    shared = shared_configs(a, b)
    if not shared:
        return f"{title}<p>No configuration ran in both studies.</p>"
    rows = []
    for c in shared:
        d = c.difference
        rows.append([
            _e(params_text(c.params)),
            f"#{c.a.number} {_e(value_text(a, c.a))}", f"#{c.b.number} {_e(value_text(b, c.b))}",
            _e(f"{d.diff * 100:+.1f} %" if d.diff is not None else "-"),
            _e(f"[{d.low * 100:+.1f}, {d.high * 100:+.1f}] %"
               if d.low is not None and d.high is not None else "none"),
            _badge(d.verdict_text),
            _e({"paired": f"paired by seed, {d.pairs} pairs",
                "welch": f"unpaired (Welch), n={d.n_a} and {d.n_b}"}.get(d.method, ""))])
    return (title + f'<p class="meta">Each configuration both ran, {_e(b.name)} against '
            f"{_e(a.name)} ({_e(a.direction)} <code>{_e(a.metric)}</code>, "
            f"{a.confidence * 100:g} % intervals). A difference whose interval holds 0 is a "
            "<b>tie</b> (inside the tie margin) or <b>undecided</b>, never a <b>win</b>; "
            f"<b>{TOO_FEW}</b>: two measurements whose interval is wider than the difference."
            "</p>"
            + _table(["configuration", a.name, b.name, "difference", "interval", "verdict",
                      "test"], rows, numeric={3}))


def _study_sections(report: StudyReport, multi: bool, plots_html: str = "",
                    plots: list[Plot] | None = None) -> str:
    """A study's sections; ``plots_html`` (the plots section) goes after its trials table, the
    capacity searches (with their plots from ``plots``) after it."""

    def title(text: str) -> str:
        suffix = f": {_e(report.name)}" if multi else ""
        return f'<h2 id="{_id(text, report.name)}">{_e(text)}{suffix}</h2>'

    parts = [
        (f'<h2 id="{_id("study", report.name)}">Study {_e(report.name)}</h2>'
         + _header(report) if multi else ""),
        title("Best configuration"), _best_section(report),
        title("Trials"), _trials_table(report),
        plots_html,
    ]
    if report.capacity:
        parts += [title("Capacity"), _capacity_section(report, plots or [], multi)]
    if report.strategy == "ablation":
        parts += [title("Ablation"), _ablation_table(report)]
    if report.strategy == "guided":
        parts += [title("Guided path"), guided_timeline(report)]
    parts += [
        title("Failures"), _failures(report),
        title("Hosts"), _hosts_section(report),
        title("Host verdicts"), _hosts(report),
        title("Trial details"),
        "".join(_levels_detail(report, t) for t in sorted(report.trials,
                                                           key=lambda t: t.number)),
    ]
    return "".join(parts)


# --- a bench run (report --bench) -----------------------------------------------------------------

def _fmt_or_dash(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render_bench_html(report: BenchReport, *, plots: list[Plot] | None = None,
                      generated_at: float | None = None) -> str:
    """One self-contained page for a bench run: its levels with the observers' summaries,
    what they could not read, and a panel per measured level (the same page rules as a
    study's: inline CSS and PNGs, every text escaped)."""
    from cleanslate.bench import observation_notes, observed_cells

    plots = level_plots(report) if plots is None else plots
    # The throughput-latency figure (report._bench_compare) has its own heading.
    figure = [p for p in plots if p.name == "throughput-latency"]
    plots = [p for p in plots if p.name != "throughput-latency"]
    r = report.result
    now = generated_at if generated_at is not None else _dt.datetime.now(_dt.UTC).timestamp()
    headers = ["level", "ok", "err", "out tok/s", "TTFT ms p50/p99", "TPOT ms p50/p99",
               "running mean/max", "waiting mean/max", "KV % mean/max", "GPU % / W",
               "bound by"]
    rows = [[_e(lv.label), str(lv.completed), str(lv.failed),
             f"{lv.output_throughput:,.0f}",
             f"{_fmt_or_dash(lv.ttft_ms.median, '.1f')}/{_fmt_or_dash(lv.ttft_ms.p99, '.1f')}",
             f"{_fmt_or_dash(lv.tpot_ms.median, '.1f')}/{_fmt_or_dash(lv.tpot_ms.p99, '.1f')}",
             *(_e(c) for c in observed_cells(lv)), _e(bound_by(lv.bottleneck))]
            for lv in r.levels]
    cap = report.cap
    notes = observation_notes(r)
    if report.samples_note:
        notes.append(report.samples_note)
    notes += [f"{f.label} ({f.key}): {f.problem}" for f in report.files if f.problem]
    shown = len(plots)
    measured = len(report.timelines())
    if measured > shown:
        notes.append(f"{measured - shown} more measured levels not drawn (at most "
                     f"{MAX_PANELS} panels)")
    meta = (f'<p class="meta"><b>{_e(r.model)}</b> at <code>{_e(safe_url(r.url))}</code> '
            f"({_e(r.endpoint)}), {_e(r.started_at)} to {_e(r.finished_at)}, cleanslate "
            f"{_e(r.version)}; running cap in effect: "
            + (f"<b>{cap[0]:g}</b> ({_e(cap[1])})" if cap else "not recorded") + "</p>")
    body = (f"<h1>cleanslate bench report: {_e(report.name)}</h1>{meta}"
            f"<h2>Levels</h2>"
            + _table(headers, rows, numeric=set(range(1, len(headers) - 1)))
            + ('<ul class="bound">' + "".join(f"<li>{_e(line)}</li>"
                                             for line in bench_bound_lines(r.levels))
               + "</ul>" if any(lv.bottleneck for lv in r.levels) else "")
            + "".join(f'<p class="meta">{_e(n)}</p>' for n in notes)
            + (f"<h2>Latency against throughput</h2>{_plots_html(figure)}" if figure else "")
            + "<h2>Over each level</h2>" + (_plots_html(plots) or
                                            '<p class="meta">no panels: no samples</p>'))
    footer = (f"<footer>Generated by cleanslate {_e(__version__)} on {_e(_when(now))}. "
              "Reproduce: <code>cleanslate report "
              + (_e(report.bench_id) if report.bench_id else f"--bench {_e(report.path.name)}")
              + " --html FILE</code></footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,">'
            f"<title>cleanslate bench report: {_e(report.name)}</title>"
            f"<style>{_CSS}</style></head><body>{body}{footer}</body></html>\n")


def render_html(reports: list[StudyReport], *, plots: list[Plot] | None = None,
                generated_at: float | None = None) -> str:
    """The page for one study, or for several side by side (the first is the main one).

    ``plots`` defaults to :func:`render_plots` of the studies.
    """
    if not reports:
        raise ValueError("render_html needs at least one study")
    plots = render_plots(reports) if plots is None else plots
    multi = len(reports) > 1
    names = " vs ".join(r.name for r in reports)
    now = generated_at if generated_at is not None else _dt.datetime.now(_dt.UTC).timestamp()
    nav = ['<a href="#plots">Plots</a>']
    if multi:
        nav.insert(0, '<a href="#comparison">Comparison</a>')
        nav += [f'<a href="#{_id("study", r.name)}">{_e(r.name)}</a>' for r in reports]
    else:
        r = reports[0]
        nav = [f'<a href="#{_id(s, r.name)}">{s}</a>' for s in
               ("Best configuration", "Trials")] + nav
        if r.capacity:
            nav.append(f'<a href="#{_id("Capacity", r.name)}">Capacity</a>')
        if r.strategy == "ablation":
            nav.append(f'<a href="#{_id("Ablation", r.name)}">Ablation</a>')
        nav += [f'<a href="#{_id(s, r.name)}">{s}</a>' for s in
                ("Failures", "Hosts", "Host verdicts", "Trial details")]
    head = (f"<h1>cleanslate study report: {_e(names)}</h1>"
            + ("" if multi else _header(reports[0]))
            + _sim_banner(reports) + f"<nav>{''.join(nav)}</nav>")
    shared = [p for p in plots if not p.name.startswith("capacity-")]
    if multi:
        body = (f'<h2 id="comparison">Comparison</h2>{_comparison(reports)}'
                f'<h2 id="plots">Plots</h2>{_plots_html(shared)}'
                + "".join(_study_sections(r, True, plots=plots) for r in reports))
    else:
        body = _study_sections(reports[0], False,
                               f'<h2 id="plots">Plots</h2>{_plots_html(shared)}', plots)
    stores = ", ".join(sorted({r.store_url for r in reports}))
    footer = (f"<footer>Generated by cleanslate {_e(__version__)} on {_e(_when(now))} from "
              f"<code>{_e(stores)}</code>. Reproduce: <code>cleanslate report "
              f"{_e(reports[0].name)}"
              + "".join(f" --compare {_e(r.name)}" for r in reports[1:])
              + f" --store {_e(stores.split(', ')[0])} --html FILE</code></footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            '<link rel="icon" href="data:,">'
            f"<title>cleanslate report: {_e(names)}</title><style>{_CSS}</style></head>"
            f"<body>{head}{body}{footer}</body></html>\n")
