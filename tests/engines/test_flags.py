from __future__ import annotations

import pytest

from cleanslate.engines import flag_args, option_name
from cleanslate.engines._flags import flag_names
from cleanslate.errors import InputError


def test_flags_as_the_engine_spells_them() -> None:
    flags = {
        "mem-fraction-static": 0.92,
        "disable-cuda-graph": True,
        "some-list": ["a", "b"],
        "x": None,
        "enable-y": False,
        "tp-size": 2,
        "served-model-name": "m",
    }
    assert flag_args(flags) == [
        "--mem-fraction-static",
        "0.92",
        "--disable-cuda-graph",
        "--some-list",
        "a",
        "b",
        "--tp-size",
        "2",
        "--served-model-name",
        "m",
    ]


def test_short_keys_dashed_keys_mappings_and_empty_lists() -> None:
    assert flag_args({"c": 4096}) == ["-c", "4096"]
    assert flag_args({"--tp": 2, "-ngl": 99}) == ["--tp", "2", "-ngl", "99"]
    assert flag_args({"compilation-config": {"level": 3}}) == [
        "--compilation-config",
        '{"level":3}',
    ]
    assert flag_args({"cudagraph-capture-sizes": []}) == []
    assert flag_args({"xy": [1, 2.5, True]}) == ["--xy", "1", "2.5", "true"]
    assert flag_args(None) == []


def test_flag_names_leave_out_omitted_flags() -> None:
    assert flag_names({"a": None, "bb": False, "c": [], "dd": True, "e": 1}) == ["--dd", "-e"]


@pytest.mark.parametrize("key", ["", "  ", "--", "two words"])
def test_bad_flag_names_are_input_errors(key: str) -> None:
    with pytest.raises(InputError):
        option_name(key)


def test_bad_flag_values_are_input_errors() -> None:
    with pytest.raises(InputError, match="type object"):
        flag_args({"x": object()})  # type: ignore[dict-item]
    with pytest.raises(InputError):
        flag_args({"x": [object()]})  # type: ignore[list-item]
