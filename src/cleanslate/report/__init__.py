"""Reports of studies: rich tables, PNG plots, one self-contained HTML page, CSV/JSON exports.

Everything is drawn from a :class:`StudyReport` that :func:`load_report` reads from the store
(``cs_studies``, ``cs_trials``, ``cs_runs``, ``cs_leases``, ``cs_slots``, ``cs_hosts``).
matplotlib is imported only by the plotting functions.
"""

from __future__ import annotations

from cleanslate.report._capacity import bracket_text, capacity_document, findings_text
from cleanslate.report._console import (
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
from cleanslate.report._export import study_document, to_csv, to_json
from cleanslate.report._html import render_html
from cleanslate.report._plots import HEIGHT, WIDTH, Plot, render_plots, write_pngs
from cleanslate.report._stats import Difference, Standing, difference, standing, welch

__all__ = [
    "HEIGHT",
    "LEVEL_COLUMNS",
    "WIDTH",
    "Difference",
    "Effect",
    "Plot",
    "SharedConfig",
    "SlotSummary",
    "Standing",
    "StudyReport",
    "TrialView",
    "bracket_text",
    "capacity_document",
    "comparison_table",
    "difference",
    "differences_table",
    "findings_text",
    "hosts_table",
    "load_report",
    "pareto",
    "print_differences",
    "print_report",
    "print_table",
    "render_html",
    "render_plots",
    "safe_url",
    "shared_configs",
    "slots_table",
    "standing",
    "study_document",
    "to_csv",
    "to_json",
    "trials_table",
    "welch",
    "write_pngs",
]
