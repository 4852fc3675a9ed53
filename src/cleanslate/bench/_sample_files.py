"""The observers' raw samples as artifact files: one JSON Lines file per measurement and key.

A level's observers (:mod:`cleanslate.bench._observe`) return a summary, stored in the level's
result, and raw samples, which are too many for the result: :class:`SampleFiles` is the
harness's sink (``Harness.on_samples``) that writes them into a folder, and
:func:`read_sample_files` reads them back (``cleanslate report --bench``).

The folder (``bench --json OUT.json`` writes ``OUT.json.observed/``, or ``--observe-dir DIR``)
holds:

- ``<label>.<key>.jsonl``: one measurement's samples of one observer (``key``:
  ``server_metrics``, ``gpu``), one JSON object per line, in time order. Each has ``t``, the
  benchmark's clock (``time.perf_counter()`` seconds, the clock of the level's window); an
  engine-metrics sample has ``series`` (vocabulary key -> rank series -> value), ``error`` when
  the scrape gave nothing and ``skipped`` when values were left out; the label is made safe
  for a file name (characters other than letters, digits, ``=``, ``.``, ``_``, ``-`` become
  ``_``) and a second measurement of the same name gets ``-2``, ``-3``...
- ``index.json``: ``{"files": [{"label", "key", "file", "samples"}...]}``, rewritten after
  each measurement: which file holds what, with the label as the live view showed it
  (``c=16``, ``c=16 repeat 2/3``, ``c=16 extension 1``). A reader goes by the index, so files
  of an earlier run left in the folder are not mistaken for this run's.

Every file is written by :func:`cleanslate._output_files.write_output` (a temporary file and a
rename, mode 0600, never through a link); a refused write does not stop the benchmark: it is
kept in :attr:`SampleFiles.problems` for the caller to report.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cleanslate.errors import InputError

#: The folder beside a ``--json`` file: ``OUT.json`` -> ``OUT.json.observed``.
OBSERVED_SUFFIX = ".observed"
INDEX_NAME = "index.json"
#: Characters of a label kept in a file name.
NAME_CHARS = 100
#: Files listed in one index (a find-max run of 64 probes with extensions and two observers
#: lists a few hundred).
MAX_FILES = 4096

_UNSAFE = re.compile(r"[^A-Za-z0-9=._-]+")


def observed_folder(json_path: Path | str) -> Path:
    """The samples folder that belongs to the bench JSON file ``json_path``."""
    path = Path(json_path)
    return path.with_name(path.name + OBSERVED_SUFFIX)


def file_stem(label: str) -> str:
    """``label`` as the start of a file name (see the module docstring)."""
    stem = _UNSAFE.sub("_", label).strip("._")[:NAME_CHARS]
    return stem or "level"


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: such a value (which an observer should have skipped)
    becomes ``null``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def jsonl(samples: Sequence[Mapping[str, Any]]) -> str:
    """Samples as JSON Lines (one compact object per line, ending with a newline)."""
    return "".join(json.dumps(_finite(s), separators=(",", ":"), allow_nan=False) + "\n"
                   for s in samples)


@dataclass
class SampleFiles:
    """A ``Harness.on_samples`` sink writing each measurement's samples into ``folder``
    (created at the first write). ``where`` names the option in refusals (``--json``,
    ``--observe-dir``). ``written`` lists the index entries; ``problems`` what could not be
    written and why (a link where a file was to go, a full disk), in order."""

    folder: Path
    where: str | None = None
    written: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Refuse, before the run, a folder the writes would refuse (a file where it should
        be, another user's link on its way): an :class:`InputError` naming ``where``."""
        from cleanslate._output_files import check_output, check_output_folder

        if self.folder.is_symlink() or (self.folder.exists() and not self.folder.is_dir()):
            raise InputError(f"{self.folder} is not a folder: the observers' samples go into "
                             "a folder of their own", where=self.where,
                             hint="remove it or choose another place")
        check_output_folder(self.folder, where=self.where)
        if self.folder.is_dir():
            check_output(self.folder / INDEX_NAME, where=self.where)

    def _name(self, label: str, key: str) -> str:
        taken = {entry["file"] for entry in self.written}
        stem, n = file_stem(label), 1
        name = f"{stem}.{key}.jsonl"
        while name in taken:
            n += 1
            name = f"{stem}-{n}.{key}.jsonl"
        return name

    def __call__(self, label: str, key: str, samples: Sequence[Mapping[str, Any]]) -> None:
        from cleanslate._output_files import make_output_folder, write_output

        if len(self.written) >= MAX_FILES:
            self.problems.append(f"{label} ({key}): not written, the folder already lists "
                                 f"{MAX_FILES} files")
            return
        name = self._name(label, file_stem(key))
        try:
            make_output_folder(self.folder, where=self.where)
            write_output(self.folder / name, jsonl(samples), where=self.where)
            self.written.append({"label": label, "key": key, "file": name,
                                 "samples": len(samples)})
            write_output(self.folder / INDEX_NAME,
                         json.dumps({"files": self.written}, indent=1) + "\n",
                         where=self.where)
        except InputError as exc:
            self.problems.append(f"{label} ({key}): {exc.message}")


