"""YAML files validated by pydantic, with errors at ``file:line`` and never a traceback.

Serve configs and study files go through :func:`load_yaml_model`: a YAML syntax error, a wrong
type, a missing or unknown key becomes an :class:`~cleanslate.errors.InputError` that names the
file and the line of the offending value, with pydantic's message and a hint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from cleanslate.errors import InputError

M = TypeVar("M", bound=BaseModel)


def _node_at(node: yaml.Node | None, loc: tuple[int | str, ...]) -> yaml.Node | None:
    """The YAML node at a pydantic error location, or the deepest one found on the way."""
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == str(key)), None)
            if match is None:
                # An unknown key: point at the key itself.
                keynode = next((k for k, _ in node.value if getattr(k, "value", None) == str(key)),
                               None)
                return keynode or node
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            if key >= len(node.value):
                return node
            node = node.value[key]
        else:
            return node
    return node


def line_of(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    node = _node_at(root, loc)
    return node.start_mark.line + 1 if node is not None else None


def read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse a YAML file: its data and its node tree (for line numbers)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", where=str(path)) from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or "invalid YAML"
        raise InputError(f"YAML syntax error: {problem}", where=f"{path}{line}",
                         hint="check indentation and quoting on that line") from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML error: {exc}", where=str(path)) from None
    return data, root


def validation_error(path: Path, root: yaml.Node | None, exc: ValidationError,
                     hint: str | None = None) -> InputError:
    """The first error of a pydantic validation as an :class:`InputError` at file:line."""
    lines = []
    first_line: int | None = None
    for err in exc.errors()[:5]:
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        line = line_of(root, loc)
        first_line = first_line or line
        where = ".".join(str(p) for p in loc) or "(top level)"
        message = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}: {message}" + (f" (line {line})" if line else ""))
    text = lines[0] if len(lines) == 1 else "\n  ".join(["invalid file:", *lines])
    return InputError(text, where=f"{path}:{first_line}" if first_line else str(path), hint=hint)


def load_yaml_model(path: Path, model: type[M], *, hint: str | None = None) -> tuple[M, Any]:
    """Load ``path`` into ``model``; returns the model and the node tree (for later errors)."""
    data, root = read_yaml(path)
    if not isinstance(data, dict):
        raise InputError("expected a mapping of keys to values at the top level",
                         where=f"{path}:1", hint=hint)
    try:
        return model.model_validate(data), root
    except ValidationError as exc:
        raise validation_error(path, root, exc, hint) from None
