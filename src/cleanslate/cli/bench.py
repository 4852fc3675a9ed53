"""``cleanslate bench``: load-test a running OpenAI-compatible server (``docs/bench.md``).

Options -> a :class:`~cleanslate.bench.BenchConfig` (every bound is the model's: its errors are
reported against the option that set the field) -> :func:`~cleanslate.bench.run_benchmark` ->
rendering. Exit codes: 0 every level completed every request it sent, 1 a level ended early
(the server died, Ctrl-C), requests failed (a level above ``--max-error-rate`` is moreover
marked as no throughput result), a level completed no request or its output went bad, 2 bad
input. Every request sent is counted: a level's ``sent`` is its ``completed`` plus its
``failed``, each failure by its class (``docs/bench.md``).

``--find-max concurrency|rate`` searches the most load within ``--slo`` instead of measuring
a list of levels (:mod:`cleanslate.cli._find_max`; exit 0 with an answer, 1 without).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.text import Text

from cleanslate.cli._common import (
    check_writable,
    console,
    console_err,
    parse_int_list,
    write_result,
)
from cleanslate.cli._options import StoreOption
from cleanslate.errors import ExitCode, InputError
from cleanslate.inputs import check_input_file

if TYPE_CHECKING:  # the client stack (aiohttp, numpy) is imported when the command runs
    from cleanslate.bench import (
        SLO,
        BenchConfig,
        BenchResult,
        Harness,
        SampleFiles,
        WorkloadSpec,
    )
    from cleanslate.cli._bench_record import BenchRecorder
    from cleanslate.cli._bench_run import RecordedRun
    from cleanslate.store import RunRecord


def parse_slo(text: str | None) -> SLO:
    """``ttft_ms=500,tpot_ms=50,e2e_ms=10000`` -> :class:`SLO` (InputError on bad input)."""
    from cleanslate.bench import SLO, key_values

    if text is None or not text.strip():
        return SLO()
    values: dict[str, float] = {}
    allowed = ("ttft_ms", "tpot_ms", "e2e_ms")
    for key, value in key_values(text, where="--slo", hint="e.g. ttft_ms=500"):
        if key not in allowed:
            from cleanslate.bench import level_key

            try:
                level_key(key)
            except ValueError:
                hint = f"one of {', '.join(allowed)}"
            else:  # p99_tpot_ms: a statistic, the target of a search
                hint = (f"{key} is a statistic: an SLO of --find-max; a level's goodput "
                        f"counts requests meeting per-request limits: {', '.join(allowed)}")
            raise InputError(f"unknown SLO {key!r}", where="--slo", hint=hint)
        try:
            number = float(value)
        except ValueError:
            raise InputError(f"{value.strip()!r} is not a number", where=f"--slo {key}") from None
        if not math.isfinite(number) or number <= 0:
            raise InputError(
                f"{key} must be a positive number of milliseconds, not {value.strip()}",
                where="--slo",
            )
        values[key] = number
    return SLO(**values)


def parse_rates(text: str) -> list[float]:
    """``"1,2.5,inf"`` -> request rates per second (their bounds are :class:`OpenLoop`'s)."""
    return _float_list(text, option="--rate", what="rate", example="4 or inf")


def parse_speedups(text: str) -> list[float]:
    """``"1,2,4"`` -> the time scales of replay levels (their bounds are
    :class:`ReplayLoad`'s)."""
    return _float_list(text, option="--replay", what="time scale", example="1,2,4")


def _float_list(text: str, *, option: str, what: str, example: str) -> list[float]:
    out: list[float] = []
    parts = text.split(",")
    for index, part in enumerate(parts):
        part = part.strip()
        if not part and len(parts) > 1:  # "2,,4": a value left out, never skipped
            raise InputError(f"item {index + 1} of {text.strip()!r} is empty", where=option,
                             hint=f"e.g. {example}")
        if not part:
            continue
        try:
            out.append(float(part))
        except ValueError:
            raise InputError(f"{part!r} is not a {what}", where=option,
                             hint=f"e.g. {example}") from None
    if not out:
        raise InputError(f"no {what} given", where=option)
    return out


def parse_concurrency(text: str) -> list[int]:
    """``"1,16,64"`` -> requests in flight per level (their bounds are :class:`ClosedLoop`'s)."""
    out = parse_int_list(text, option="--concurrency", example="1,16,64,256")
    if not out:
        raise InputError("no concurrency given", where="--concurrency")
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class BenchOptions:
    """The options that make a :class:`BenchConfig`, as typed (``None``: not given)."""

    url: str
    model: str
    concurrency: str | None = None
    rate: str | None = None
    arrival: str = "poisson"
    burstiness: float = 1.0
    max_concurrency: int | None = None
    num_prompts: int | None = None
    duration: float | None = None
    warmup: int | None = None
    seed: int = 0
    workload: str | None = None
    dataset: Path | None = None
    endpoint: str = "completions"
    tokenizer: str | None = None
    slo: str | None = None
    request_timeout: float | None = None
    read_timeout: float = 600.0
    ignore_eos: bool = True
    api_key: str | None = None
    repeats: int | None = None
    target_ci: float | None = None
    max_error_rate: float = 0.01
    ramp: str | None = None
    replay: str | None = None
    observe: bool = True
    observe_interval: float = 0.25
    gpus: str | None = None
    gpu_source: str = "auto"
    engine: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SearchOptions:
    """The options of ``--find-max`` (``None``: not given, the search's default)."""

    slo_attainment: float | None = None
    start: float | None = None
    max_load: float | None = None
    tolerance: float | None = None
    max_probes: int | None = None
    max_extensions: int | None = None
    cliff: float | None = None
    confidence: float | None = None
    server_log: Path | None = None
    engine: str | None = None

    def given(self) -> list[str]:
        """The options given, as written on the command line (``--engine`` is not the
        search's alone: it names the engine behind any bench)."""
        return ["--" + f.name.replace("_", "-") for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None and f.name != "engine"]


def bench(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option("--url", help="server base URL, e.g. http://127.0.0.1:8000 (or --run)",
                     show_default=False),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="model name sent in each request [default with --run: "
                     "the run's]", show_default=False),
    ] = None,
    run: Annotated[
        str | None,
        typer.Option("--run", metavar="ID",
                     help="bench a run `serve` recorded (in --store): its URL (through the SSH "
                     "forward for another host), model, engine, endpoint and request form "
                     "come from the record; options given win; a run that is not ready is "
                     "refused", show_default=False),
    ] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(help="closed loop: requests in flight per level, e.g. 1,16,64,256"),
    ] = None,
    rate: Annotated[
        str | None, typer.Option(help="open loop: requests/s per level, e.g. 2,4,8 or inf")
    ] = None,
    ramp: Annotated[
        str | None,
        typer.Option(help="one level whose load moves: linear:start=1,end=64,duration=60 "
                     "(concurrency; of=rate for a rate; steps:...,steps=8 in steps; "
                     "window=S per-window metrics)", show_default=False),
    ] = None,
    replay: Annotated[
        str | None,
        typer.Option(help="a trace workload's levels: its requests at their times, faster by "
                     "each factor, e.g. 1,2,4 (on top of the trace's speedup=) [default: 1 "
                     "with a trace and neither --concurrency nor --rate]", show_default=False),
    ] = None,
    arrival: Annotated[str, typer.Option(help="open loop arrivals: poisson|constant|gamma")] = (
        "poisson"
    ),
    burstiness: Annotated[float, typer.Option(help="gamma shape (1 = Poisson)")] = 1.0,
    max_concurrency: Annotated[
        int | None, typer.Option(help="open loop: cap on requests in flight")
    ] = None,
    num_prompts: Annotated[
        int | None, typer.Option(help="requests per level (default 5 per slot, at least 50)")
    ] = None,
    duration: Annotated[
        float | None, typer.Option(help="seconds of sending per level (instead of a count)")
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(help="unmeasured requests before the first level [default: 0; with "
                     "--find-max the start's concurrency, at least 8]", show_default=False),
    ] = None,
    seed: Annotated[int, typer.Option(help="seed of prompts and arrivals")] = 0,
    workload: Annotated[
        str | None,
        typer.Option(
            help="random:input_len=1024,output_len=128,range_ratio=0.1 | "
            "shared-prefix:num_prefixes=8,prefix_len=1024,suffix_len=128,output_len=128 | "
            "sharegpt:path=FILE | trace:path=FILE,format=jsonl|mooncake|azure,speedup=1,"
            "fit=drop|clip|off (rows over the server's context),context=N | "
            "conversation:turns=4,input_len=128,output_len=128,think_time_s=0,system_len=0"
        ),
    ] = None,
    dataset: Annotated[
        Path | None, typer.Option(help="ShareGPT-format JSON file (same as sharegpt:path=FILE)")
    ] = None,
    endpoint: Annotated[str, typer.Option(help="completions | chat")] = "completions",
    tokenizer: Annotated[
        str | None, typer.Option(help="local Hugging Face tokenizer directory: exact token counts")
    ] = None,
    slo: Annotated[
        str | None,
        typer.Option(help="goodput SLOs, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=10000; with "
                     "--find-max statistics (p99_tpot_ms=200, also tpot_p99_ms=200), or "
                     "per-request limits with --slo-attainment"),
    ] = None,
    json_out: Annotated[
        str | None, typer.Option("--json", help="write the result JSON here ('-' for stdout)")
    ] = None,
    request_timeout: Annotated[
        float | None,
        typer.Option(
            help="seconds from a request's send to its last byte (default: 600 plus 1 per "
            "output token asked for)",
            show_default=False,
        ),
    ] = None,
    read_timeout: Annotated[
        float, typer.Option(help="seconds a request may wait for its next byte")
    ] = 600.0,
    ignore_eos: Annotated[
        bool, typer.Option(help="ask for exactly output_len tokens (ignore_eos, min_tokens)")
    ] = True,
    api_key: Annotated[
        str | None, typer.Option(envvar="OPENAI_API_KEY", help="bearer token", show_default=False)
    ] = None,
    live: Annotated[bool, typer.Option(help="live view on a terminal")] = True,
    observe: Annotated[
        bool,
        typer.Option(help="watch each level: scrape the engine's Prometheus metrics (running, "
                     "waiting, KV usage, preemptions) and sample the GPUs"),
    ] = True,
    observe_interval: Annotated[
        float,
        typer.Option(help="seconds between the observers' samples (0.05 to 60)"),
    ] = 0.25,
    gpus: Annotated[
        str | None,
        typer.Option(help="GPU indices of this machine to sample during each level (0,1), or "
                     "none [default: the GPUs NVML sees here when --url is on this machine, "
                     "else none]", show_default=False),
    ] = None,
    gpu_source: Annotated[
        str,
        typer.Option(help="where GPU telemetry comes from: auto, nvml, nvidia-smi, sim or off"),
    ] = "auto",
    observe_dir: Annotated[
        Path | None,
        typer.Option(help="write the observers' raw samples here, one JSON Lines file per "
                     "level (default: beside --json FILE, in FILE.observed/; none without "
                     "--json FILE)", show_default=False),
    ] = None,
    repeats: Annotated[
        int | None,
        typer.Option(help="measure each level N times (seeds SEED, SEED+1, ...) and report "
                     "means with 95 % intervals [default: 1; 10 at most with --target-ci]",
                     show_default=False),
    ] = None,
    target_ci: Annotated[
        float | None,
        typer.Option(help="repeat each level (3 times at least, --repeats at most) until the "
                     "95 % interval of its output throughput is within PCT % of its mean",
                     metavar="PCT", show_default=False),
    ] = None,
    max_error_rate: Annotated[
        float, typer.Option(help="a level with a larger share of failed requests is not a "
                            "throughput result (invalid)")
    ] = 0.01,
    find_max: Annotated[
        str | None,
        typer.Option("--find-max", metavar="concurrency|rate",
                     help="search the most load within --slo (double, then bisect) instead "
                     "of measuring --concurrency/--rate levels", rich_help_panel="Capacity"),
    ] = None,
    slo_attainment: Annotated[
        float | None,
        typer.Option(help="--find-max: the share of requests (0-1) that must meet every "
                     "per-request --slo limit [default: none: each --slo is a statistic]",
                     show_default=False, rich_help_panel="Capacity"),
    ] = None,
    start: Annotated[
        float | None,
        typer.Option(help="--find-max: the first load [default: concurrency 8, rate 1]",
                     show_default=False, rich_help_panel="Capacity"),
    ] = None,
    max_load: Annotated[
        float | None,
        typer.Option(help="--find-max: the most load probed [default: concurrency 4096, "
                     "rate 10000]", show_default=False, rich_help_panel="Capacity"),
    ] = None,
    tolerance: Annotated[
        float | None,
        typer.Option(help="--find-max: stop when the bracket is within this share of its "
                     "low end (and 1 request apart) [default: 0.1]", show_default=False,
                     rich_help_panel="Capacity"),
    ] = None,
    max_probes: Annotated[
        int | None,
        typer.Option(help="--find-max: the most probes [default: 16]", show_default=False,
                     rich_help_panel="Capacity"),
    ] = None,
    max_extensions: Annotated[
        int | None,
        typer.Option(help="--find-max: times a probe whose interval straddles its target is "
                     "measured again before it is unresolved [default: 3]",
                     show_default=False, rich_help_panel="Capacity"),
    ] = None,
    cliff: Annotated[
        float | None,
        typer.Option(help="--find-max: a throughput fall (share) between two passing probes "
                     "reported as a cliff [default: 0.2]", show_default=False,
                     rich_help_panel="Capacity"),
    ] = None,
    confidence: Annotated[
        float | None,
        typer.Option(help="--find-max: the level of each probe's Wilson interval "
                     "[default: 0.95]", show_default=False, rich_help_panel="Capacity"),
    ] = None,
    server_log: Annotated[
        Path | None,
        typer.Option(help="--find-max: the server's log: a crash's cause is classified from "
                     "it (with --engine's crash patterns)", show_default=False,
                     rich_help_panel="Capacity"),
    ] = None,
    engine: Annotated[
        str | None,
        typer.Option(help="the engine behind --url (sglang, vllm, llamacpp, trtllm, "
                     "transformers, sim): the metric names read and the flags a verdict "
                     "names; with --find-max --server-log, its crash patterns [default: found "
                     "from what the server answers; the generic crash patterns]",
                     show_default=False),
    ] = None,
    store_url: StoreOption = None,
    no_store: Annotated[
        bool,
        typer.Option("--no-store", help="do not record this bench in the store (every bench "
                     "is recorded by default, under an id `cleanslate runs` lists)"),
    ] = False,
) -> None:
    """Load-test a running OpenAI-compatible server: closed loop (--concurrency) or open loop
    (--rate), streaming, with TTFT/TPOT/ITL/E2E percentiles, throughputs and goodput."""
    run_record: RunRecord | None = None  # the run of --run (None with --url)
    recorded = None
    if run is not None:
        from cleanslate.cli._bench_run import recorded_run

        if url is not None:
            raise InputError("--run takes the server's URL from the run's record",
                             where="--url", hint="give --run ID or --url URL, not both")
        recorded = recorded_run(run, store_url)
        run_record = recorded.record
    elif url is None:
        raise InputError("which server? give --url URL, or --run ID of a run `serve` "
                         "recorded", where="--url")
    elif model is None:
        raise InputError("the model name sent in each request is missing", where="--model",
                         hint="give --model (GET URL/v1/models lists the server's), or "
                         "--run ID of a run `serve` recorded")
    opts = BenchOptions(
        url=url or "", model=model or "", concurrency=concurrency, rate=rate, arrival=arrival,
        burstiness=burstiness, max_concurrency=max_concurrency, num_prompts=num_prompts,
        duration=duration, warmup=warmup, seed=seed, workload=workload, dataset=dataset,
        endpoint=endpoint, tokenizer=tokenizer, slo=slo, request_timeout=request_timeout,
        read_timeout=read_timeout, ignore_eos=ignore_eos, api_key=api_key, repeats=repeats,
        target_ci=target_ci, max_error_rate=max_error_rate, ramp=ramp,
        replay=replay, observe=observe, observe_interval=observe_interval, gpus=gpus,
        gpu_source=gpu_source, engine=engine)
    if run_record is not None:
        from cleanslate.cli._bench_run import options_from_record

        opts = options_from_record(opts, run_record, given=lambda name: _given(ctx, name))
    search = SearchOptions(
        slo_attainment=slo_attainment, start=start, max_load=max_load, tolerance=tolerance,
        max_probes=max_probes, max_extensions=max_extensions, cliff=cliff,
        confidence=confidence, server_log=server_log, engine=engine)
    # The engines register their metric maps and advice books: without them a level reads no
    # engine metrics and its verdict names no engine flag.
    import cleanslate.engines  # noqa: F401
    if find_max is not None:
        if recorded is not None:
            from cleanslate.cli._bench_run import search_of_run

            search = search_of_run(search, recorded)
        _find_max_command(find_max, opts, search, json_out=json_out, live=live,
                          observe_dir=observe_dir,
                          record=(store_url, not no_store,
                                  run_record.id if run_record is not None else None))
    given = search.given()
    if given:
        raise InputError("an option of the capacity search (--find-max)", where=given[0],
                         hint="add --find-max concurrency (or rate) with --slo, or leave "
                         f"{given[0]} out")
    from cleanslate.bench import bound_lines, detail_tables, observation_notes, summary_table

    config = build_config(opts)
    to_stdout = json_out == "-"
    if json_out is not None and not to_stdout:
        check_writable(Path(json_out), option="--json")  # before the run, not after it
    samples = _sample_files(config, json_out, observe_dir)
    recorder = _recorder(store_url, not no_store, opts,
                         run_record.id if run_record is not None else None)
    show_live = live and not to_stdout and console_err.is_terminal
    result = asyncio.run(_run(config, show_live, samples, recorded))
    document = recorder.stamp(json.dumps(result.model_dump(mode="json"), indent=2))
    if json_out is not None and not to_stdout:
        write_result(Path(json_out), document + "\n", option="--json")
    human = console_err if to_stdout else console
    human.print(summary_table(result))
    for line in bound_lines(result.levels):  # the server's words in evidence: text, not markup
        human.print(Text(line), soft_wrap=True)
    for table in detail_tables(result):
        human.print(table)
    for note in observation_notes(result):
        console_err.print(Text(note, style="dim"))
    for line in result.server_config.report() if result.server_config is not None else ():
        human.print(Text(f"server config: {line}"), soft_wrap=True)
    for warning in (*result.warnings, *(w for lv in result.levels for w in lv.warnings)):
        console_err.print(f"[yellow]warning:[/] {escape(warning)}")
    for lv in result.levels:
        if not lv.valid:
            console_err.print(Text(f"{lv.label}: not a throughput result: {lv.invalid_reason}",
                                   style="red"))
        if lv.errors:
            errs = ", ".join(f"{k}: {v}" for k, v in lv.errors.items())
            console_err.print(f"[red]{lv.label}: {lv.failed} failed requests ({escape(errs)})[/]")
            for kind, detail in lv.error_details.items():
                if detail:  # the server's own words, as text (never markup)
                    console_err.print(Text(f"  first {kind}: {detail}"), soft_wrap=True)
    _say_ending(result)
    if to_stdout:
        sys.stdout.write(document + "\n")
        sys.stdout.flush()
    if samples is not None:
        _samples_written(samples)
    if result.failed:
        human.print(f"[bold red]{_failure(result)}[/]: see the levels above")
    else:
        sent = sum(lv.sent for lv in result.levels)
        human.print(f"[bold green]DONE[/]: {len(result.levels)} level(s), {sent} requests "
                    "sent, all completed, no failed request")
    recorder.record(document, config, kind="levels", written_to=json_out,
                    samples_dir=samples.folder if samples is not None and samples.written
                    else None)
    recorder.said(human)
    raise typer.Exit(ExitCode.FAILED if result.failed else ExitCode.OK)


