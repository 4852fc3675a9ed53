"""``examples/k8s/`` checked by Kubernetes' own tools and against ``cleanslate worker``.

- ``kubernetes-validate --strict`` passes every object at the oldest and newest Kubernetes
  version checked (:data:`k8s_tools.VERSIONS`), and kubectl 1.37's client-side dry run
  accepts every object as the file has it (``tests/cluster/k8s_tools.py``, CI's step).
- Every manifest loads into the ``kubernetes`` client's models with no field lost.
- The Indexed Job for N workers: each completion index is one slot of its own, the worker's
  arguments are what ``cleanslate worker``'s own parser accepts, and the store's URL and every
  password come from a Secret of the folder, never from a workload's manifest.

No cluster exists here: these manifests were not run on one.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from cleanslate.cli import build_app
from cleanslate.cli._common import parse_gpus
from cleanslate.store import STORE_ENV
from cleanslate.tune.study import Slot
from tests.cluster import k8s_tools
from tests.cluster.k8s_tools import MANIFESTS, ROOT, documents

#: Every object of the folder with the file it is in.
OBJECTS = [(manifest.name, doc) for manifest in MANIFESTS for doc in documents(manifest)]
OBJECT_IDS = [f"{name}:{doc['kind']}" for name, doc in OBJECTS]
WORKLOADS = ("Job", "StatefulSet")
#: An env var whose name says it holds a secret.
SECRET_NAME = re.compile(r"PASSWORD|TOKEN|SECRET|CREDENTIAL|(^|_)KEY($|_)|STORE")
#: A URL with a password in it (``scheme://user:password@host``).
URL_WITH_PASSWORD = re.compile(r"\w+://[^/\s:@]+:[^/\s@]+@")


def _only(kind: str) -> dict[str, Any]:
    (doc,) = (doc for _, doc in OBJECTS if doc["kind"] == kind)
    return doc


def _secrets() -> dict[tuple[str, str], dict[str, str]]:
    """``{(namespace, name): {key: value}}`` of the folder's Secrets."""
    return {(doc["metadata"]["namespace"], doc["metadata"]["name"]): doc["stringData"]
            for _, doc in OBJECTS if doc["kind"] == "Secret"}


def _containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    pod = doc["spec"]["template"]["spec"]
    return [*pod.get("initContainers", []), *pod["containers"]]


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


# -- Kubernetes' own tools ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def validate() -> None:
    why = k8s_tools.missing_validate()
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path, why = k8s_tools.kubectl()
    if path is None:
        pytest.skip(why)
    return k8s_tools.offline_kubectl(path, tmp_path_factory.mktemp("kubectl"))


def test_the_versions_checked_are_1_29_and_the_newest_the_validator_ships(validate: None
                                                                         ) -> None:
    from kubernetes_validate import utils

    oldest, newest = k8s_tools.VERSIONS
    assert oldest == "1.29.0" and oldest in utils.all_versions()
    assert newest == utils.latest_version()


def test_kubernetes_validate_strict_passes_every_object_at_both_versions(validate: None) -> None:
    result = k8s_tools.kubernetes_validate()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == k8s_tools.validate_lines()
    assert len(result.stdout.splitlines()) == len(OBJECTS) * len(k8s_tools.VERSIONS)


def test_kubernetes_validate_strict_refuses_a_misspelt_field_and_the_check_a_kind_it_lacks(
        validate: None, tmp_path: Path) -> None:
    job = (ROOT / "examples/k8s/workers-job.yaml").read_text()
    (tmp_path / "field.yaml").write_text(job.replace("hostPID:", "hostPid:"))
    (tmp_path / "kind.yaml").write_text(job.replace("kind: Job", "kind: Jobs"))
    field = k8s_tools.kubernetes_validate((tmp_path / "field.yaml",))
    assert field.returncode == 1
    assert "Additional properties are not allowed ('hostPid' was unexpected)" in field.stdout
    # no schema for a kind: a WARN line and exit 0, which the lines compared catch
    kind = k8s_tools.kubernetes_validate((tmp_path / "kind.yaml",))
    assert kind.returncode == 0 and kind.stdout.startswith("WARN ")
    assert kind.stdout.splitlines() != k8s_tools.validate_lines((tmp_path / "kind.yaml",))


