"""``examples/k8s/``: every manifest loads into the ``kubernetes`` client's models with no field
lost (an unknown or misspelt field would be dropped on the way in, and the round trip would
differ), and the worker Job is what docs/fleet.md says: Indexed, GPUs per pod, hostPID, the
store's URL from a Secret. No cluster exists here: these manifests were not run on one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client reads the manifests")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"
MODELS = {("v1", "Secret"): "V1Secret", ("v1", "Service"): "V1Service",
          ("apps/v1", "StatefulSet"): "V1StatefulSet", ("batch/v1", "Job"): "V1Job"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        out += [(path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize(("name", "doc"), documents(),
                         ids=[f"{n}:{d['kind']}" for n, d in documents()])
def test_every_manifest_is_a_valid_object_with_no_field_lost(name: str, doc: dict[str, Any]
                                                             ) -> None:
    client = kubernetes.client.ApiClient()
    model = MODELS[(doc["apiVersion"], doc["kind"])]
    obj = client.deserialize(json.dumps(doc), model, "application/json")
    back = _without_nulls(client.sanitize_for_serialization(obj))
    # Quantities and ports come back as the same values; compare as YAML would read them.
    assert json.loads(json.dumps(back)) == json.loads(json.dumps(doc)), name


def test_the_worker_job_is_indexed_with_gpus_host_pids_and_a_secret_store() -> None:
    job = next(doc for _, doc in documents() if doc["kind"] == "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"]
    pod = spec["template"]["spec"]
    assert pod["hostPID"] is True and pod["restartPolicy"] == "Never"
    worker = pod["containers"][0]
    assert worker["command"] == ["cleanslate", "worker"]
    gpus = worker["args"][worker["args"].index("--gpus") + 1].split(",")
    assert int(worker["resources"]["limits"]["nvidia.com/gpu"]) == len(gpus)
    store = next(e for e in worker["env"] if e["name"] == "CLEANSLATE_STORE")
    assert store["valueFrom"]["secretKeyRef"] == {"name": "cleanslate-store", "key": "url"}
    assert not any("postgresql://" in json.dumps(a) for a in worker["args"])
    shm = next(m for m in worker["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["volumes"] if v["name"] == shm["name"])
    assert volume["emptyDir"]["medium"] == "Memory"