def _recorder(store_url: str | None, enabled: bool, opts: BenchOptions,
              run_id: str | None = None) -> BenchRecorder:
    """The bench's record in the store (``--store``, ``--no-store``), opened before the run:
    a store that cannot be opened is exit 2 before any request."""
    from cleanslate.cli._bench_record import BenchRecorder

    return BenchRecorder(store_url, enabled=enabled, run_id=run_id, engine=opts.engine)


def _say_ending(result: BenchResult) -> None:
    """Why the bench ended where it did, last and in red: the server's crash at a level with
    its cause and where it was read, or the one cause every request of a level failed for with
    the fix as options (the server's words in it are text, never markup)."""
    from cleanslate.cli._bench_run import crash_lines

    lines = crash_lines(result.levels)
    if not lines and result.ended_early:
        lines = [result.ended_early]
    for line in lines:
        console_err.print(Text(line, style="bold red"), soft_wrap=True)


def _failure(result: BenchResult) -> str:
    """What makes a run exit 1, in a word: CRASHED (the server died during a level), PARTIAL
    (a level ended early), ERRORS (failed requests), NO RESULT (a level completed no request,
    or is not a result), BAD OUTPUT."""
    if any(lv.crash is not None for lv in result.levels):
        return "CRASHED"
    if result.partial:
        return "PARTIAL"
    if any(lv.failed for lv in result.levels):
        return "ERRORS"
    if not result.levels or any(not lv.valid for lv in result.levels):
        return "NO RESULT"
    return "BAD OUTPUT"


