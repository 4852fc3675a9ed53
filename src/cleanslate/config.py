"""YAML files validated by pydantic, with errors at ``file:line`` and never a traceback.

Serve configs and study files go through :func:`load_yaml_model`: a YAML syntax error, a wrong
type, a missing or unknown key becomes an :class:`~cleanslate.errors.InputError` that names the
file and the line of the offending value, with pydantic's message and a hint.

User files are bounded before they are built into Python objects (:func:`read_yaml`): a
regular file (:func:`cleanslate.inputs.read_input`: a FIFO or a device is refused, never
read), at most :data:`MAX_YAML_BYTES` bytes of UTF-8, lists and mappings nested at most
:data:`MAX_YAML_DEPTH` deep, and no aliases (``*name``): an alias repeats a node without
repeating its text, so a few lines of nested aliases (a "billion laughs" file) expand into
more objects than memory holds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from cleanslate.errors import InputError
from cleanslate.inputs import MAX_BYTES, read_input

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


#: The largest YAML file read, in bytes (a study or server file is a few kilobytes).
MAX_YAML_BYTES = MAX_BYTES["yaml"]
#: The deepest nesting of lists and mappings in a YAML file (the top-level mapping is 1).
MAX_YAML_DEPTH = 32


def _read_text(path: Path) -> str:
    """The file's text: at most :data:`MAX_YAML_BYTES` bytes of UTF-8 (InputError otherwise)."""
    raw = read_input(path, kind="yaml")  # a regular file only: a FIFO never blocks
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x})",
                         where=f"{path}:{line}", hint="save the file as UTF-8") from None


def _check_structure(text: str, path: Path) -> None:
    """Refuse aliases and nesting deeper than :data:`MAX_YAML_DEPTH`, from the parser's event
    stream (flat: no recursion, no object built). YAML errors propagate to the caller."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark is not None else None
            raise InputError(
                f"YAML aliases are not accepted (*{event.anchor})",
                where=f"{path}:{line}" if line else str(path),
                hint="write the value out in full where it is used")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else None
                raise InputError(
                    f"lists and mappings are nested more than {MAX_YAML_DEPTH} deep",
                    where=f"{path}:{line}" if line else str(path),
                    hint="flatten the value")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    """Parse a YAML file: its data and its node tree (for line numbers).

    Bounded (see the module docstring): a file too large, not UTF-8, nested too deep, with an
    alias, with a YAML error or a value Python cannot hold (an integer of more than 4300
    digits) is an :class:`InputError` naming the file, and the line where known."""
    text = _read_text(path)
    try:
        _check_structure(text, path)
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = exc.problem or "invalid YAML"
        raise InputError(f"YAML syntax error: {problem}", where=f"{path}{line}",
                         hint="check indentation and quoting on that line") from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML error: {exc}", where=str(path)) from None
    except (ValueError, OverflowError) as exc:
        raise InputError(f"a value cannot be read: {exc}", where=str(path)) from None
    return data, root


def validation_error(path: Path, root: yaml.Node | None, exc: ValidationError,
                     hint: str | None = None) -> InputError:
    """A pydantic validation of a YAML file as an :class:`InputError` at file:line (up to five
    of its errors, each with its line)."""
    return InputError.from_validation(exc, where=str(path), hint=hint, limit=5,
                                      line_of=lambda loc: line_of(root, loc))


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
