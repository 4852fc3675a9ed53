"""``cleanslate report``: a study's trials as tables, PNG plots, one HTML page, CSV or JSON;
or one bench, or several side by side (a recorded bench's id, a ``bench --json`` file)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from cleanslate.cli._common import console, console_err
from cleanslate.cli._options import StoreOption
from cleanslate.errors import InputError

if TYPE_CHECKING:  # SQLAlchemy is imported when the command runs
    from collections.abc import Callable

    from rich.console import Console

    from cleanslate.report import BenchReport, Plot
    from cleanslate.store import Store

_FORMATS = ("csv", "json")


def _open_store(url: str | None) -> Store:
    """The store; a SQLite file that does not exist is refused (opening would create it)."""
    from cleanslate.store import Store

    return Store(url, create=False)


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that exists (a link counts as existing)."""
    path = path.absolute()
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _check_output(path: Path, option: str, *, folder: bool) -> None:
    """Refuse an output that cannot be written before any work is done: a file that is a
    folder (or a folder that is a file), a place this user cannot write to, a target that is
    a link, a FIFO or a device, or a folder reached through another user's link
    (:mod:`cleanslate._output_files`)."""
    from cleanslate._output_files import check_output, check_output_folder

    linked = path.is_symlink()
    if folder and path.exists() and not path.is_dir():
        raise InputError(f"{path} is a file, not a folder", where=option,
                         hint="give a folder for the PNG files (it is created if missing)")
    if not folder and not linked and path.is_dir():
        raise InputError(f"{path} is a folder", where=option,
                         hint=f"give a file name, e.g. {path / 'report.html'}")
    if not folder and os.path.lexists(path.parent):
        check_output(path, where=option)
        return
    check_output_folder(path if folder else path.parent, where=option, target=path)
    base = _nearest_existing(path if folder else path.parent)
    if not base.is_dir():
        raise InputError(f"cannot write {path}: {base} is not a folder", where=option)
    if not os.access(base, os.W_OK | os.X_OK):
        raise InputError(f"cannot write {path}: no permission to write in {base}",
                         where=option, hint="choose a folder you can write to")


def _write(option: str, path: Path, data: str | bytes | None, *, shared: bool = False) -> None:
    """Create ``path``'s folder and write ``data`` to it (``None``: create ``path`` as a
    folder) through a temporary file and a rename, never through a link
    (:func:`cleanslate._output_files.write_output`): mode 0600, or 0644 less the umask when
    ``shared`` (the plots). A refusal or an ``OSError`` is an :class:`InputError` naming the
    option."""
    from cleanslate._output_files import (
        PRIVATE_MODE,
        SHARED_MODE,
        make_output_folder,
        write_output,
    )

    if data is None:
        make_output_folder(path, where=option)
        return
    make_output_folder(path.parent, where=option)
    write_output(path, data, where=option, mode=SHARED_MODE if shared else PRIVATE_MODE)


def _format(fmt: str | None, out: Path | None) -> str | None:
    """The export format: ``--format``, else ``--out``'s suffix, else ``None`` (no export)."""
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in _FORMATS:
            raise InputError(f"unknown format {fmt!r}", where="--format", hint="csv or json")
        return fmt
    if out is None:
        return None
    suffix = out.suffix.lower().lstrip(".")
    if suffix in _FORMATS:
        return suffix
    raise InputError(f"cannot tell the export format of {out}", where="--out",
                     hint="add --format csv or --format json")


