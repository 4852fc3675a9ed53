"""The ``/dev/shm`` names the real engines create match their adapters' globs (issue 23,
Build 8: SGLang's multimodal segments ``sgl_shm_mm_*`` matched none and were never reported).

Each name below is built the way the engine's own source builds it (docs/engines.md, "What
the engines leave in /dev/shm", cites the files).
"""

from __future__ import annotations

import fnmatch
import uuid

import pytest

from cleanslate.engines import engine_class, shm_patterns

#: (engine, a name it creates)
NAMES = [
    # sglang/srt/utils/stale_shm_cleanup.py make_shm_name: sgl_shm_<kind>_<pid>_<8 hex>
    ("sglang", "sgl_shm_mm_31337_deadbeef"),
    ("sglang", "sgl_shm_mq_31337_0badf00d"),
    ("sglang", "sgl_shm_xputensor_31337_c0ffee00"),
    # the multi-tokenizer mode's arguments: multi_tokenizer_args_<main pid>
    ("sglang", "multi_tokenizer_args_31337"),
    # managers/load_snapshot.py: sglang_loads_<ipc name>_<blake2s 4 bytes>.shm
    ("sglang", "sglang_loads_default_1a2b3c4d.shm"),
    # Python's SharedMemory() without a name (shm_broadcast's queues, the tensor arena)
    ("sglang", "psm_5f3a9c1e"),
    ("vllm", "psm_5f3a9c1e"),
    # the multimodal processor cache in shm mode (VLLM_OBJECT_STORAGE_SHM_BUFFER_NAME)
    ("vllm", "VLLM_OBJECT_STORAGE_SHM_BUFFER"),
    ("vllm", f"VLLM_OBJECT_STORAGE_SHM_BUFFER_{uuid.UUID(int=7).hex}"),
    # the CPU backend's shared-memory collectives: <ident>-<group>-[<ranks>]-cpushm_<rank>
    ("vllm", "a1b2c3-tp-[0-1]-cpushm_0"),
]


def _matches(name: str, globs: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


@pytest.mark.parametrize(("engine", "name"), NAMES)
def test_an_engine_leftover_matches_its_globs_and_the_probe_patterns(engine: str,
                                                                     name: str) -> None:
    assert _matches(name, engine_class(engine).leftovers.shm_globs)
    assert _matches(name, shm_patterns())


@pytest.mark.parametrize("name", ["sgl", "sglfoo", "VLLM-NOTES", "pulse-shm-1",
                                  "cpushm", "VLLM_OTHER"])
def test_other_names_are_not_leftovers(name: str) -> None:
    assert not _matches(name, shm_patterns())
