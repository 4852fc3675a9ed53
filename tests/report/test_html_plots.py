"""The HTML page and the PNG plots, rendered from recorded studies (no browser needed)."""

from __future__ import annotations

import base64
import html
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cleanslate.report import StudyReport, load_report, render_html, write_pngs
from cleanslate.store import Store
from tests.report._browser import assert_real_plot
from tests.report.conftest import StudyStore


class Links(HTMLParser):
    """Every URL the page would load or link to, and the tags it uses."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "action", "poster", "data") and value:
                self.urls.append((tag, name, value))
            if name == "id" and value:
                self.ids.add(value)
            if name == "style" and value and "url(" in value:
                self.urls.append((tag, name, value))


@pytest.fixture(scope="module")
def reports(recorded_store: StudyStore) -> dict[str, StudyReport]:
    store = Store(recorded_store.url)
    return {name: load_report(store, name) for name in recorded_store.studies}


@pytest.fixture(scope="module")
def page(reports: dict[str, StudyReport]) -> str:
    return render_html([reports["quickstart"]])


def test_page_is_self_contained(page: str) -> None:
    parser = Links()
    parser.feed(page)
    assert "script" not in parser.tags
    assert "iframe" not in parser.tags
    for tag, attr, url in parser.urls:
        assert url.startswith(("data:", "#")), f"<{tag} {attr}> loads {url[:80]}"
    assert "@import" not in page and "url(" not in page.split("<body>")[0]
    images = [u for t, _, u in parser.urls if t == "img"]
    assert len(images) == 3  # throughput, Pareto, ablation
    for url in images:
        assert url.startswith("data:image/png;base64,")
        assert_real_plot(base64.b64decode(url.split(",", 1)[1]))


def test_page_shows_every_trial_the_best_and_the_failures(
        page: str, reports: dict[str, StudyReport]) -> None:
    report = reports["quickstart"]
    parser = Links()
    parser.feed(page)
    for trial in report.trials:
        assert f"trial-quickstart-{trial.number}" in parser.ids
        assert f"Trial #{trial.number}" in page
    best = report.best
    assert best is not None
    assert f"Best configuration: trial #{best.number}" in page
    assert html.escape(best.launch_command) in page
    oom = next(t for t in report.trials if t.record.cause == "oom")
    assert html.escape(oom.log_tail) in page  # the log tail, escaped
    assert "Simulated engine." in page
    assert "Host verdicts" in page and page.count("b-clean") >= 2 * len(report.trials)
    assert "Ablation" in page and "infeasible: oom" in page


def test_store_text_is_escaped(reports: dict[str, StudyReport]) -> None:
    report = reports["report-tiny"]
    evil = "<script>alert('x')</script> & <img src=http://example.com/x.png>"
    trials = tuple(
        replace(t, record=t.record.model_copy(update={"detail": evil, "log_tail": evil}),
                run=None) if t.record.cause else t
        for t in report.trials)
    page = render_html([replace(report, trials=trials)])
    assert evil not in page
    assert html.escape(evil) in page
    parser = Links()
    parser.feed(page)
    assert "script" not in parser.tags
    assert all(u.startswith(("data:", "#")) for _, _, u in parser.urls)


def test_compare_page_has_both_studies(reports: dict[str, StudyReport]) -> None:
    page = render_html([reports["quickstart"], reports["report-tiny"]])
    assert 'id="comparison"' in page
    assert "cleanslate study report: quickstart vs report-tiny" in page
    for report in reports.values():
        for trial in report.trials:
            assert f'id="trial-{report.name}-{trial.number}"' in page
    # Overlaid throughput and Pareto plots, and one ablation plot per ablation study.
    assert page.count("data:image/png;base64,") == 4


def test_pngs_have_the_expected_size_and_are_not_uniform(
        reports: dict[str, StudyReport], tmp_path: Path) -> None:
    paths = write_pngs([reports["quickstart"]], tmp_path)
    assert sorted(p.name for p in paths) == ["ablation.png", "pareto.png", "throughput.png"]
    for path in paths:
        assert_real_plot(path.read_bytes())
    both = write_pngs(list(reports.values()), tmp_path / "both")
    assert sorted(p.name for p in both) == ["ablation-quickstart.png", "ablation-report-tiny.png",
                                            "pareto.png", "throughput.png"]


def test_ablation_plot_of_an_infeasible_baseline_says_so(
        reports: dict[str, StudyReport]) -> None:
    from cleanslate.report._plots import ablation_figure

    report = reports["report-tiny"]
    base = report.baseline_trial()
    assert base is not None
    broken = tuple(
        replace(t, record=t.record.model_copy(update={"status": "infeasible", "cause": "nan",
                                                   "value": None, "best_level": None}))
        if t is base else t for t in report.trials)
    fig = ablation_figure(replace(report, trials=broken))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert any("baseline (#0) is infeasible (nan)" in t for t in texts)


def test_unfinished_trials_are_listed_last_and_rendered(
        reports: dict[str, StudyReport]) -> None:
    report = reports["report-tiny"]
    base = report.trials[0]
    extra = (
        replace(base, record=base.record.model_copy(update={
            "number": 7, "status": "infra_failed", "cause": "controller_died", "value": None,
            "best_level": None, "verdict_after": None})),
        replace(base, record=base.record.model_copy(update={
            "number": 8, "status": "running", "cause": None, "value": None, "levels": (),
            "best_level": None, "verdict_after": None, "run_id": None, "argv": ()}), run=None),
    )
    grown = replace(report, trials=report.trials + extra)
    assert [t.number for t in grown.sorted_trials()][-2:] == [7, 8]
    assert grown.best is not None and grown.best.number == report.best.number  # type: ignore[union-attr]
    page = render_html([grown])
    assert 'id="trial-report-tiny-7"' in page and 'id="trial-report-tiny-8"' in page
    assert "controller_died" in page and "b-infra_failed" in page and "b-running" in page


def test_many_trials_keep_the_legend_readable(reports: dict[str, StudyReport]) -> None:
    from cleanslate.report._plots import MAX_LEGEND, pareto_figure, throughput_figure

    report = reports["quickstart"]
    many = tuple(replace(t, record=t.record.model_copy(update={"number": t.number + 10 * k}))
                 for k in range(6) for t in report.trials)
    big = replace(report, trials=many)
    for figure in (throughput_figure([big]), pareto_figure([big])):
        legend = figure.axes[0].get_legend()
        names = [t.get_text() for t in legend.get_texts() if t.get_text().startswith("#")]
        assert 0 < len(names) <= MAX_LEGEND
        assert any(n.startswith(f"#{big.best.number} ") for n in names)  # type: ignore[union-attr]
