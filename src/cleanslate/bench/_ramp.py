"""Ramps: one level whose load rises (or falls) over its duration, measured in windows.

``--ramp linear:start=1,end=64,duration=60`` raises the concurrency of a closed loop from 1 to
64 over 60 s (``of=rate``: the request rate of an open loop, in requests/s); ``steps:...``
raises it in ``steps`` equal steps instead (default 8) and holds each for its share of the
duration. The level sends for exactly ``duration`` seconds and then waits for the requests in
flight. Its records are cut into windows (``window=`` seconds; default one step, or a tenth of
a linear ramp) and each window reports the load it was at, its throughputs and latencies
(:class:`WindowResult`), so that the knee, where throughput stops rising and latency starts to,
shows in one run.

A concurrency ramp runs ``ceil(max(start, end))`` users; user ``i`` (from 0) sends only while
the target concurrency is above ``i``. A rate ramp draws each gap at the rate of the moment it
starts (Poisson or constant gaps).
"""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cleanslate.bench._limits import MAX_CONCURRENCY, MAX_DURATION_S, MIN_RATE
from cleanslate.bench._workloads import key_values
from cleanslate.errors import InputError

#: Steps of a ``steps`` ramp unless ``steps=`` says otherwise; windows of a linear ramp.
DEFAULT_STEPS = 8
LINEAR_WINDOWS = 10
MAX_STEPS = 1000
#: Windows a ramp is reported in (each a :class:`WindowResult`, computed over every record):
#: ten per second over a ten-minute ramp; a ``window=`` of a nanosecond would ask for 10^10.
MAX_WINDOWS = 10_000


