"""Send times of an open-loop level: Poisson, constant or gamma arrivals at a mean rate."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

from cleanslate.bench._models import OpenLoop


def intervals(load: OpenLoop, n: int, *, seed: int) -> list[float]:
    """``n`` gaps in seconds before each request (the first one is 0, sent at once).

    ``poisson``: exponential gaps of mean ``1/rate``; ``constant``: exactly ``1/rate``;
    ``gamma``: gamma gaps of shape ``burstiness`` and scale ``1/(rate * burstiness)`` (mean
    ``1/rate``, coefficient of variation ``1/sqrt(burstiness)``). ``rate = inf``: all zeros.
    """
    if n <= 0:
        return []
    if math.isinf(load.rate):
        return [0.0] * n
    rng = random.Random(f"{seed}:arrivals")
    mean = 1.0 / load.rate
    gaps: list[float]
    if load.arrival == "constant":
        gaps = [mean] * (n - 1)
    elif load.arrival == "poisson":
        gaps = [rng.expovariate(load.rate) for _ in range(n - 1)]
    else:
        shape = load.burstiness
        gaps = [rng.gammavariate(shape, mean / shape) for _ in range(n - 1)]
    return [0.0, *gaps]


def schedule(load: OpenLoop, n: int, *, seed: int) -> list[float]:
    """Cumulative send offsets in seconds from the start of the level."""
    out: list[float] = []
    t = 0.0
    for gap in intervals(load, n, seed=seed):
        t += gap
        out.append(t)
    return out


def iter_offsets(load: OpenLoop, *, seed: int) -> Iterator[float]:
    """Endless cumulative send offsets in seconds (the same sequence as :func:`schedule`)."""
    if math.isinf(load.rate):
        while True:
            yield 0.0
    rng = random.Random(f"{seed}:arrivals")
    mean = 1.0 / load.rate
    t = 0.0
    yield t
    while True:
        if load.arrival == "constant":
            t += mean
        elif load.arrival == "poisson":
            t += rng.expovariate(load.rate)
        else:
            t += rng.gammavariate(load.burstiness, mean / load.burstiness)
        yield t
