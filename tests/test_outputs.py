"""The output checks shared by the smoke test and every benchmark level."""

from __future__ import annotations

from cleanslate.bench._runner import SAMPLE_MAX, sampled
from cleanslate.outputs import has_error_finish, judge_text, level_verdict


def test_judge_text() -> None:
    assert judge_text(" NaN NaN NaN")[0] == "nan"  # type: ignore[index]
    assert judge_text("  ")[0] == "empty"  # type: ignore[index]
    assert judge_text("!!!!!!!!!!!!!!!!")[0] == "degenerate"  # type: ignore[index]
    assert judge_text("The ocean is wide and deep, and it covers most of the planet.") is None
    assert judge_text("a banana and naan bread") is None  # words that contain nan


def test_error_finish_in_raw_bytes() -> None:
    assert has_error_finish(b'data: {"choices":[{"finish_reason": "error"}]}\n\n')
    assert not has_error_finish(b'data: {"choices":[{"finish_reason":"length"}]}\n\n')


def test_nan_or_error_finish_in_one_sample_breaks_a_level() -> None:
    assert level_verdict(32, {"nan": 1}) == "nan"
    assert level_verdict(32, {"error_finish": 1}) == "error_finish"
    assert level_verdict(0, {"nan": 1}) is None


def test_repetition_breaks_a_level_only_when_it_came_with_the_load() -> None:
    # Greedy decoding of small or random weights repeats at any load: not a break by itself.
    assert level_verdict(32, {"degenerate": 30}) is None
    assert level_verdict(32, {"degenerate": 30}, {"degenerate": 29}, 32) is None
    # Fine at the first level, mostly repetition now: broken.
    assert level_verdict(32, {"degenerate": 30}, {}, 32) == "degenerate"
    assert level_verdict(32, {"short": 20}, {"short": 1}, 32) == "short"
    assert level_verdict(32, {"degenerate": 10}, {}, 32) is None  # a minority
    assert level_verdict(32, {"empty": 20}) == "empty"  # no text at all is never fine


def test_sampling_takes_the_first_requests_then_every_sixteenth() -> None:
    chosen = [i for i in range(10_000) if sampled(i)]
    assert chosen[:6] == [0, 1, 2, 3, 16, 32]
    assert len(chosen) == SAMPLE_MAX
