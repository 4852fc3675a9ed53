"""A real one-node Slurm for the tests of this folder (``tests/slurm/cluster.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import isolated
from tests.slurm.cluster import (
    SlurmCluster,
    ensure_routable_address,
    slurm_missing,
    start_cluster,
)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    why = slurm_missing() or ensure_routable_address(isolated())
    if why is not None:
        pytest.skip(why)
    cluster = start_cluster(Path(tmp_path_factory.mktemp("slurm")))
    try:
        yield cluster
    finally:
        cluster.stop()