class RampLoad(BaseModel):
    """A load that moves from ``start`` to ``end`` over ``duration_s`` (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["ramp"] = "ramp"
    of: Literal["concurrency", "rate"] = "concurrency"
    shape: Literal["linear", "steps"] = "linear"
    start: float = Field(gt=0)
    end: float = Field(gt=0)
    duration_s: float = Field(gt=0, le=MAX_DURATION_S)
    steps: int | None = Field(default=None, ge=2, le=MAX_STEPS)
    window_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S)
    arrival: Literal["poisson", "constant"] = "poisson"

    @model_validator(mode="after")
    def _bounds(self) -> RampLoad:
        if self.of == "concurrency":
            for name, value in (("start", self.start), ("end", self.end)):
                if value < 1 or value > MAX_CONCURRENCY:
                    raise ValueError(f"{name}: a concurrency from 1 to {MAX_CONCURRENCY:,}, "
                                     f"not {value:g}")
        else:
            for name, value in (("start", self.start), ("end", self.end)):
                if value < MIN_RATE or not math.isfinite(value):
                    raise ValueError(f"{name}: a finite rate of at least {MIN_RATE:g}/s, "
                                     f"not {value:g}")
        if self.steps is not None and self.shape != "steps":
            raise ValueError("steps= is for a steps ramp (steps:start=...,steps=N)")
        if self.window_s is not None and self.window_s > self.duration_s:
            raise ValueError(f"window={self.window_s:g} s is longer than the ramp "
                             f"({self.duration_s:g} s)")
        if self.window_s is not None and self.duration_s / self.window_s > MAX_WINDOWS:
            raise ValueError(f"window={self.window_s:g} s cuts the {self.duration_s:g} s ramp "
                             f"into more than {MAX_WINDOWS:,} windows")
        return self

    @property
    def label(self) -> str:
        unit = "/s" if self.of == "rate" else ""
        return (f"ramp {self.of} {self.start:g}->{self.end:g}{unit} {self.shape} "
                f"{self.duration_s:g}s")

    @property
    def max_concurrency(self) -> int | None:
        """The users of a concurrency ramp (its highest concurrency); ``None`` for a rate."""
        return math.ceil(max(self.start, self.end)) if self.of == "concurrency" else None

    @property
    def n_steps(self) -> int:
        return self.steps or DEFAULT_STEPS

    def target(self, t: float) -> float:
        """The concurrency or rate ``t`` seconds into the ramp."""
        x = min(max(t / self.duration_s, 0.0), 1.0)
        if self.shape == "steps":
            k = self.n_steps
            x = min(math.floor(x * k), k - 1) / (k - 1)
        return self.start + (self.end - self.start) * x

    def windows(self) -> list[tuple[float, float]]:
        """The windows the level is reported in, seconds from its start."""
        if self.window_s is not None:
            size = self.window_s
        elif self.shape == "steps":
            size = self.duration_s / self.n_steps
        else:
            size = self.duration_s / LINEAR_WINDOWS
        count = max(1, math.ceil(self.duration_s / size - 1e-9))
        return [(i * size, min((i + 1) * size, self.duration_s)) for i in range(count)]

    def user_span(self, user: int) -> tuple[float, float] | None:
        """When user ``user`` (from 0) of a concurrency ramp sends: ``(on, off)`` seconds, or
        ``None`` if never (the target is monotonic, so each user's span is one interval,
        found in closed form: a ramp of 100,000 users starts at once)."""
        need = user + 1
        ends = (self.target(0.0) >= need, self.target(self.duration_s) >= need)
        if not ends[0] and not ends[1]:
            return None
        if ends[0] and ends[1]:
            return 0.0, self.duration_s
        x0 = (need - self.start) / (self.end - self.start)  # where the line reaches `need`
        d, k = self.duration_s, self.n_steps
        if ends[1]:  # rising: on from the first moment the target reaches the user
            if self.shape == "linear":
                return x0 * d, d
            return math.ceil(x0 * (k - 1) - 1e-9) * d / k, d
        if self.shape == "linear":  # falling: off once the target is below the user
            return 0.0, x0 * d
        return 0.0, (math.floor(x0 * (k - 1) + 1e-9) + 1) * d / k

    def offsets(self, seed: int, limit: int) -> list[float]:
        """Send times of a rate ramp, seconds from its start (at most ``limit``)."""
        rng = random.Random(f"{seed}:ramp")
        out: list[float] = []
        t = 0.0
        while t < self.duration_s and len(out) < limit:
            out.append(t)
            rate = self.target(t)
            t += rng.expovariate(rate) if self.arrival == "poisson" else 1.0 / rate
        return out

    def expected_requests(self) -> int:
        """Requests a rate ramp sends (its mean rate over the duration); for a concurrency
        ramp, its users."""
        if self.of == "concurrency":
            return self.max_concurrency or 1
        grid = [self.target(self.duration_s * (i + 0.5) / 200) for i in range(200)]
        return math.ceil(sum(grid) / len(grid) * self.duration_s)


#: The keys of ``--ramp SHAPE:key=value,...`` and the field each sets.
_RAMP_KEYS = {"start": "start", "end": "end", "duration": "duration_s", "of": "of",
              "steps": "steps", "window": "window_s", "arrival": "arrival"}


def parse_ramp(text: str, *, where: str = "--ramp") -> RampLoad:
    """``linear:start=1,end=64,duration=60`` (or ``steps:...``) -> a :class:`RampLoad`;
    an :class:`InputError` naming the key on bad input."""
    shape, _, rest = text.strip().partition(":")
    shape = shape.strip()
    example = "e.g. linear:start=1,end=64,duration=60 or steps:start=1,end=64,duration=60,steps=8"
    if shape not in ("linear", "steps"):
        raise InputError(f"unknown ramp {shape!r}: linear or steps", where=where, hint=example)
    fields: dict[str, object] = {"shape": shape}
    for key, value in key_values(rest, where=where, hint=example):
        if key not in _RAMP_KEYS:
            raise InputError(f"unknown key {key!r}", where=where,
                             hint=f"one of {', '.join(_RAMP_KEYS)}")
        fields[_RAMP_KEYS[key]] = value
    missing = [k for k in ("start", "end", "duration") if _RAMP_KEYS[k] not in fields]
    if missing:
        raise InputError(f"the ramp needs {', '.join(missing)}", where=where, hint=example)
    try:
        return RampLoad.model_validate(fields)
    except ValidationError as exc:
        names = {v: k for k, v in _RAMP_KEYS.items()}
        err = exc.errors()[0]
        loc = names.get(str(err["loc"][0]), "") if err["loc"] else ""
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise InputError(f"{loc}: {msg}" if loc else msg, where=where, hint=example) from None


class WindowResult(BaseModel):
    """One window of a ramp: the load it was at and what it measured. Requests belong to the
    window they were sent in; output tokens to the window they arrived in."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_s: float
    end_s: float
    target: float = Field(description="the concurrency or rate at the window's middle")
    sent: int
    completed: int
    failed: int
    in_flight: float = Field(description="mean requests in flight over the window")
    request_throughput: float = Field(description="requests ended in the window per second")
    output_throughput: float = Field(description="output tokens received in the window per "
                                     "second")
    median_ttft_ms: float | None
    p99_ttft_ms: float | None
    median_tpot_ms: float | None
    p99_tpot_ms: float | None


__all__ = ["DEFAULT_STEPS", "MAX_WINDOWS", "RampLoad", "WindowResult", "parse_ramp"]
