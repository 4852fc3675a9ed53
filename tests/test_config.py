"""YAML user files are bounded: no aliases, limited depth and size, UTF-8, values Python can hold;
every refusal is an InputError at file:line (exit 2 from the CLI), never a traceback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from cleanslate.config import MAX_YAML_BYTES, MAX_YAML_DEPTH, read_yaml
from cleanslate.errors import InputError

#: Nine levels of nine aliases each: 9**9 (387 million) leaves once expanded.
ALIAS_BOMB = """\
name: bomb
engine: sim
model: sim
concurrency: [1]
space: {fault: [null]}
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
fixed: {x: [*h, *h, *h, *h, *h, *h, *h, *h, *h]}
"""


def _write(tmp_path: Path, data: str | bytes, name: str = "f.yaml") -> Path:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)
    return path


def _refused(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        read_yaml(path)
    return info.value


def test_aliases_are_refused_at_their_line(tmp_path: Path) -> None:
    err = _refused(_write(tmp_path, "a: &x 1\nb: *x\n"))
    assert err.where == f"{tmp_path / 'f.yaml'}:2" and "alias" in err.message
    err = _refused(_write(tmp_path, ALIAS_BOMB))
    assert err.where is not None and err.where.endswith(":7")


def test_merge_keys_need_aliases_and_are_refused(tmp_path: Path) -> None:
    err = _refused(_write(tmp_path, "base: &b {x: 1}\nother:\n  <<: *b\n"))
    assert err.where is not None and err.where.endswith(":3")


def test_anchors_without_aliases_are_fine(tmp_path: Path) -> None:
    data, root = read_yaml(_write(tmp_path, "a: &x 1\nb: [1, {c: d}]\n"))
    assert data == {"a": 1, "b": [1, {"c": "d"}]} and root is not None


def test_depth_is_capped(tmp_path: Path) -> None:
    ok = "a: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1) + "\n"
    read_yaml(_write(tmp_path, ok))
    err = _refused(_write(tmp_path, "a: " + "[" * MAX_YAML_DEPTH + "]" * MAX_YAML_DEPTH + "\n"))
    assert "nested" in err.message
    # Deep enough to raise RecursionError in PyYAML's composer before the cap.
    err = _refused(_write(tmp_path, "a:\n  b: " + "[" * 20000 + "]" * 20000 + "\n"))
    assert err.where == f"{tmp_path / 'f.yaml'}:2"


def test_size_is_capped(tmp_path: Path) -> None:
    err = _refused(_write(tmp_path, "a: " + "x" * MAX_YAML_BYTES + "\n"))
    assert "larger than" in err.message


def test_not_utf8_names_the_line(tmp_path: Path) -> None:
    err = _refused(_write(tmp_path, b"name: a\nmodel: caf\xe9\n"))
    assert err.where == f"{tmp_path / 'f.yaml'}:2" and "UTF-8" in err.message


@pytest.mark.parametrize("text", [
    "a: " + "9" * 5000 + "\n",          # more digits than int() converts
    "a: 2001-13-45\n",                  # a timestamp that is not a date
    "a: !!python/object:os.system x\n",  # an unsafe tag
    "a: [1, 2\n",                       # a syntax error
    "a: \x07\n",                        # a character YAML does not accept
    "? [a, b]\n: c\n",                  # an unhashable key
])
def test_values_that_cannot_be_read(tmp_path: Path, text: str) -> None:
    _refused(_write(tmp_path, text))


def test_missing_file_and_directory(tmp_path: Path) -> None:
    assert "cannot read" in _refused(tmp_path / "nope.yaml").message
    assert "cannot read" in _refused(tmp_path).message


@pytest.mark.parametrize("command", ["tune", "serve"])
@pytest.mark.parametrize("content", [ALIAS_BOMB.encode(), b"name: x\nmodel: \xff\xfe\n",
                                     b"a: " + b"[" * 50000 + b"]" * 50000])
def test_cli_exits_2_quickly_without_a_traceback(cli: Any, tmp_path: Path, command: str,
                                                 content: bytes) -> None:
    path = _write(tmp_path, content)
    t0 = time.monotonic()
    res = cli(command, str(path), timeout=60)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and str(path) in res.stderr
    assert time.monotonic() - t0 < 30
