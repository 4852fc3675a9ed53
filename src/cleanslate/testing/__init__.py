"""Test helpers shipped with the package (like ``optuna.testing``).

- :mod:`cleanslate.testing.tiny_model`: a random-weight Llama and a trained byte-level BPE
  tokenizer, built in well under a second, that real engines (``transformers serve``, vLLM's CPU
  build) can serve with no download. Needs ``torch``, ``transformers`` and ``tokenizers``
  (imported lazily; they are test extras, not runtime dependencies).
- :mod:`cleanslate.testing.fake_openai`: a small aiohttp server speaking the OpenAI completion
  API that misbehaves on demand (HTTP 500, empty output, NaN, repetition, hanging), healthy on
  ``/health`` throughout, for testing smoke tests and readiness logic without an engine.
"""

from __future__ import annotations
