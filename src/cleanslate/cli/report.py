"""``cleanslate report``: a study's trials as tables, PNG plots, one HTML page, CSV or JSON."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cleanslate.cli import app
from cleanslate.cli._common import console, console_err
from cleanslate.errors import InputError

if TYPE_CHECKING:  # SQLAlchemy is imported when the command runs
    from cleanslate.store import Store

_FORMATS = ("csv", "json")


def _open_store(url: str | None) -> Store:
    """The store, refusing a SQLite file that does not exist (opening would create it)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from cleanslate.store import Store, resolve_store_url

    resolved = resolve_store_url(url)
    try:
        parsed = make_url(resolved)
    except ArgumentError as exc:
        raise InputError(f"not a database URL: {exc}", where="--store",
                         hint="sqlite:///cleanslate.db or postgresql://user@host/db") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database or "")
        if not path.is_file():
            raise InputError(
                f"no store at {path.resolve()}", where="--store" if url else "STUDY",
                hint="run the report in the folder where `cleanslate tune` ran, or pass "
                     "--store sqlite:///PATH/cleanslate.db")
    return Store(resolved)


def _format(fmt: str | None, out: Path | None) -> str | None:


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


@app.command()
def report(
    study: Annotated[str, typer.Argument(metavar="STUDY",
                                         help="The study's name (the `name:` of its file).")],
    store_url: Annotated[str | None, typer.Option(
        "--store", help="Store URL (default $CLEANSLATE_STORE or sqlite:///cleanslate.db).")
    ] = None,
    compare: Annotated[list[str] | None, typer.Option(
        "--compare", metavar="OTHER_STUDY",
        help="Another study of the store to put side by side (repeatable).")] = None,
    png: Annotated[Path | None, typer.Option(
        "--png", metavar="DIR", help="Write the plots as PNG files into DIR.")] = None,
    html: Annotated[Path | None, typer.Option(
        "--html", metavar="FILE", help="Write one self-contained HTML page.")] = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", metavar="csv|json",
        help="Export the trials as CSV or JSON to stdout (or --out).")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="FILE", help="Write the export here instead of stdout.")] = None,
) -> None:
    """Report on a study: its trials sorted by the objective, the best configuration and its
    launch command; plots, an HTML page, CSV/JSON exports on request."""


    from cleanslate.report import (
        comparison_table,
        load_report,
        print_report,
        print_table,
        render_html,
        render_plots,
        to_csv,
        to_json,
    )

    export = _format(fmt, out)
    store = _open_store(store_url)
    try:
        names = [study, *(compare or [])]
        reports = [load_report(store, name) for name in dict.fromkeys(names)]
    finally:
        store.close()
    # An export to stdout keeps stdout for the export: no tables, notes on stderr.
    to_stdout = export is not None and out is None
    screen = console_err if to_stdout else console
    if not to_stdout:
        for item in reports:
            print_report(screen, item)
        if len(reports) > 1:
            print_table(screen, comparison_table(reports))
    if png is not None or html is not None:
        plots = render_plots(reports)
        if png is not None:
            png.mkdir(parents=True, exist_ok=True)
            for plot in plots:
                path = png / f"{plot.name}.png"
                path.write_bytes(plot.png)
                screen.print(f"wrote {path}", highlight=False)
        if html is not None:
            html.parent.mkdir(parents=True, exist_ok=True)
            html.write_text(render_html(reports, plots=plots), encoding="utf-8")
            screen.print(f"wrote {html}", highlight=False)
    if export is not None:
        text = to_csv(reports) if export == "csv" else to_json(reports)
        if out is None:
            sys.stdout.write(text)
            sys.stdout.flush()
        else:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            screen.print(f"wrote {out}", highlight=False)
