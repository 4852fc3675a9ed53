"""Faults the simulated engine injects on demand (``--fault NAME[=ARG]``, repeatable).

==========================  ============================================================
``crash-at-concurrency=K``  when more than K requests are in flight, worker TP0 writes a
                            Python traceback (``AttributeError: 'PrefillMetadata' object has
                            no attribute 'page_table_1_flattened'``) to the log and the server
                            exits with status 1
``nan[=K]``                 decoding produces ``NaN`` tokens (text `` NaN NaN ...``); with K,
                            only while more than K requests are in flight (fine at low load,
                            garbage at high load, as SGLang has shipped)
``hang-after=N``            after N requests were admitted, the scheduler stops: requests never
                            finish while ``/health`` still answers 200
``oom-at-start``            worker TP0 logs ``torch.OutOfMemoryError: CUDA out of memory`` while
                            allocating the KV cache and the server exits with status 1
``ignore-sigterm``          worker TP0 ignores SIGTERM (the launcher leaves it behind)
``orphan-grandchild[=MiB]`` worker TP0 starts a helper in a new session (``sim::grandchild``)
                            holding MiB (default 2048) of simulated memory on its GPU; the
                            launcher's SIGTERM does not reach it
``slow-release=S``          simulated memory is released S seconds after its owner is gone
``leave-port=P``            a process in a new session (``sim::listener``) keeps port P
                            listening after the server stops; when P is the server's own port
                            it holds the server's inherited listening socket
``shm-leftover``            files ``/dev/shm/cleanslate-sim-<pid>-*`` are created and left behind
``slow-start=S``            loading takes S more seconds before the port opens
``exit-after=N``            when request N+1 is admitted, the server shuts down by itself and
                            exits with status 0 (as vLLM's API server does after its engine
                            core died: vllm PR #52178), its in-flight requests cut off
``degenerate-after=N``      requests admitted after the first N write only ``!`` tokens, while
                            ``/health`` and ``/v1/models`` still answer 200 (vllm#53480)
``throttle-clock=MHZ``      the simulated GPUs run their SM clock at MHZ instead of 1980 while
                            busy, report the clock-event reason ``hw_thermal_slowdown`` and a
                            hot GPU, and every step takes 1980/MHZ times as long
==========================  ============================================================

Requests count from the server's start, the smoke test's included; ``/health_generate`` probes
do not count.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cleanslate.errors import InputError

FAULT_NAMES = (
    "crash-at-concurrency",
    "nan",
    "hang-after",
    "oom-at-start",
    "ignore-sigterm",
    "orphan-grandchild",
    "slow-release",
    "leave-port",
    "shm-leftover",
    "slow-start",
    "exit-after",
    "degenerate-after",
    "throttle-clock",
)


@dataclass(frozen=True)
class Faults:
    """The parsed ``--fault`` options; ``None`` / ``False`` means the fault is off."""

    crash_at_concurrency: int | None = None
    nan: int | None = None
    hang_after: int | None = None
    oom_at_start: bool = False
    ignore_sigterm: bool = False
    orphan_grandchild: int | None = None
    slow_release: float | None = None
    leave_port: int | None = None
    shm_leftover: bool = False
    slow_start: float | None = None
    exit_after: int | None = None
    degenerate_after: int | None = None
    throttle_clock: int | None = None

    def active(self) -> list[str]:
        """The faults that are on, spelled as on the command line."""
        out = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or value is False:
                continue
            name = f.name.replace("_", "-")
            bare = value is True or (f.name == "nan" and value == 0)
            out.append(name if bare else f"{name}={value}")
        return out


_ARG_KIND: dict[str, type] = {
    "crash-at-concurrency": int,
    "nan": int,
    "hang-after": int,
    "orphan-grandchild": int,
    "slow-release": float,
    "leave-port": int,
    "slow-start": float,
    "exit-after": int,
    "degenerate-after": int,
    "throttle-clock": int,
}
_OPTIONAL_ARG = {"orphan-grandchild": 2048, "nan": 0}


def parse_faults(specs: list[str] | tuple[str, ...]) -> Faults:
    """Parse ``["crash-at-concurrency=8", "nan", "slow-release 3"]`` (``=``, ``:`` or a space
    separates the argument)."""
    values: dict[str, object] = {}
    for raw in specs:
        spec = raw.strip()
        for sep in ("=", ":", " "):
            if sep in spec:
                name, arg = (p.strip() for p in spec.split(sep, 1))
                break
        else:
            name, arg = spec, ""
        name = name.replace("_", "-").lower()
        if name not in FAULT_NAMES:
            raise InputError(
                f"unknown fault {name!r}",
                where="--fault",
                hint="known faults: " + ", ".join(FAULT_NAMES),
            )
        kind = _ARG_KIND.get(name)
        if kind is None:
            if arg:
                raise InputError(f"fault {name!r} takes no argument", where="--fault")
            values[name] = True
            continue
        if not arg:
            if name in _OPTIONAL_ARG:
                values[name] = _OPTIONAL_ARG[name]
                continue
            raise InputError(
                f"fault {name!r} needs an argument", where="--fault", hint=f"write {name}=VALUE"
            )
        try:
            value = kind(arg)
        except ValueError:
            raise InputError(
                f"fault {name!r}: {arg!r} is not a {kind.__name__}", where="--fault"
            ) from None
        if value < 0:
            raise InputError(f"fault {name!r}: the value must not be negative", where="--fault")
        if name == "throttle-clock" and not 100 <= value <= 1980:
            raise InputError(f"fault {name!r}: the clock must be 100 to 1980 MHz",
                             where="--fault")
        values[name] = value
    return Faults(**{k.replace("-", "_"): v for k, v in values.items()})  # type: ignore[arg-type]