def report(
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="[STUDY|BENCH_ID|FILE]...",
        help="A study's name (the `name:` of its file), a recorded bench's id (`cleanslate "
             "runs` lists them) or a `bench --json` file; several are put side by side.",
        show_default=False)] = None,
    store_url: StoreOption = None,
    compare: Annotated[list[str] | None, typer.Option(
        "--compare", metavar="OTHER",
        help="Another study (or bench) of the store to put side by side (repeatable); each "
             "configuration a study shares with STUDY gets its difference with the "
             "interval.")
    ] = None,
    png: Annotated[Path | None, typer.Option(
        "--png", metavar="DIR", help="Write the plots as PNG files into DIR.")] = None,
    html: Annotated[Path | None, typer.Option(
        "--html", metavar="FILE", help="Write one self-contained HTML page.")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar="csv|json",
        help="Export the trials as CSV or JSON to stdout (or --out).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE", help="Write the export here instead of stdout.")] = None,
    bench: Annotated[Path | None, typer.Option(
        "--bench", metavar="FILE",
        help="Report on a `bench --json FILE` result instead of a study: its levels with the "
             "engine metrics and GPU telemetry, and a panel per level over time from the "
             "samples beside it (FILE.observed/).")] = None,
    observed: Annotated[Path | None, typer.Option(
        "--observed", metavar="DIR",
        help="With --bench: the observers' samples folder (default: FILE.observed).",
        show_default=False)] = None,
) -> None:
    """Report on a study: its trials sorted by the objective, the best configuration and its
    launch command; plots, an HTML page, CSV/JSON exports on request. On a bench (its id, or
    --bench FILE): its levels and throughput against latency; on several, side by side."""
    if bench is not None or observed is not None:
        _bench_report(targets[0] if targets else None, compare, bench, observed, png=png,
                      html=html, fmt=fmt, out=out)
        return
    if not targets:
        raise InputError("nothing to report on", where="STUDY",
                         hint="give a study's name or a bench's id (`cleanslate runs` lists "
                              "them), or --bench FILE for a bench result")
    _check_outputs(png=png, html=html, fmt=fmt, out=out)  # before the store is opened
    names = list(dict.fromkeys([*targets, *(compare or [])]))
    benches = _benches(names, store_url)
    if benches is not None:
        _render_benches(benches, png=png, html=html, fmt=fmt, out=out)
        return
    study = names[0]
    compare = names[1:]
    from cleanslate.report import (
        comparison_table,
        load_report,
        print_differences,
        print_report,
        print_table,
        render_html,
        render_plots,
        to_csv,
        to_json,
    )

    export = _format(fmt, out)
    for option, path, folder in (("--png", png, True), ("--html", html, False),
                                 ("--out", out, False)):
        if path is not None:
            _check_output(path, option, folder=folder)
    store = _open_store(store_url)
    try:
        reports = [load_report(store, name) for name in [study, *compare]]
    finally:
        store.close()
    # An export to stdout keeps stdout for the export: no tables, notes on stderr.
    to_stdout = export is not None and out is None
    screen = console_err if to_stdout else console

    def wrote(path: Path) -> None:
        screen.print(Text(f"wrote {path}"), highlight=False)

    if not to_stdout:
        for item in reports:
            print_report(screen, item)
        if len(reports) > 1:
            print_table(screen, comparison_table(reports))
            for other in reports[1:]:
                print_differences(screen, reports[0], other)
    if png is not None or html is not None:
        plots = render_plots(reports)
        if png is not None:
            _write("--png", png, None)
            for plot in plots:
                path = png / f"{plot.name}.png"
                _write("--png", path, plot.png, shared=True)
                wrote(path)
        if html is not None:
            _write("--html", html, render_html(reports, plots=plots))
            wrote(html)
    if export is not None:
        text = to_csv(reports) if export == "csv" else to_json(reports)
        if out is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            _write("--out", out, text)
            wrote(out)


def _bench_report(study: str | None, compare: list[str] | None, bench: Path | None,
                  observed: Path | None, *, png: Path | None, html: Path | None,
                  fmt: str | None, out: Path | None) -> None:
    """``report --bench FILE``: :func:`_render_bench` of the file (``--png DIR``:
    ``throughput-latency.png`` and ``level-<label>.png``)."""
    from cleanslate.report import load_bench_report

    if bench is None:
        raise InputError("--observed goes with --bench", where="--observed",
                         hint="add --bench FILE (the bench result the samples belong to)")
    if study is not None or compare:
        raise InputError("--bench reports on a bench result, not a study",
                         where="STUDY" if study is not None else "--compare",
                         hint="leave out the study (or --bench); several benches: give their "
                              "ids or files without --bench")
    _check_outputs(png=png, html=html, fmt=fmt, out=out)
    _render_bench(load_bench_report(bench, observed), png=png, html=html, fmt=fmt, out=out)


def _check_outputs(*, png: Path | None, html: Path | None, fmt: str | None,
                   out: Path | None) -> str | None:
    """The export format (:func:`_format`), every output checked before any work."""
    export = _format(fmt, out)
    for option, path, folder in (("--png", png, True), ("--html", html, False),
                                 ("--out", out, False)):
        if path is not None:
            _check_output(path, option, folder=folder)
    return export


#: How a report names what it was given, in its errors.
_TARGET = "STUDY|BENCH_ID|FILE"


def _benches(names: list[str], store_url: str | None) -> list[BenchReport] | None:
    """The benches ``names`` are (a recorded bench's id, or a ``bench --json`` file), or
    ``None`` when they are studies. A name that is neither a study nor a bench of the store is
    an :class:`InputError` naming what was looked for (exit 2); so are studies and benches
    mixed."""
    from cleanslate.report import load_bench_report, stored_bench_report

    found: list[tuple[str, BenchReport | None]] = []
    store: Store | None = None
    try:
        for name in names:
            if os.path.isfile(name):  # `report bench.json`: a file as --bench takes it
                found.append(("bench", load_bench_report(Path(name))))
                continue
            if name.endswith(".json"):
                raise InputError(f"no file {name}", where=_TARGET,
                                 hint="give the file `cleanslate bench --json FILE` wrote, or "
                                      "a bench's id (`cleanslate runs` lists them)")
            if store is None:
                store = _open_store(store_url)
            if store.study(name) is not None:
                found.append(("study", None))
                continue
            record = store.bench(name)
            if record is None:
                raise _unknown(store, name)
            found.append(("bench", stored_bench_report(record)))
    finally:
        if store is not None:
            store.close()
    kinds = {kind for kind, _ in found}
    if kinds == {"study"}:
        return None
    if len(kinds) > 1:
        raise InputError("studies and benches cannot be put side by side", where=_TARGET,
                         hint="report the studies, or the benches, in one command each")
    return [item for _, item in found if item is not None]


