"""The ``cleanslate sim`` commands: the simulated engine, a test double and demo server.

This module does not import :mod:`cleanslate.cli` (which loads every command and its
dependencies), so ``python -m cleanslate.sim serve`` starts fast; :mod:`cleanslate.cli.sim`
mounts :data:`sim_app` as ``cleanslate sim``.

``cleanslate sim serve`` takes SGLang's spelling of the flags it models (``--tp-size``,
``--mem-fraction-static``, ``--disable-cuda-graph`` ...) plus ``--fault NAME[=ARG]``
(repeatable; see :mod:`cleanslate.sim.faults`), ``--ground-truth FILE`` and the noise's
``--noise-seed``, ``--host-noise``, ``--cold-start*`` and ``--drift`` (``docs/sim-model.md``).
``cleanslate sim gpus`` reads the simulated GPU ledger; ``cleanslate sim init-gpus`` creates one.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated

import typer
from rich.console import Console

from cleanslate._types import RUN_MARKER_ENV
from cleanslate.errors import ExitCode, InputError
from cleanslate.sim.ledger import SIM_GPU_DIR_ENV
from cleanslate.sim.ledger import ledger_dir as sim_gpu_dir
from cleanslate.sim.model import COLD_DECODE, COLD_PREFILL, COLD_STEPS, DRIFT_SIGMA

console = Console(highlight=False)
console_err = Console(stderr=True, highlight=False)

sim_app = typer.Typer(
    help="The simulated engine: a test double and demo server, not a real one.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@sim_app.command(
    "serve",
    help="Run the SIMULATED engine: an SGLang-like OpenAI-compatible server with no GPU and no "
    "model. Its GPU memory goes to the ledger named by $CLEANSLATE_SIM_GPU_DIR.",
)
def serve_command(
    port: Annotated[int, typer.Option("--port", help="HTTP port.")] = 30000,
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    model_path: Annotated[
        str, typer.Option("--model-path", "--model", help="Model name (nothing is loaded).")
    ] = "cleanslate/sim-70b",
    served_model_name: Annotated[
        str | None, typer.Option("--served-model-name", help="Name in /v1/models.")
    ] = None,
    tp_size: Annotated[
        int, typer.Option("--tp-size", "--tp", min=1, help="Worker processes / simulated GPUs.")
    ] = 1,
    mem_fraction_static: Annotated[
        float,
        typer.Option("--mem-fraction-static", min=0.05, max=1.0, help="GPU share for weights+KV."),
    ] = 0.88,
    disable_cuda_graph: Annotated[
        bool, typer.Option("--disable-cuda-graph", help="Eager decode: more overhead per step.")
    ] = False,
    cuda_graph_max_bs: Annotated[
        int, typer.Option("--cuda-graph-max-bs", min=1, help="Largest batch with a CUDA graph.")
    ] = 160,
    max_running_requests: Annotated[
        int | None,
        typer.Option("--max-running-requests", min=1,
                     help="Batch limit (requests; default: chosen from the KV cache, at most "
                     "256, as /server_info shows)."),
    ] = None,
    chunked_prefill_size: Annotated[
        int,
        typer.Option("--chunked-prefill-size", help="Prompt tokens per prefill step (-1: off)."),
    ] = 8192,
    context_length: Annotated[
        int, typer.Option("--context-length", min=16, help="Longest prompt + output (tokens).")
    ] = 32768,
    disable_radix_cache: Annotated[
        bool, typer.Option("--disable-radix-cache",
                           help="No prefix cache: every prompt is prefilled whole.")
    ] = False,
    seed: Annotated[
        int, typer.Option("--seed", "--random-seed", help="Seeds token text and timing noise.")
    ] = 0,
    noise_seed: Annotated[
        int | None,
        typer.Option("--noise-seed", help="Seeds this start's timing noise (sim only; default: "
                     "from $CLEANSLATE_RUN, else --seed)."),
    ] = None,
    host_noise: Annotated[
        float,
        typer.Option("--host-noise", min=0.0, max=1.0,
                     help="Sigma of a per-host factor drawn from the host name and GPU ids "
                     "(sim only)."),
    ] = 0.0,
    cold_start: Annotated[
        float,
        typer.Option("--cold-start", min=1.0, max=10.0,
                     help="Prefill steps after a start take this much longer (sim only)."),
    ] = COLD_PREFILL,
    cold_start_decode: Annotated[
        float,
        typer.Option("--cold-start-decode", min=1.0, max=10.0,
                     help="Decode steps after a start take this much longer (sim only)."),
    ] = COLD_DECODE,
    cold_start_steps: Annotated[
        int,
        typer.Option("--cold-start-steps", min=0,
                     help="Steps over which the cold start decays to nothing (sim only)."),
    ] = COLD_STEPS,
    drift: Annotated[
        float,
        typer.Option("--drift", min=0.0, max=1.0,
                     help="Sigma of the slow drift of step times inside one server (sim only)."),
    ] = DRIFT_SIGMA,
    base_gpu_id: Annotated[
        int, typer.Option("--base-gpu-id", min=0, help="First simulated GPU used.")
    ] = 0,
    stream_interval: Annotated[
        int, typer.Option("--stream-interval", min=1, help="Tokens per streamed chunk.")
    ] = 1,
    time_scale: Annotated[
        float,
        typer.Option("--time-scale", min=0.0, help="Multiply every simulated duration (sim only)."),
    ] = 1.0,
    fault: Annotated[
        list[str] | None,
        typer.Option("--fault", help="Inject a fault, NAME[=ARG]; repeatable (sim only)."),
    ] = None,
    ground_truth: Annotated[
        str | None,
        typer.Option("--ground-truth", help="Append one JSON line per request here (sim only)."),
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Accepted and ignored (SGLang flag).")
    ] = False,
    log_level: Annotated[
        str, typer.Option("--log-level", help="Accepted and ignored (SGLang flag).")
    ] = "info",
    log_interval: Annotated[
        int, typer.Option("--decode-log-interval", min=1, help="Decode steps between log lines.")
    ] = 40,
    enable_metrics: Annotated[
        bool, typer.Option("--enable-metrics",
                           help="Serve SGLang-named Prometheus metrics at /metrics (else 404).")
    ] = False,
    enable_metrics_for_all_schedulers: Annotated[
        bool, typer.Option("--enable-metrics-for-all-schedulers",
                           help="One series per TP rank, not rank 0 only (SGLang flag).")
    ] = False,
) -> None:
    from cleanslate.sim.faults import parse_faults
    from cleanslate.sim.launcher import ServeOptions, serve
    from cleanslate.sim.model import REQUEST_POOL_SIZE, SimSettings

    faults = parse_faults(fault or [])
    if chunked_prefill_size == 0 or chunked_prefill_size < -1:
        raise InputError(
            f"--chunked-prefill-size must be positive or -1, got {chunked_prefill_size}",
            where="--chunked-prefill-size",
        )
    settings = SimSettings(
        tp_size=tp_size,
        mem_fraction_static=mem_fraction_static,
        disable_cuda_graph=disable_cuda_graph,
        cuda_graph_max_bs=cuda_graph_max_bs,
        max_running_requests=(REQUEST_POOL_SIZE if max_running_requests is None
                              else max_running_requests),
        chunked_prefill_size=chunked_prefill_size,
        context_length=context_length,
        disable_radix_cache=disable_radix_cache,
        time_scale=time_scale,
        seed=seed,
        noise_seed=noise_seed,
        run_marker=os.environ.get(RUN_MARKER_ENV) or None,
        host_noise=host_noise,
        cold_start=cold_start,
        cold_start_decode=cold_start_decode,
        cold_start_steps=cold_start_steps,
        drift=drift,
    )
    opts = ServeOptions(
        settings=settings,
        port=port,
        host=host,
        model_path=model_path,
        served_model_name=served_model_name,
        faults=faults,
        ground_truth=ground_truth,
        stream_interval=stream_interval,
        base_gpu_id=base_gpu_id,
        log_interval_steps=log_interval,
        max_running_requests_given=max_running_requests is not None,
        enable_metrics=enable_metrics,
        enable_metrics_for_all_schedulers=enable_metrics_for_all_schedulers,
        trust_remote_code=trust_remote_code,
        log_level=log_level,
    )
    code = serve(opts)
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: connections still open would only slow the exit down.
    os._exit(code)


def _ledger_dir(directory: str | None) -> str:
    value = directory or sim_gpu_dir()
    if not value:
        raise InputError(
            "no simulated GPU ledger named",
            where="DIRECTORY",
            hint=f"pass a directory or set {SIM_GPU_DIR_ENV}",
        )
    return value


@sim_app.command("init-gpus", help="Create a simulated GPU ledger (GPU count and size).")
def init_gpus_command(
    directory: Annotated[
        str | None, typer.Argument(help=f"Ledger directory (default: ${SIM_GPU_DIR_ENV}).")
    ] = None,
    gpus: Annotated[int, typer.Option("--gpus", min=1, help="Number of GPUs.")] = 8,
    memory_mib: Annotated[
        int, typer.Option("--memory-mib", min=1024, help="MiB per GPU.")
    ] = 143771,
) -> None:
    from cleanslate.sim import ledger

    path = ledger.write_config(_ledger_dir(directory), gpus, memory_mib)
    console.print(f"simulated GPU ledger: {gpus} x {memory_mib} MiB in {path}")


@sim_app.command("gpus", help="Show the simulated GPU ledger as the `sim` backend reads it.")
def gpus_command(
    directory: Annotated[
        str | None, typer.Argument(help=f"Ledger directory (default: ${SIM_GPU_DIR_ENV}).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the reader's JSON.")] = False,
) -> None:
    from cleanslate.sim import ledger

    result = ledger.read_ledger(_ledger_dir(directory))
    if as_json:
        print(json.dumps(result))
        raise typer.Exit(ExitCode.OK if result.get("ok") else ExitCode.FAILED)
    if not result.get("ok"):
        console_err.print(f"[red]error:[/] {result.get('error')}")
        raise typer.Exit(ExitCode.INPUT)
    for gpu in result["gpus"]:
        procs = ", ".join(
            f"{p['pid']} ({p['name']}, {p['used_mib']} MiB)" for p in gpu["processes"]
        )
        extra = f", releasing {gpu['releasing_mib']} MiB" if gpu["releasing_mib"] else ""
        console.print(
            f"GPU {gpu['index']}: {gpu['memory_used_mib']} / {gpu['memory_total_mib']} MiB"
            f"{extra}  {procs or 'no processes'}"
        )
    console.print("(simulated GPUs)")


def main() -> None:
    """``python -m cleanslate.sim ...``: the ``sim`` commands alone, input errors exit 2."""
    try:
        sim_app(prog_name="python -m cleanslate.sim")
    except InputError as exc:
        console_err.print(f"[bold red]error:[/] {exc.render()}", highlight=False)
        sys.exit(ExitCode.INPUT)
