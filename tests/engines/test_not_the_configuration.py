"""The causes a study stops on (``tune/_systemic.py``) as the classifier gives them: Hugging
Face's model-loading errors are ``model_load`` even though they are raised as Python exceptions
(the H200 study recorded them ``python_exception``), and an engine that is not installed is
``engine_missing``, while a module that only a flag needs stays a Python exception."""

from __future__ import annotations

from pathlib import Path

import pytest

from cleanslate.engines import classify_log
from cleanslate.engines._crash import GENERIC_PATTERNS, classify_text

DATA = Path(__file__).parent / "data"
HF_LOGS = sorted(p for p in DATA.glob("model_load_*.log") if "llamacpp" not in p.name)


def _body(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#"))


@pytest.mark.parametrize("path", HF_LOGS, ids=[p.stem for p in HF_LOGS])
def test_hugging_face_load_errors_win_over_the_exception_they_are_raised_as(path: Path) -> None:
    body = _body(path)
    crash = classify_log("vllm" if "vllm" in path.name else "transformers", body)
    assert crash is not None and crash.cause == "model_load", crash
    # without the model_load rules the same log is a plain Python exception
    others = tuple(p for p in GENERIC_PATTERNS if p.cause != "model_load")
    plain = classify_text(body, others)
    assert plain is not None and plain.cause == "python_exception", plain


def test_hf_logs_cover_the_named_errors() -> None:
    text = "\n".join(_body(p) for p in HF_LOGS)
    for needle in ("HFValidationError", "LocalEntryNotFoundError", "We couldn't connect to",
                   "no file named", "Unrecognized processing class",
                   "Invalid repository ID or local directory"):
        assert needle in text, needle
    assert len(HF_LOGS) >= 6


@pytest.mark.parametrize(("line", "cause"), [
    ("huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found "
     "for url: https://huggingface.co/api/models/org/nope", "model_load"),
    ("OSError: org/nope does not appear to have a file named config.json. Checkout "
     "'https://huggingface.co/org/nope/tree/main' for available files.", "model_load"),
    ("OSError: nope is not a local folder and is not a valid model identifier listed on "
     "'https://huggingface.co/models'", "model_load"),
    ("/usr/bin/python3: No module named vllm", "engine_missing"),
    ("cleanslate: cannot start sglang: [Errno 13] Permission denied: b'/opt/bin/sglang'",
     "engine_missing"),
    ("ModuleNotFoundError: No module named 'flashinfer'", "python_exception"),
])
def test_single_lines(line: str, cause: str) -> None:
    crash = classify_log("vllm", line)
    assert crash is not None and crash.cause == cause, crash