def _find_max_command(
    dimension: str, opts: BenchOptions, search: SearchOptions, *, json_out: str | None,
    live: bool, observe_dir: Path | None = None,
    record: tuple[str | None, bool, str | None] = (None, True, None),
) -> None:
    """``bench --find-max``: refuse what a search cannot take, run it, exit 0 with an answer,
    1 without (:mod:`cleanslate.cli._find_max`)."""
    from cleanslate.bench import (
        DEFAULT_CLIFF,
        DEFAULT_MAX_EXTENSIONS,
        DEFAULT_MAX_PROBES,
        DEFAULT_TOLERANCE,
    )
    from cleanslate.cli import _find_max as fm

    for option, value, hint in (
            ("--concurrency", opts.concurrency, "--start and --max-load bound the "
             "concurrencies searched"),
            ("--rate", opts.rate, "use --find-max rate with --start and --max-load"),
            ("--replay", opts.replay, "the search sends the trace's prompts by concurrency or "
             "rate; its times are not used"),
            ("--repeats", opts.repeats, "a probe straddling its target is measured again "
             "(--max-extensions)"),
            ("--target-ci", opts.target_ci, "a probe straddling its target is measured again "
             "(--max-extensions)")):
        if value is not None:
            raise InputError(f"--find-max chooses the levels itself: {option} cannot go "
                             "with it", where=option, hint=hint)
    if dimension == "concurrency" and opts.max_concurrency is not None:
        raise InputError("--max-concurrency caps an open loop", where="--max-concurrency",
                         hint="use it with --find-max rate, or leave it out")
    plan = fm.build_plan(
        dimension=dimension, slo=opts.slo, attainment=search.slo_attainment,
        start=search.start, max_load=search.max_load,
        tolerance=DEFAULT_TOLERANCE if search.tolerance is None else search.tolerance,
        max_probes=DEFAULT_MAX_PROBES if search.max_probes is None else search.max_probes,
        max_extensions=(DEFAULT_MAX_EXTENSIONS if search.max_extensions is None
                        else search.max_extensions),
        cliff=DEFAULT_CLIFF if search.cliff is None else search.cliff,
        confidence=0.95 if search.confidence is None else search.confidence,
        warmup=opts.warmup, max_concurrency=opts.max_concurrency,
        server_log=search.server_log, engine=search.engine)
    first = fm.number_text(plan.search.start)
    config = build_config(dataclasses.replace(
        opts, concurrency=first if dimension == "concurrency" else None,
        rate=first if dimension == "rate" else None, warmup=plan.warmup, slo=None,
        repeats=None, target_ci=None))
    to_stdout = json_out == "-"
    if json_out is not None and not to_stdout:
        check_writable(Path(json_out), option="--json")  # before the run, not after it
    samples = _sample_files(config, json_out, observe_dir)
    recorder = _recorder(record[0], record[1], opts, record[2])
    show_live = live and not to_stdout and console_err.is_terminal
    code, document = fm.run(config, plan, json_out=json_out, show_live=show_live,
                            console=console, console_err=console_err, samples=samples)
    document = recorder.stamp(document)
    if to_stdout:
        sys.stdout.write(document + "\n")
        sys.stdout.flush()
    elif json_out is not None:
        write_result(Path(json_out), document + "\n", option="--json")
    if samples is not None:
        _samples_written(samples)
    recorder.record(document, config, kind="find_max", written_to=json_out,
                    samples_dir=samples.folder if samples is not None and samples.written
                    else None, extra={"find_max": dimension, "search_slo": opts.slo})
    recorder.said(console_err if to_stdout else console)
    raise typer.Exit(code)


