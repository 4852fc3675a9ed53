"""The GLM-5 example study is valid for SGLang 0.5.23: the file loads, and every flag it names
passes the flag check against SGLang 0.5.23's real ``--help`` with no warning."""

from __future__ import annotations

from pathlib import Path

from cleanslate.engines import check_flags, get_engine, parse_help_options
from cleanslate.tune import load_study

REPO = Path(__file__).resolve().parents[2]
HELP = parse_help_options((Path(__file__).parent / "data" / "help_sglang_0.5.23.txt").read_text())


def test_the_glm5_example_is_spelled_for_sglang_0_5_23() -> None:
    spec, _root = load_study(REPO / "examples" / "glm5-sglang.yaml")
    adapter = get_engine("sglang")
    names = {**spec.fixed, **spec.baseline, **{k: True for k in spec.space}}
    assert check_flags(names, HELP, engine="sglang", adapter=adapter) == []