def _json_documents(text: str) -> list[Any]:
    """The JSON documents of ``text``, one after the other (kubectl's ``-o json`` of a file
    with several objects)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        obj, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        out.append(obj)
    return out


@pytest.mark.parametrize("manifest", MANIFESTS, ids=[m.name for m in MANIFESTS])
def test_kubectl_dry_run_creates_every_object_as_the_file_has_it(kubectl: list[str],
                                                                manifest: Path) -> None:
    said = k8s_tools.dry_run(kubectl, manifest)
    assert said.returncode == 0, said.stderr
    assert said.stdout.splitlines() == k8s_tools.dry_run_lines(manifest)
    shown = k8s_tools.dry_run(kubectl, manifest, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    assert _json_documents(shown.stdout) == documents(manifest)


def test_kubectl_dry_run_refuses_a_kind_no_api_server_serves(kubectl: list[str],
                                                            tmp_path: Path) -> None:
    job = (ROOT / "examples/k8s/workers-job.yaml").read_text()
    (tmp_path / "kind.yaml").write_text(job.replace("kind: Job", "kind: Jobs"))
    said = k8s_tools.dry_run(kubectl, tmp_path / "kind.yaml")
    assert said.returncode == 1 and "unable to recognize" in said.stderr


def test_the_ci_step_prints_both_tools_lines_over_every_manifest(validate: None,
                                                                kubectl: list[str]) -> None:
    step = subprocess.run([sys.executable, "tests/cluster/k8s_tools.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert step.returncode == 0, step.stdout + step.stderr
    lines = step.stdout.splitlines()
    assert set(k8s_tools.validate_lines()) <= set(lines)
    assert {f"{m}: {line}" for m in MANIFESTS for line in k8s_tools.dry_run_lines(m)} <= \
        set(lines)


# -- the kubernetes client's models ------------------------------------------------------------


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize(("name", "doc"), OBJECTS, ids=OBJECT_IDS)
def test_every_manifest_is_a_valid_object_with_no_field_lost(name: str, doc: dict[str, Any]
                                                             ) -> None:
    kubernetes = pytest.importorskip("kubernetes",
                                     reason="the kubernetes client reads the manifests")
    client = kubernetes.client.ApiClient()
    model = "V1" + doc["kind"]
    obj = client.deserialize(json.dumps(doc), model, "application/json")
    back = _without_nulls(client.sanitize_for_serialization(obj))
    # Quantities and ports come back as the same values; compare as YAML would read them.
    assert json.loads(json.dumps(back)) == json.loads(json.dumps(doc)), name


# -- the Indexed Job against `cleanslate worker` -----------------------------------------------


def _pod_environment(container: dict[str, Any], index: int) -> dict[str, str]:
    """The container's environment as the kubelet makes it for completion ``index``: the Job
    controller's ``JOB_COMPLETION_INDEX``, literal values, and keys of the folder's Secrets."""
    env = {"JOB_COMPLETION_INDEX": str(index)}
    secrets = _secrets()
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[("cleanslate", ref["name"])][ref["key"]]
    return env


def _run_command(container: dict[str, Any], env: dict[str, str], bin_dir: Path
                 ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """The container's command run by the real shell with ``cleanslate`` on ``PATH`` a stand-in
    that writes down its arguments and its store variable (what ``exec`` handed it)."""
    record = bin_dir / "record.json"
    record.unlink(missing_ok=True)
    stub = bin_dir / "cleanslate"
    stub.write_text(f"#!{sys.executable} -I\nimport json, os, sys\n"
                    f"json.dump({{'argv': sys.argv[1:], 'store': os.environ.get({STORE_ENV!r})}},"
                    f" open({str(record)!r}, 'w'))\n")
    stub.chmod(0o755)
    done = subprocess.run([*container["command"], *container["args"]],
                          env={**env, "PATH": str(bin_dir)}, capture_output=True, text=True,
                          timeout=30, check=False)
    return done, json.loads(record.read_text()) if record.exists() else None


def _worker_params(argv: list[str]) -> dict[str, Any]:
    """What ``cleanslate worker`` makes of ``argv`` (the words after ``cleanslate``): parsed and
    checked by the command's own typer app, option callbacks included, and not run."""
    root = typer.main.get_command(build_app("worker"))
    assert isinstance(root, typer.core.TyperGroup)
    parent = typer.Context(root, info_name="cleanslate")
    command = root.get_command(parent, argv[0])
    assert command is not None and argv[0] == "worker", argv
    with command.make_context(argv[0], argv[1:], parent=parent) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("workers", [1, 4, 16])
def test_each_completion_index_is_one_slot_of_its_own_with_arguments_the_worker_accepts(
        workers: int, tmp_path: Path) -> None:
    job = copy.deepcopy(_only("Job"))
    job["spec"].update(parallelism=workers, completions=workers)
    assert job["spec"]["completionMode"] == "Indexed"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    gpus_given = int(container["resources"]["limits"]["nvidia.com/gpu"])
    slots = []
    for index in range(job["spec"]["completions"]):
        env = _pod_environment(container, index)
        done, seen = _run_command(container, env, tmp_path)
        assert done.returncode == 0 and seen is not None, done.stderr
        params = _worker_params(seen["argv"])
        assert params["study"] == "glm5-nvfp4" and params["gpu_backend"] == "nvml"
        assert params["store_url"] is None and seen["store"] == env[STORE_ENV]
        gpus = parse_gpus(params["gpus"])
        assert gpus is not None and len(gpus) == gpus_given  # the device plugin's, as 0..n-1
        slots.append(Slot(host=params["host"], gpus=tuple(gpus), port=params["port"]))
    assert [slot.port for slot in slots] == [30000 + i for i in range(workers)]
    assert {slot.host for slot in slots} == {"local"}
    assert len({slot.key for slot in slots}) == workers