def _sample_files(config: BenchConfig, json_out: str | None,
                  observe_dir: Path | None) -> SampleFiles | None:
    """Where the observers' raw samples go (``docs/bench.md``, "Raw samples"): ``--observe-dir``,
    else beside ``--json FILE`` in ``FILE.observed/``, else nowhere (``--json -`` and no
    ``--json``: the summaries are in the result; nothing is written unasked). Checked now,
    before the run."""
    from cleanslate.bench import SampleFiles, observed_folder

    if not config.observe.enabled:
        if observe_dir is not None:
            raise InputError("--observe-dir with --no-observe: nothing would be observed",
                             where="--observe-dir", hint="leave one of them out")
        return None
    if observe_dir is not None:
        files = SampleFiles(observe_dir, where="--observe-dir")
    elif json_out is not None and json_out != "-":
        files = SampleFiles(observed_folder(json_out), where="--json")
    else:
        return None
    files.check()
    return files


def _samples_written(samples: SampleFiles) -> None:
    """Say where the samples went; a file refused at the write (a link put where it was to
    go) makes the run exit 2 once its result is written and shown."""
    if samples.written:
        console_err.print(Text(f"observers' samples: {len(samples.written)} file(s) in "
                               f"{samples.folder}", style="dim"))
    if samples.problems:
        raise InputError(f"{len(samples.problems)} samples file(s) not written: "
                         + "; ".join(samples.problems[:3]), where=samples.where,
                         hint="the result itself is written; remove what is in the way "
                         "and run again")


