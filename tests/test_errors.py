"""``InputError.from_validation``, the one converter of pydantic errors into input errors, and
``ExitCode``, the one definition of the exit codes."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel, Field, ValidationError, field_validator

from cleanslate.errors import ExitCode, InputError


class Load(BaseModel):
    concurrency: int = Field(ge=1)
    arrival: Literal["poisson", "gamma"] = "poisson"


class Config(BaseModel):
    url: str
    loads: list[Load]
    rate: float = Field(default=1.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, value: str) -> str:
        if not value.startswith("http"):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value


def _error(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        Config.model_validate(data)
    return info.value


def test_one_error_reads_location_and_message() -> None:
    err = InputError.from_validation(_error({"url": "ftp://x", "loads": []}), where="f.yaml")
    assert err.where == "f.yaml"
    assert err.message == "url: 'ftp://x' is not an http(s) URL"  # no "Value error, "


def test_what_goes_first_and_more_errors_are_counted() -> None:
    exc = _error({"url": "x", "loads": [{"concurrency": 0}]})
    err = InputError.from_validation(exc, what="not a config", hint="see the docs")
    assert err.message.startswith("not a config: url: ")
    assert err.message.endswith("(and 1 more)")
    assert err.render().endswith("\n  hint: see the docs")
    every = InputError.from_validation(exc, limit=5)
    assert every.message.splitlines()[0] == "2 problems:"
    assert "loads.0.concurrency: Input should be greater than or equal to 1" in every.message


def test_options_name_the_option_and_phrase_the_bound() -> None:
    exc = _error({"url": "http://x", "loads": [{"concurrency": 0}]})
    err = InputError.from_validation(exc, options={"concurrency": "--concurrency"})
    assert (err.where, err.message) == ("--concurrency", "must be at least 1, not 0")
    exc = _error({"url": "http://x", "loads": [{"concurrency": 1, "arrival": "bursty"}]})
    err = InputError.from_validation(exc, options={"arrival": "--arrival"})
    assert err.where == "--arrival"
    assert err.message == "unknown arrival 'bursty' (expected 'poisson' or 'gamma')"
    exc = _error({"url": "http://x", "loads": [], "rate": 0})
    err = InputError.from_validation(exc, options={}, default_option=lambda loc: "--rate")
    assert (err.where, err.message) == ("--rate", "must be more than 0, not 0")


def test_line_of_gives_file_and_line_and_scrub_hides_secrets() -> None:
    exc = _error({"url": "ftp://secret@x", "loads": []})
    err = InputError.from_validation(exc, where="serve.yaml", line_of=lambda loc: 7,
                                     scrub=lambda text: text.replace("secret", "***"))
    assert err.where == "serve.yaml:7"
    assert err.message == "url: 'ftp://***@x' is not an http(s) URL (line 7)"


def test_exit_codes() -> None:
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3]
    assert (ExitCode.OK, ExitCode.FAILED, ExitCode.INPUT, ExitCode.UNKNOWN) == (0, 1, 2, 3)
    from cleanslate.verdict.findings import Verdict

    assert [Verdict(v).exit_code for v in ("clean", "dirty", "unknown")] == [
        ExitCode.OK, ExitCode.FAILED, ExitCode.UNKNOWN]


def test_every_deliberate_error_is_a_cleanslate_error() -> None:
    """One base for what the package raises on purpose; each keeps the builtin it was (a host
    key refused is still an OSError, a bad nvidia-smi row still a ValueError)."""
    from cleanslate.doctor.parse import SmiParseError
    from cleanslate.errors import CleanslateError
    from cleanslate.hosts.ssh import HostKeyError
    from cleanslate.launch.launcher import LaunchError
    from cleanslate.probe.gpu.nvml import NvmlTimeout
    from cleanslate.store._records import NewerSchemaError
    from cleanslate.tune.fleet import LeaseLost
    from cleanslate.tune.trial import HostQuarantined, Interrupted

    for error in (SmiParseError, HostKeyError, LaunchError, NvmlTimeout, NewerSchemaError,
                  LeaseLost, HostQuarantined, Interrupted):
        assert issubclass(error, CleanslateError), error
    assert issubclass(HostKeyError, OSError)
    assert issubclass(SmiParseError, ValueError) and issubclass(NewerSchemaError, ValueError)
