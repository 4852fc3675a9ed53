"""A level run for a duration (``bench --duration``) records ``num_prompts`` 0: the rules
take its concurrency as the load it asked for, not 0 (issue 37; found on vLLM's CPU build,
whose c=1 level under ``--duration 4`` read as nothing asked and gave ``unknown``)."""

from __future__ import annotations

from cleanslate.bench._bottleneck import diagnose, target
from tests.bench.test_bottleneck import gauge, level, metrics


def test_a_duration_level_asks_for_its_concurrency() -> None:
    counted = level(8, tput=800, ttft=40, tpot=10,
                    server=metrics(gauge(7.8, 8, 0.9), gauge(0.1, 1)))
    timed = counted.model_copy(update={"num_prompts": 0})
    assert target(counted) == target(timed) == 8
    found = diagnose(timed)
    assert found.verdict == "offered_load" and found.figures["target"] == 8, found
    assert "of 8 sent" in found.evidence[0], found.evidence


def test_a_duration_level_the_client_did_not_hold_is_client() -> None:
    timed = level(8, tput=300, ttft=40, tpot=10, in_flight=3).model_copy(
        update={"num_prompts": 0})
    found = diagnose(timed)
    assert found.verdict == "client", found
    assert "at most 3 requests in flight of the 8 asked" in found.evidence[0]
