"""Engine flags as users write them in YAML, turned into command-line arguments.

A flag mapping is spelled the way the engine spells its options, without the leading dashes::

    mem-fraction-static: 0.92      ->  --mem-fraction-static 0.92
    disable-cuda-graph: true       ->  --disable-cuda-graph
    disable-cuda-graph: false      ->  (omitted: a boolean flag that is off is not passed)
    some-list: [a, b]              ->  --some-list a b
    x: null                        ->  (omitted)
    compilation-config: {level: 3} ->  --compilation-config '{"level":3}'  (JSON, as vLLM takes it)
    c: 4096                        ->  -c 4096   (a one-letter key is a short option)
    np: 4                          ->  -np 4     (for llama.cpp, whose short options are longer)
    --tp: 2                        ->  --tp 2    (a key that already starts with '-' is kept as is)

An engine whose parser has multi-letter short options (llama.cpp's ``-np``, ``-ngl``, ``-fa``)
lists them in its adapter's ``short_options``; those keys get one dash.

``false`` omits the flag instead of writing ``--flag false``: nearly every engine declares its
switches as ``store_true``, which rejects a value. To turn off a switch that defaults to on, use
the engine's negative spelling (``no-enable-prefix-caching: true``). An empty list is omitted too.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import TypeAlias

from cleanslate.errors import InputError

FlagScalar: TypeAlias = str | int | float | bool | None
FlagValue: TypeAlias = FlagScalar | Sequence[str | int | float] | Mapping[str, object]
Flags: TypeAlias = Mapping[str, FlagValue]


def option_name(key: str, short: Collection[str] = ()) -> str:
    """The command-line spelling of a flag key: ``tp-size`` -> ``--tp-size``, ``c`` -> ``-c``,
    and ``np`` -> ``-np`` when ``np`` is one of the engine's multi-letter ``short`` options."""
    key = str(key).strip()
    if not key or key in {"-", "--"}:
        raise InputError("empty engine flag name", hint="write flags as `name: value`")
    if key.startswith("-"):
        return key
    if any(ch.isspace() for ch in key):
        raise InputError(
            f"engine flag {key!r} contains whitespace",
            hint="write one flag per key, e.g. `mem-fraction-static: 0.9`",
        )
    return f"-{key}" if len(key) == 1 or key in short else f"--{key}"


def _scalar(key: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise InputError(
        f"engine flag {key!r} has a value of type {type(value).__name__}",
        hint="use a string, number, boolean, list or mapping",
    )


def flag_args(flags: Flags | None, short: Collection[str] = ()) -> list[str]:
    """Command-line arguments for ``flags``, in the mapping's order (see the module docstring);
    ``short`` names the engine's multi-letter short options."""
    args: list[str] = []
    for key, value in (flags or {}).items():
        name = option_name(key, short)
        if value is None or value is False:
            continue
        if value is True:
            args.append(name)
        elif isinstance(value, Mapping):
            args += [name, json.dumps(dict(value), separators=(",", ":"))]
        elif isinstance(value, str | int | float):
            args += [name, _scalar(key, value)]
        elif isinstance(value, Sequence):
            items = [_scalar(key, item) for item in value]
            if items:
                args += [name, *items]
        else:
            raise InputError(
                f"engine flag {key!r} has a value of type {type(value).__name__}",
                hint="use a string, number, boolean, list or mapping",
            )
    return args


def flag_names(flags: Flags | None, short: Collection[str] = ()) -> list[str]:
    """The option names (``--tp-size``) that ``flag_args`` would pass, omitted ones excluded."""
    return [
        option_name(key, short)
        for key, value in (flags or {}).items()
        if value is not None and value is not False and value != [] and value != ()
    ]
