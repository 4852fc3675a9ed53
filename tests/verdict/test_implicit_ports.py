"""The ports a check requires free without being asked, as a pure function
(:func:`cleanslate.verdict.implicit_ports`), with no store and no host."""

from __future__ import annotations

from cleanslate.engines import engine_class, engine_names
from cleanslate.verdict import implicit_ports
from cleanslate.verdict.ports import MAX_RECORDED_RUNS


def test_the_engines_default_ports_and_the_recorded_runs_ports() -> None:
    vllm = engine_class("vllm").default_port
    reasons = implicit_ports(["vllm"], [(vllm, "r-1"), (40001, "r-2"), (40001, "r-3")])
    assert reasons[vllm] == "default port of vllm; recorded run r-1"
    assert reasons[40001] == "recorded runs r-2, r-3"
    assert set(reasons) == {vllm, 40001}


def test_every_engine_when_none_is_named() -> None:
    ports = {engine_class(n).default_port for n in engine_names()}
    assert set(implicit_ports(None, [])) == ports


def test_a_store_s_nonsense_is_left_out_and_only_the_latest_runs_count() -> None:
    runs = [(0, "r-zero"), (70000, "r-big"), (-5, "r-neg")]
    runs += [(41000 + i % 7, f"r-{i}") for i in range(MAX_RECORDED_RUNS + 50)]
    reasons = implicit_ports(["vllm"], runs)
    assert not {0, 70000, -5} & set(reasons)
    named = " ".join(reasons.values())
    assert "r-49 " not in named + " " and f"r-{MAX_RECORDED_RUNS + 49}" in named
    assert "and " in reasons[41000]  # many runs on one port: the last three named, a count
