"""``cleanslate bench``: load-test a running OpenAI-compatible server (``docs/bench.md``).

Options -> a :class:`~cleanslate.bench.BenchConfig` (every bound is the model's: its errors are
reported against the option that set the field) -> :func:`~cleanslate.bench.run_benchmark` ->
rendering. Exit codes: 0 every level completed with no failed request, 1 a level ended early
(the server died, Ctrl-C) or requests failed, 2 bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
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

from cleanslate.cli._common import check_writable, console, console_err, parse_int_list
from cleanslate.errors import ExitCode, InputError

if TYPE_CHECKING:  # the client stack (aiohttp, numpy) is imported when the command runs
    from cleanslate.bench import SLO, BenchConfig, BenchResult, WorkloadSpec


def parse_slo(text: str | None) -> SLO:
    """``ttft_ms=500,tpot_ms=50,e2e_ms=10000`` -> :class:`SLO` (InputError on bad input)."""
    from cleanslate.bench import SLO

    if text is None or not text.strip():
        return SLO()
    values: dict[str, float] = {}
    allowed = ("ttft_ms", "tpot_ms", "e2e_ms")
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq:
            raise InputError(f"{part!r} is not key=value", where="--slo", hint="e.g. ttft_ms=500")
        if key not in allowed:
            raise InputError(
                f"unknown SLO {key!r}", where="--slo", hint=f"one of {', '.join(allowed)}"
            )
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
    out: list[float] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            out.append(float(part))
        except ValueError:
            raise InputError(
                f"{part!r} is not a rate", where="--rate", hint="e.g. 4 or inf"
            ) from None
    if not out:
        raise InputError("no rate given", where="--rate")
    return out


def parse_concurrency(text: str) -> list[int]:
    """``"1,16,64"`` -> requests in flight per level (their bounds are :class:`ClosedLoop`'s)."""
    out = parse_int_list(text, option="--concurrency", example="1,16,64,256")
    if not out:
        raise InputError("no concurrency given", where="--concurrency")
    return out


def bench(
    url: Annotated[str, typer.Option("--url", help="server base URL, e.g. http://127.0.0.1:8000")],
    model: Annotated[str, typer.Option("--model", help="model name sent in each request")],
    concurrency: Annotated[
        str | None,
        typer.Option(help="closed loop: requests in flight per level, e.g. 1,16,64,256"),
    ] = None,
    rate: Annotated[
        str | None, typer.Option(help="open loop: requests/s per level, e.g. 2,4,8 or inf")
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
    warmup: Annotated[int, typer.Option(help="unmeasured requests before the first level")] = 0,
    seed: Annotated[int, typer.Option(help="seed of prompts and arrivals")] = 0,
    workload: Annotated[
        str | None,
        typer.Option(
            help="random:input_len=1024,output_len=128,range_ratio=0.1 | "
            "shared-prefix:num_prefixes=8,prefix_len=1024,suffix_len=128,output_len=128 | "
            "sharegpt:path=FILE"
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
        str | None, typer.Option(help="goodput SLOs, e.g. ttft_ms=500,tpot_ms=50,e2e_ms=10000")
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
) -> None:
    """Load-test a running OpenAI-compatible server: closed loop (--concurrency) or open loop
    (--rate), streaming, with TTFT/TPOT/ITL/E2E percentiles, throughputs and goodput."""
    from cleanslate.bench._live import summary_table

    config = build_config(
        url=url,
        model=model,
        concurrency=concurrency,
        rate=rate,
        arrival=arrival,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        num_prompts=num_prompts,
        duration=duration,
        warmup=warmup,
        seed=seed,
        workload=workload,
        dataset=dataset,
        endpoint=endpoint,
        tokenizer=tokenizer,
        slo=slo,
        request_timeout=request_timeout,
        read_timeout=read_timeout,
        ignore_eos=ignore_eos,
        api_key=api_key,
    )
    to_stdout = json_out == "-"
    if json_out is not None and not to_stdout:
        check_writable(Path(json_out), option="--json")  # before the run, not after it
    show_live = live and not to_stdout and console_err.is_terminal
    result = asyncio.run(_run(config, show_live))
    document = json.dumps(result.model_dump(mode="json"), indent=2)
    if json_out is not None and not to_stdout:
        try:
            Path(json_out).write_text(document + "\n", encoding="utf-8")
        except OSError as exc:
            raise InputError(f"cannot write {json_out}: {exc.strerror}", where="--json") from None
    human = console_err if to_stdout else console
    human.print(summary_table(result))
    for warning in (*result.warnings, *(w for lv in result.levels for w in lv.warnings)):
        console_err.print(f"[yellow]warning:[/] {escape(warning)}")
    for lv in result.levels:
        if lv.errors:
            errs = ", ".join(f"{k}: {v}" for k, v in lv.errors.items())
            console_err.print(f"[red]{lv.label}: {lv.failed} failed requests ({escape(errs)})[/]")
            for kind, detail in lv.error_details.items():
                if detail:  # the server's own words, as text (never markup)
                    console_err.print(Text(f"  first {kind}: {detail}"), soft_wrap=True)
    if to_stdout:
        sys.stdout.write(document + "\n")
        sys.stdout.flush()
    if result.failed:
        reason = "PARTIAL" if result.partial else "ERRORS"
        human.print(f"[bold red]{reason}[/]: see the levels above")
        raise typer.Exit(ExitCode.FAILED)
    human.print(f"[bold green]DONE[/]: {len(result.levels)} level(s), no failed request")
    raise typer.Exit(ExitCode.OK)


async def _run(config: BenchConfig, show_live: bool) -> BenchResult:
    from cleanslate.bench import run_benchmark
    from cleanslate.bench._live import LiveView

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    if not show_live:
        return await run_benchmark(config, stop=stop)
    with LiveView(console_err) as view:
        return await run_benchmark(config, on_progress=view.on_progress, stop=stop)


def build_config(
    *,
    url: str,
    model: str,
    concurrency: str | None,
    rate: str | None,
    arrival: str,
    burstiness: float,
    max_concurrency: int | None,
    num_prompts: int | None,
    duration: float | None,
    warmup: int,
    seed: int,
    workload: str | None,
    dataset: Path | None,
    endpoint: str,
    tokenizer: str | None,
    slo: str | None,
    request_timeout: float | None,
    ignore_eos: bool,
    api_key: str | None,
    read_timeout: float = 600.0,
) -> BenchConfig:
    """Turn the command-line options into a :class:`BenchConfig`; InputError on bad input.

    Here: what the options mean together (an open or a closed loop, a count or a duration, a
    workload or a dataset file). Every bound on a value is the model's (``docs/bench.md``
    lists them); its errors name the option that set the field."""
    from cleanslate.bench import BenchConfig, ShareGPTWorkload, parse_workload

    if num_prompts is not None and duration is not None:
        raise InputError("give --num-prompts or --duration, not both", where="--num-prompts")
    loads: list[dict[str, Any]]
    if rate is not None:
        if concurrency is not None:
            raise InputError(
                "--concurrency is the closed loop, --rate the open loop",
                where="--concurrency",
                hint="cap an open loop with --max-concurrency",
            )
        loads = [
            {"kind": "open", "rate": r, "arrival": arrival, "burstiness": burstiness,
             "max_concurrency": max_concurrency}
            for r in parse_rates(rate)
        ]
    else:
        if max_concurrency is not None:
            raise InputError(
                "--max-concurrency caps an open loop",
                where="--max-concurrency",
                hint="use it with --rate, or use --concurrency alone",
            )
        loads = [
            {"kind": "closed", "concurrency": c} for c in parse_concurrency(concurrency or "1")
        ]
    spec: WorkloadSpec
    if dataset is not None:
        if workload is not None:
            raise InputError("give --workload or --dataset, not both", where="--dataset")
        if not dataset.is_file():
            raise InputError(f"{dataset} is not a file", where="--dataset")
        spec = ShareGPTWorkload(path=str(dataset))
    elif workload is not None:
        spec = parse_workload(workload)
    else:
        spec = parse_workload("random")
    try:
        # Every bound (sizes, URL, timeouts) is the model's: docs/bench.md lists them.
        return BenchConfig.model_validate(
            {
                "url": url,
                "model": model,
                "endpoint": endpoint,
                "workload": spec,
                "loads": loads,
                "num_prompts": num_prompts,
                "duration_s": duration,
                "warmup": warmup,
                "seed": seed,
                "tokenizer": tokenizer,
                "slo": parse_slo(slo),
                "ignore_eos": ignore_eos,
                "request_timeout_s": request_timeout,
                "read_timeout_s": read_timeout,
                "api_key": api_key,
            }
        )
    except ValidationError as exc:
        loop = "--rate" if rate is not None else "--concurrency"
        raise InputError.from_validation(
            exc, options=_OPTIONS,
            # a level's own bound, else the model-level bound on a level's prompts
            default_option=lambda loc: loop if loc[:1] == ("loads",)
            else "--num-prompts/--workload",
            hint="docs/bench.md lists the bounds of every option",
        ) from None


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
}


__all__ = ["bench", "build_config", "parse_concurrency", "parse_rates", "parse_slo"]
