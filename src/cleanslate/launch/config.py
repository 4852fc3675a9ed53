"""What to serve: a config file (``cleanslate serve server.yaml``) or command-line options.

Schema (YAML)::

    engine: vllm                 # sglang | vllm | trtllm | transformers | llamacpp | command | sim
    model: /models/Llama-3.1-8B
    host: local                  # or ssh://user@host:port, or a ~/.ssh/config name
    port: 8000                   # default: the engine's default port
    gpus: [0, 1]                 # GPUs the run needs clean (and gets as CUDA_VISIBLE_DEVICES)
    flags:                       # spelled as the engine spells them
      max-model-len: 4096
      enforce-eager: true        # true: bare flag; false and null: omitted
    env: {VLLM_CPU_KVCACHE_SPACE: "1"}
    launch: [python, -m, vllm.entrypoints.openai.api_server]   # override how it starts
    argv: [my-server, --port, "{port}", --model, "{model}"]    # engine: command only
    readiness_path: /health
    ready_timeout_s: 600
    smoke: true
    smoke_timeout_s: 60          # per smoke request
    grace_s: 30                  # SIGTERM grace before SIGKILL at teardown
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from cleanslate.config import load_yaml_model
from cleanslate.engines import engine_class, engine_names
from cleanslate.models import Port


def _argv_template(engine: object) -> bool | None:
    """Whether a known engine starts from an argv template (``None``: not a known engine)."""
    if not isinstance(engine, str) or engine not in engine_names():
        return None
    return engine_class(engine).argv_template


def template_engines() -> str:
    """The engines started from an argv template (``command``), for messages."""
    return " or ".join(n for n in engine_names() if engine_class(n).argv_template)


class ServerFields(BaseModel):
    """The keys that say which server to run and how: shared by server files and study files."""

    model_config = ConfigDict(extra="forbid")

    engine: str
    model: str
    host: str | None = None
    port: Port | None = None
    gpus: list[int] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    launch: list[str] | None = None
    argv: list[str] | None = Field(
        default=None, validate_default=True,
        description="engine command: the server's argv template, with {port} (and {model})")
    python: str | None = None
    readiness_path: str | None = None
    ready_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    smoke: bool = True
    smoke_timeout_s: float = Field(default=60.0, gt=0, le=86400)
    grace_s: float = Field(default=30.0, ge=0, le=86400)

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, value: str) -> str:
        if value not in engine_names():
            raise ValueError(f"unknown engine {value!r}; known: {', '.join(engine_names())}")
        return value

    @field_validator("argv")
    @classmethod
    def _argv(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        engine = info.data.get("engine")
        template = _argv_template(engine)
        if template:
            if not value:
                raise ValueError(f"engine {engine} needs argv: the command that starts the "
                                 'server, with {port}, e.g. [my-server, --port, "{port}"]')
            if not any("{port}" in str(part) for part in value):
                raise ValueError("argv has no {port} placeholder: cleanslate must know the port "
                                 "the server listens on")
        elif value is not None and template is not None:
            raise ValueError(f"argv: is the template of engine {template_engines()}; engine "
                             f"{engine} is "
                             "started by its adapter (use launch: to change the command)")
        return value

    @field_validator("launch")
    @classmethod
    def _launch(cls, value: list[str] | None, info: ValidationInfo) -> list[str] | None:
        engine = info.data.get("engine")
        if value is not None and _argv_template(engine):
            raise ValueError(f"engine {engine} takes argv: (the whole command, with {{port}}), "
                             "not launch:")
        if value is not None and not value:
            raise ValueError("launch: is empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        """Names an environment can hold: not empty, no ``=`` or NUL (``A=B: x`` would set
        ``A`` to ``B=x``, and ``exec`` refuses a NUL); values without NUL."""
        for name, text in value.items():
            if not name or "=" in name or "\0" in name:
                what = "is empty" if not name else "holds '='" if "=" in name else "holds NUL"
                raise ValueError(f"an environment variable's name {what}: a name is letters, "
                                 "digits and '_'")
            if "\0" in text:
                raise ValueError(f"the value of {name} holds a NUL character")
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and any(g < 0 for g in value):
            raise ValueError("GPU indices are 0 or more")
        return value


class ServeConfig(ServerFields):
    """A server to launch. See the module docstring for the YAML form."""

    flags: dict[str, Any] = Field(default_factory=dict)


def load_serve_config(path: Path) -> ServeConfig:
    config, _root = load_yaml_model(
        path, ServeConfig, hint="see `cleanslate serve --help` for the keys of a server file"
    )
    return config
