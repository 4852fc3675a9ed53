"""Reports of studies: rich tables, PNG plots, one self-contained HTML page, CSV/JSON exports.

Everything is drawn from a :class:`StudyReport` that :func:`load_report` reads from the store
(``cs_studies``, ``cs_trials``, ``cs_runs``, ``cs_leases``, ``cs_slots``, ``cs_hosts``).
A single benchmark run (``report --bench``) is a :class:`BenchReport` that
:func:`load_bench_report` reads from a ``bench --json`` file and the observers' samples beside
it, or :func:`stored_bench_report` from a bench the store recorded (``report BENCH_ID``);
several side by side are drawn by ``_bench_compare``. matplotlib is imported only by the
plotting functions.
"""

from __future__ import annotations

from cleanslate.report._bench import (
    BenchReport,
    Timeline,
    bench_json,
    load_bench_report,
    observed_fields,
    running_cap,
    stored_bench_report,
)
from cleanslate.report._bench_compare import (
    benches_csv,
    benches_json,
    benches_table,
    render_benches_html,
    throughput_latency_plot,
)
from cleanslate.report._bounds import (
    Bound,
    bound_cell,
    moved_text,
    trial_bound_lines,
    trial_bounds,
)
from cleanslate.report._capacity import bracket_text, capacity_document, findings_text
from cleanslate.report._console import (
    ablation_lines,
    comparison_table,
    differences_table,
    hosts_table,
    print_differences,
    print_report,
    print_table,
    slots_table,
    trials_table,
)
from cleanslate.report._data import (
    LEVEL_COLUMNS,
    Effect,
    SharedConfig,
    SlotSummary,
    StudyReport,
    TrialView,
    load_report,
    pareto,
    safe_url,
    shared_configs,
)
from cleanslate.report._export import bench_csv, study_document, to_csv, to_json
from cleanslate.report._html import render_bench_html, render_html
from cleanslate.report._plots import (
    HEIGHT,
    WIDTH,
    Plot,
    level_figure,
    level_plots,
    render_plots,
    study_level_plots,
    write_pngs,
)
from cleanslate.report._stats import Difference, Standing, difference, standing, welch

__all__ = [
    "HEIGHT",
    "LEVEL_COLUMNS",
    "WIDTH",
    "BenchReport",
    "Bound",
    "Difference",
    "Effect",
    "Plot",
    "SharedConfig",
    "SlotSummary",
    "Standing",
    "StudyReport",
    "Timeline",
    "TrialView",
    "ablation_lines",
    "bench_csv",
    "bench_json",
    "benches_csv",
    "benches_json",
    "benches_table",
    "bound_cell",
    "bracket_text",
    "capacity_document",
    "comparison_table",
    "difference",
    "differences_table",
    "findings_text",
    "hosts_table",
    "level_figure",
    "level_plots",
    "load_bench_report",
    "load_report",
    "moved_text",
    "observed_fields",
    "pareto",
    "print_differences",
    "print_report",
    "print_table",
    "render_bench_html",
    "render_benches_html",
    "render_html",
    "render_plots",
    "running_cap",
    "safe_url",
    "shared_configs",
    "slots_table",
    "standing",
    "stored_bench_report",
    "study_document",
    "study_level_plots",
    "throughput_latency_plot",
    "to_csv",
    "to_json",
    "trial_bound_lines",
    "trial_bounds",
    "trials_table",
    "welch",
    "write_pngs",
]