def test_the_worker_refuses_the_port_of_an_index_past_65535(tmp_path: Path) -> None:
    # The most completions the Job may have is 35,536 (ports 30000 to 65535).
    (container,) = _only("Job")["spec"]["template"]["spec"]["containers"]
    last, past = (_run_command(container, _pod_environment(container, index), tmp_path)[1]
                  for index in (35535, 35536))
    assert last is not None and past is not None
    assert _worker_params(last["argv"])["port"] == 65535
    with pytest.raises(typer.BadParameter, match="65535"):
        _worker_params(past["argv"])


def test_a_pod_without_a_completion_index_starts_no_worker(tmp_path: Path) -> None:
    (container,) = _only("Job")["spec"]["template"]["spec"]["containers"]
    env = _pod_environment(container, 0)
    del env["JOB_COMPLETION_INDEX"]
    done, seen = _run_command(container, env, tmp_path)
    assert done.returncode != 0 and seen is None
    assert "JOB_COMPLETION_INDEX" in done.stderr


def test_kubernetes_substitutes_no_variable_in_the_worker_command() -> None:
    # Kubernetes replaces $(NAME) in command and args with the container's variable NAME; the
    # shell's arithmetic $((...)) names none and reaches the shell as written.
    (container,) = _only("Job")["spec"]["template"]["spec"]["containers"]
    for word in [*container["command"], *container["args"]]:
        assert re.findall(r"\$\([^(]", word) == [], word


def test_the_store_url_and_every_password_come_from_a_secret_of_the_folder() -> None:
    secrets = _secrets()
    (worker,) = _only("Job")["spec"]["template"]["spec"]["containers"]
    store = next(var for var in worker["env"] if var["name"] == STORE_ENV)
    assert store["valueFrom"]["secretKeyRef"] == {"name": "cleanslate-store", "key": "url"}
    for _, doc in OBJECTS:
        if doc["kind"] == "Secret":
            continue
        assert not [s for s in _strings(doc) if URL_WITH_PASSWORD.search(s)], doc["kind"]
        if doc["kind"] not in WORKLOADS:
            continue
        for container in _containers(doc):
            assert "envFrom" not in container or all(
                (doc["metadata"]["namespace"], source["secretRef"]["name"]) in secrets
                for source in container["envFrom"])
            for var in container.get("env", []):
                if "value" in var:
                    assert not SECRET_NAME.search(var["name"]), (doc["kind"], var)
                    continue
                ref = var["valueFrom"]["secretKeyRef"]
                assert ref["key"] in secrets[(doc["metadata"]["namespace"], ref["name"])], ref


def test_the_objects_refer_to_each_other_and_the_placeholders_agree() -> None:
    namespaces = {doc["metadata"]["name"] for _, doc in OBJECTS if doc["kind"] == "Namespace"}
    assert {doc["metadata"]["namespace"] for _, doc in OBJECTS
            if doc["kind"] != "Namespace"} == namespaces
    # `kubectl apply -f examples/k8s/` reads the files in name order: the namespace first
    assert next(doc["kind"] for _, doc in OBJECTS) == "Namespace"
    service, database = _only("Service"), _only("StatefulSet")
    assert database["spec"]["serviceName"] == service["metadata"]["name"]
    labels = database["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    (postgres,) = _containers(database)
    env = {var["name"]: var.get("value") for var in postgres["env"]}
    url = urlsplit(_secrets()[("cleanslate", "cleanslate-store")]["url"])
    assert (url.username, url.hostname, url.port, url.path) == (
        env["POSTGRES_USER"], service["metadata"]["name"], service["spec"]["ports"][0]["port"],
        f"/{env['POSTGRES_DB']}")
    assert url.password == _secrets()[("cleanslate", "cleanslate-postgres")]["password"]


def test_the_worker_pods_see_the_host_pids_and_have_shared_memory() -> None:
    pod = _only("Job")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and pod["restartPolicy"] == "Never"
    (worker,) = pod["containers"]
    shm = next(m for m in worker["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volume = next(v for v in pod["volumes"] if v["name"] == shm["name"])
    assert volume["emptyDir"]["medium"] == "Memory"


def test_docs_fleet_md_shows_the_job_as_the_manifest_has_it() -> None:
    text = (ROOT / "docs" / "fleet.md").read_text()
    kubernetes = text[text.index("## On Kubernetes"):]
    block = kubernetes[kubernetes.index("```yaml\n") + len("```yaml\n"):]
    assert yaml.safe_load(block[:block.index("```")]) == _only("Job")