def _unknown(store: Store, name: str) -> InputError:
    """``name`` is neither a study nor a bench of ``store``: what was looked for, and what
    there is."""
    studies, benches = store.studies()[-5:], store.bench_ids()
    there = "; ".join(part for part in (
        ("known studies: " + ", ".join(studies)) if studies else "",
        ("recent benches: " + ", ".join(benches)) if benches else "") if part)
    return InputError(f"no study {name!r} and no bench {name!r} in {store.display_url} (nor a "
                      f"file {name})", where=_TARGET,
                      hint=(there or "the store holds no study and no bench")
                      + "; `cleanslate runs` lists runs and benches; pass --store if it is "
                        "another store")


def _render_bench(loaded: BenchReport, *, png: Path | None, html: Path | None,
                  fmt: str | None, out: Path | None) -> None:
    """One bench: its levels table with what the observers saw, throughput against latency
    and a panel per level (``--png DIR``, ``--html``), a flat export per level."""
    from cleanslate.bench import bound_lines, observation_notes, summary_table
    from cleanslate.report import (
        bench_csv,
        bench_json,
        level_plots,
        render_bench_html,
        throughput_latency_plot,
    )

    export = _format(fmt, out)
    to_stdout = export is not None and out is None
    screen = console_err if to_stdout else console
    if not to_stdout:
        screen.print(summary_table(loaded.result))
        for line in bound_lines(loaded.result.levels):  # the evidence: text, never markup
            screen.print(Text(line), soft_wrap=True)
        cap = loaded.cap
        screen.print(Text("running cap in effect: " + (f"{cap[0]:g} ({cap[1]})" if cap
                                                        else "not recorded")))
    for note in observation_notes(loaded.result):
        console_err.print(Text(note, style="dim"))
    if loaded.samples_note:
        console_err.print(Text(loaded.samples_note, style="yellow"))
    for f in loaded.files:
        if f.problem:
            console_err.print(Text(f"{f.label} ({f.key}): {f.problem}", style="yellow"))
    _bench_outputs(
        screen, png=png, html=html, export=export, out=out,
        plots=lambda: [throughput_latency_plot([loaded]), *level_plots(loaded)],
        page=lambda plots: render_bench_html(loaded, plots=plots),
        text=lambda kind: bench_csv(loaded) if kind == "csv" else bench_json(loaded))


def _render_benches(benches: list[BenchReport], *, png: Path | None, html: Path | None,
                    fmt: str | None, out: Path | None) -> None:
    """One bench (:func:`_render_bench`), or several side by side: a table of every bench's
    levels, throughput against latency with a line per bench (``--png DIR``:
    ``throughput-latency.png``; ``--html``), CSV/JSON with a row per bench and level."""
    export = _check_outputs(png=png, html=html, fmt=fmt, out=out)
    if len(benches) == 1:
        _render_bench(benches[0], png=png, html=html, fmt=fmt, out=out)
        return
    from cleanslate.report import (
        benches_csv,
        benches_json,
        benches_table,
        render_benches_html,
        throughput_latency_plot,
    )

    to_stdout = export is not None and out is None
    screen = console_err if to_stdout else console
    if not to_stdout:
        screen.print(benches_table(benches))
    for item in benches:
        if item.samples_note and png is not None:
            console_err.print(Text(f"{item.name}: {item.samples_note}", style="yellow"))
    _bench_outputs(
        screen, png=png, html=html, export=export, out=out,
        plots=lambda: [throughput_latency_plot(benches)],
        page=lambda plots: render_benches_html(benches, plots=plots),
        text=lambda kind: benches_csv(benches) if kind == "csv" else benches_json(benches))


def _bench_outputs(screen: Console, *, png: Path | None, html: Path | None,
                   export: str | None, out: Path | None,
                   plots: Callable[[], list[Plot]], page: Callable[[list[Plot]], str],
                   text: Callable[[str], str]) -> None:
    """Write what a bench report was asked for: ``plots()`` as PNGs in ``png``, ``page(plots)``
    to ``html``, ``text(export)`` to ``out`` (stdout when ``None``); each file said on
    ``screen``."""
    if png is not None or html is not None:
        drawn = plots()
        if png is not None:
            _write("--png", png, None)
            for plot in drawn:
                path = png / f"{plot.name}.png"
                _write("--png", path, plot.png, shared=True)
                screen.print(Text(f"wrote {path}"), highlight=False)
        if html is not None:
            _write("--html", html, page(drawn))
            screen.print(Text(f"wrote {html}"), highlight=False)
    if export is not None:
        body = text(export)
        if out is None:
            sys.stdout.write(body)
            sys.stdout.flush()
        else:
            _write("--out", out, body)
            screen.print(Text(f"wrote {out}"), highlight=False)


__all__ = ["report"]
