"""Test helpers shipped with the package (like ``optuna.testing``): the contracts where parts
meet, as checks any implementation can be held to, and the test doubles the suites use.

Contracts (each runs in ``tests/`` on every implementation cleanslate ships, and can be run from
a plug-in's own tests):

- :mod:`cleanslate.testing.engine_contract`: the engine adapter contract of
  :mod:`cleanslate.engines` (:func:`~cleanslate.testing.engine_contract.check_engine`), run on
  every registered engine (``tests/engines/test_contract.py``). An engine written outside
  cleanslate calls it from its own tests; ``tests/engines/toy_engine.py`` is a whole engine in
  one file.
- :mod:`cleanslate.testing.gpu_contract`: the GPU backend contract of
  :mod:`cleanslate.probe.gpu.base` (:func:`~cleanslate.testing.gpu_contract.check_read`), run on
  NVML (a replay of ``pynvml``), ``nvidia-smi`` (replayed real outputs), the sim ledger and
  ``none``, answering and failing.
- :mod:`cleanslate.testing.executor_contract`: the executor contract of
  :mod:`cleanslate.hosts.base` as pytest tests (``from ... import *`` beside an ``executor``
  fixture), run on the local and the SSH executor.

Test doubles:

- :mod:`cleanslate.testing.fake_openai`: the one fake OpenAI-compatible server (completions and
  chat, streamed and whole, usage chunks), fast enough to measure a benchmark client against and
  misbehaving on demand through one fault vocabulary (HTTP 500, error bodies, empty output, NaN,
  repetition, hanging, malformed events, no usage, short or endless streams, rejected fields),
  healthy on ``/health`` throughout. Standard library only; it writes what
  :mod:`cleanslate.wire` describes, as the simulated engine does.
- :mod:`cleanslate.testing.tiny_model`: a random-weight Llama and a trained byte-level BPE
  tokenizer, built in well under a second, that real engines (``transformers serve``, vLLM's CPU
  build) can serve with no download. Needs ``torch``, ``transformers`` and ``tokenizers``
  (imported lazily; they are test extras, not runtime dependencies).
- :mod:`cleanslate.testing.tiny_gguf`: the same kind of model as one GGUF file, for llama.cpp's
  ``llama-server`` (``numpy``, ``tokenizers`` and ``gguf``; no torch).

Nothing is imported here: import the module you need (the contracts need pytest).
"""

from __future__ import annotations

__all__ = ["engine_contract", "executor_contract", "fake_openai", "gpu_contract", "tiny_gguf",
           "tiny_model"]