def discard_samples(label: str, key: str, samples: Sequence[Mapping[str, Any]]) -> None:
    """The sink of a run whose samples go nowhere (``bench`` without ``--json FILE`` or
    ``--observe-dir``): they are dropped, not kept in memory for the whole run
    (``Harness.kept``, which keeps them when no sink is given)."""


@dataclass(frozen=True)
class SampleFile:
    """One measurement's samples of one observer, read back. ``problem``: why the file gave
    nothing (missing, too large, not JSON Lines); then ``samples`` is empty."""

    label: str
    key: str
    file: str
    samples: tuple[dict[str, Any], ...] = ()
    problem: str | None = None


#: Reads one file of a samples folder by its name there: its bytes, or an :class:`InputError`
#: or :class:`OSError` saying why not.
Reader = Callable[[str], bytes]
#: The most bytes of one samples file read (about 2.5 hours of one level at 250 ms).
MAX_SAMPLE_FILE_BYTES = 16 << 20


def _read_lines(name: str, read: Reader) -> tuple[tuple[dict[str, Any], ...], str | None]:
    try:
        raw = read(name)
    except InputError as exc:
        return (), f"{name}: {exc.message}"
    except OSError as exc:
        return (), f"{name}: {exc.strerror or exc}"
    samples: list[dict[str, Any]] = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            return (), f"{name}:{number}: not a JSON object"
        if not isinstance(value, dict) or not isinstance(value.get("t"), int | float):
            return (), f"{name}:{number}: a sample without its time ('t')"
        samples.append(value)
    return tuple(samples), None


def read_sample_files(folder: Path | str, read: Reader | None = None) -> list[SampleFile]:
    """The files ``folder``'s index lists, each read (bounded by
    :func:`cleanslate.inputs.read_input`'s cap, 16 MiB a file, unless ``read``, which reads a
    file of the folder by name, is given). A missing or unreadable index is an
    :class:`InputError` naming the folder (or ``read``'s own error); a listed file that cannot
    be read is a :class:`SampleFile` with its ``problem``. Names in the index are taken only
    as names in ``folder`` (a path with a separator is refused)."""
    from cleanslate.inputs import read_input

    folder = Path(folder)
    index = folder / INDEX_NAME
    if read is None:
        def read(name: str) -> bytes:
            return read_input(folder / name, kind="other")
    raw = read(INDEX_NAME)
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise InputError(f"{index} is not JSON", where=str(index),
                         hint="it is written by `bench --json` beside its result") from None
    entries = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise InputError(f"{index} lists no files", where=str(index))
    out: list[SampleFile] = []
    for entry in entries[:MAX_FILES]:
        if not isinstance(entry, dict):
            continue
        label, key, name = (str(entry.get(k, "")) for k in ("label", "key", "file"))
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            out.append(SampleFile(label, key, name, problem="not a file name in the folder"))
            continue
        samples, problem = _read_lines(name, read)
        out.append(SampleFile(label, key, name, samples, problem))
    return out


__all__ = [
    "INDEX_NAME",
    "MAX_SAMPLE_FILE_BYTES",
    "OBSERVED_SUFFIX",
    "Reader",
    "SampleFile",
    "SampleFiles",
    "discard_samples",
    "file_stem",
    "jsonl",
    "observed_folder",
    "read_sample_files",
]
