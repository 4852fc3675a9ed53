"""``main()`` turns what escapes a command into an exit code with a reason, never a traceback:
MemoryError and OSError exit 2, a closed stdout pipe exits quietly."""

from __future__ import annotations

from typing import Any

import pytest

import cleanslate.cli as cli_mod


def _run_main(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> int:
    def app() -> None:
        raise exc

    monkeypatch.setattr(cli_mod, "build_app", lambda only=None: app)
    with pytest.raises(SystemExit) as info:
        cli_mod.main()
    return int(info.value.code or 0)


def test_memory_error_exits_2_with_the_reason(monkeypatch: pytest.MonkeyPatch,
                                              capsys: Any) -> None:
    assert _run_main(monkeypatch, MemoryError()) == 2
    err = capsys.readouterr().err
    assert "out of memory" in err and "Traceback" not in err


def test_os_error_exits_2_naming_the_file(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    assert _run_main(monkeypatch, PermissionError(13, "Permission denied", "/x/[b]out")) == 2
    err = capsys.readouterr().err
    assert "/x/[b]out: Permission denied" in err  # the name printed as text, not markup


def test_input_errors_still_exit_2(monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    from cleanslate.errors import InputError

    assert _run_main(monkeypatch, InputError("bad [/x]", where="--opt")) == 2
    assert "--opt: bad [/x]" in capsys.readouterr().err
