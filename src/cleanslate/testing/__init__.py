"""Test helpers shipped with the package (like ``optuna.testing``).

- :mod:`cleanslate.testing.tiny_model`: a random-weight Llama and a trained byte-level BPE
  tokenizer, built in well under a second, that real engines (``transformers serve``, vLLM's CPU
  build) can serve with no download. Needs ``torch``, ``transformers`` and ``tokenizers``
  (imported lazily; they are test extras, not runtime dependencies).
- :mod:`cleanslate.testing.fake_openai`: the one fake OpenAI-compatible server (completions and
  chat, streamed and whole, usage chunks), fast enough to measure a benchmark client against and
  misbehaving on demand through one fault vocabulary (HTTP 500, error bodies, empty output, NaN,
  repetition, hanging, malformed events, no usage, short or endless streams, rejected fields),
  healthy on ``/health`` throughout. Standard library only; it writes what
  :mod:`cleanslate.wire` describes, as the simulated engine does.
- :mod:`cleanslate.testing.executor_contract`: the executor contract of
  :mod:`cleanslate.hosts.base` as pytest tests, for any executor (``tests/hosts`` runs it on the
  local and the SSH executor).
"""

from __future__ import annotations