async def _run(config: BenchConfig, show_live: bool, samples: SampleFiles | None = None,
               recorded: RecordedRun | None = None) -> BenchResult:
    """The levels of ``config``; with ``recorded`` (``--run``), against that run: refused when
    its server has exited, reached through its host's forward, each level checked for a crash
    of the run (its exit status and log), its configuration the one read at launch."""
    from cleanslate.bench import Harness, discard_samples
    from cleanslate.cli._find_max import config_reader

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    harness = Harness(stop=stop, on_samples=samples or discard_samples,
                      read_config=config_reader(config), on_note=_note)
    if recorded is None:
        return await _levels(config, harness, show_live)
    from cleanslate.cli._bench_run import check_serving, crash_check, reach, recorded_config

    try:
        await check_serving(recorded)
        harness.check_crash = crash_check(recorded)
        harness.read_config = recorded_config(recorded) or harness.read_config
        async with reach(recorded) as base_url:
            result = await _levels(config.model_copy(update={"url": base_url}), harness,
                                   show_live)
    finally:
        await recorded.executor.close()
    return result.model_copy(update={"url": config.url})  # the run's, not the forward's


async def _levels(config: BenchConfig, harness: Harness, show_live: bool) -> BenchResult:
    """:func:`~cleanslate.bench.run_benchmark`, in the live view on a terminal."""
    from cleanslate.bench import LiveView, run_benchmark

    if not show_live:
        return await run_benchmark(config, harness)
    with LiveView(console_err) as view:
        harness.on_progress, harness.on_level = view.on_progress, view.on_level
        return await run_benchmark(config, harness)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether option ``name`` (its parameter's name) was given on the command line or by its
    environment variable, not left at its default."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _note(text: str) -> None:
    """What the run says before its first level (a trace fitted to the server's context):
    the server's words among it are text, never markup."""
    console_err.print(Text(f"trace: {text}"), soft_wrap=True)


def build_config(opts: BenchOptions) -> BenchConfig:
    """Turn the command-line options into a :class:`BenchConfig`; InputError on bad input.

    Here: what the options mean together (an open or a closed loop, a count or a duration, a
    workload or a dataset file). Every bound on a value is the model's (``docs/bench.md``
    lists them); its errors name the option that set the field."""
    from cleanslate.bench import (
        TARGET_CI_MIN_REPEATS,
        BenchConfig,
        ConversationWorkload,
        ReplayLoad,
        TraceWorkload,
        check_workload_files,
        parse_ramp,
    )

    o = opts
    concurrency, rate = o.concurrency, o.rate
    num_prompts, duration, repeats, target_ci = o.num_prompts, o.duration, o.repeats, o.target_ci
    if num_prompts is not None and duration is not None:
        raise InputError("give --num-prompts or --duration, not both", where="--num-prompts")
    if target_ci is not None and repeats is not None and repeats < TARGET_CI_MIN_REPEATS:
        raise InputError(
            f"--target-ci repeats each level at least {TARGET_CI_MIN_REPEATS} times: "
            f"--repeats {repeats} is fewer", where="--repeats",
            hint=f"give --repeats {TARGET_CI_MIN_REPEATS} or more (the most repeats), or leave "
            "it out (at most 10)")
    spec = _workload_spec(o)
    loads: list[Any]
    if o.replay is not None:
        for option, value in (("--concurrency", concurrency), ("--rate", rate),
                              ("--ramp", o.ramp)):
            if value is not None:
                raise InputError("--replay's levels send the trace's requests at their times",
                                 where=option, hint="leave it out, or use it without --replay")
        if not isinstance(spec, TraceWorkload):
            raise InputError(f"--replay replays a trace's timestamps; the workload is "
                             f"{spec.kind}", where="--replay",
                             hint="give --workload trace:path=FILE,format=jsonl|mooncake|azure")
        loads = [{"kind": "replay", "speedup": x, "max_concurrency": o.max_concurrency}
                 for x in parse_speedups(o.replay)]
    elif o.ramp is not None:
        for option, value in (("--concurrency", concurrency), ("--rate", rate)):
            if value is not None:
                raise InputError("--ramp is the level's load: it moves the concurrency (or, "
                                 "with of=rate, the rate) itself", where=option,
                                 hint="leave it out, or use it without --ramp")
        loads = [parse_ramp(o.ramp)]
    elif isinstance(spec, TraceWorkload) and concurrency is None and rate is None:
        loads = [{"kind": "replay", "max_concurrency": o.max_concurrency}]
    elif rate is not None:
        if concurrency is not None:
            raise InputError(
                "--concurrency is the closed loop, --rate the open loop",
                where="--concurrency",
                hint="cap an open loop with --max-concurrency",
            )
        loads = [
            {"kind": "open", "rate": r, "arrival": o.arrival, "burstiness": o.burstiness,
             "max_concurrency": o.max_concurrency}
            for r in parse_rates(rate)
        ]
    else:
        if o.max_concurrency is not None:
            raise InputError(
                "--max-concurrency caps an open loop",
                where="--max-concurrency",
                hint="use it with --rate, or use --concurrency alone",
            )
        users = spec.users if isinstance(spec, ConversationWorkload) else None
        default = str(users) if users is not None else "1"
        loads = [
            {"kind": "closed", "concurrency": c} for c in parse_concurrency(concurrency or default)
        ]
    try:
        # Every bound (sizes, URL, timeouts) is the model's: docs/bench.md lists them.
        config = BenchConfig.model_validate(
            {
                "url": o.url,
                "model": o.model,
                "endpoint": o.endpoint,
                "workload": spec,
                "loads": loads,
                "num_prompts": num_prompts,
                "duration_s": duration,
                "warmup": o.warmup or 0,
                "seed": o.seed,
                "tokenizer": o.tokenizer,
                "slo": parse_slo(o.slo),
                "ignore_eos": o.ignore_eos,
                "request_timeout_s": o.request_timeout,
                "read_timeout_s": o.read_timeout,
                "api_key": o.api_key,
                "repeats": repeats,
                "target_ci_pct": target_ci,
                "max_error_rate": o.max_error_rate,
                "observe": {"enabled": o.observe, "interval_s": o.observe_interval,
                            "engine": _engine(o.engine),
                            **_gpu_options(o)},
            }
        )
    except ValidationError as exc:
        loop = ("--replay" if o.replay is not None else "--ramp" if o.ramp is not None
                else "--rate" if rate is not None else "--concurrency")
        raise InputError.from_validation(
            exc, options=_OPTIONS,
            # a level's own bound, else the model-level bound on a level's prompts
            default_option=lambda loc: loop if loc[:1] == ("loads",)
            else "--replay" if o.replay is not None else "--num-prompts/--workload",
            hint="docs/bench.md lists the bounds of every option",
        ) from None
    # The file a workload names is read now, as its first level will read it: a bad one is
    # refused before any request (a FIFO, a device, too many rows, a replay of days).
    check_workload_files(config.workload, [x.speedup for x in config.loads
                                           if isinstance(x, ReplayLoad)],
                         where="--dataset" if o.dataset is not None else "--workload")
    return config


def _gpu_options(o: BenchOptions) -> dict[str, Any]:
    """``--gpus`` and ``--gpu-source`` as the observe options' fields (the default GPUs are
    found only when the levels are observed)."""
    from cleanslate.bench import GPU_SOURCES, local_gpus

    if o.gpu_source not in GPU_SOURCES:
        raise InputError(f"unknown GPU telemetry source {o.gpu_source!r}", where="--gpu-source",
                         hint="choose one of " + ", ".join(GPU_SOURCES))
    if not o.observe or o.gpu_source == "off":
        return {"gpus": None, "gpu_source": o.gpu_source}
    if o.gpus is None:
        return {"gpus": local_gpus(o.url, o.gpu_source) or None, "gpu_source": o.gpu_source}
    text = o.gpus.strip().lower()
    if text in ("none", ""):
        return {"gpus": None, "gpu_source": o.gpu_source}
    try:
        chosen = tuple(dict.fromkeys(int(p) for p in text.split(",")))
    except ValueError:
        raise InputError(f"{o.gpus!r} is not a list of GPU indices", where="--gpus",
                         hint="write 0 or 0,1 or none") from None
    if any(g < 0 or g > 1023 for g in chosen):
        raise InputError(f"{o.gpus!r}: a GPU index is 0 to 1023", where="--gpus")
    return {"gpus": chosen, "gpu_source": o.gpu_source}


def _engine(name: str | None) -> str | None:
    """``--engine``, checked against the registered engines (an unknown name is exit 2 with
    the closest names)."""
    if name is None:
        return None
    from cleanslate.engines import engine_class

    try:
        engine_class(name)
    except InputError as exc:
        raise InputError(exc.message, where="--engine", hint=exc.hint) from None
    return name


def _workload_spec(o: BenchOptions) -> WorkloadSpec:
    """The workload of ``--workload`` or ``--dataset`` (random by default)."""
    from cleanslate.bench import ShareGPTWorkload, parse_workload

    if o.dataset is not None:
        if o.workload is not None:
            raise InputError("give --workload or --dataset, not both", where="--dataset")
        if not o.dataset.is_file():
            raise InputError(f"{o.dataset} is not a file", where="--dataset")
        check_input_file(o.dataset, kind="dataset", where="--dataset")  # a regular file
        return ShareGPTWorkload(path=str(o.dataset))
    return parse_workload(o.workload if o.workload is not None else "random")


#: The option of each BenchConfig (and load) field.
_OPTIONS = {
    "url": "--url",
    "model": "--model",
    "endpoint": "--endpoint",
    "num_prompts": "--num-prompts",
    "duration_s": "--duration",
    "warmup": "--warmup",
    "seed": "--seed",
    "request_timeout_s": "--request-timeout",
    "read_timeout_s": "--read-timeout",
    "concurrency": "--concurrency",
    "rate": "--rate",
    "burstiness": "--burstiness",
    "max_concurrency": "--max-concurrency",
    "arrival": "--arrival",
    "ttft_ms": "--slo",
    "tpot_ms": "--slo",
    "e2e_ms": "--slo",
    "repeats": "--repeats",
    "target_ci_pct": "--target-ci",
    "max_error_rate": "--max-error-rate",
    "interval_s": "--observe-interval",
}


__all__ = [
    "BenchOptions",
    "SearchOptions",
    "bench",
    "build_config",
    "parse_concurrency",
    "parse_rates",
    "parse_slo",
]
