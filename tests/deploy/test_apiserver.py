"""`make deploy` / `make undeploy` and `rlfleet scale rollout` against a real Kubernetes
API server (kube-apiserver 1.20 + etcd on loopback; no nodes, so pods never run, but every
object is stored and validated server-side: Helm 4 applies server-side).

The one-time kube-apiserver build (scripts/k8s/build-k8s.sh, cached per machine)
may run inside the first of these tests; `make apiserver` runs it beforehand.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import BUILD_TIMEOUT_S, LOCAL, Cluster, _run, make_argv

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(BUILD_TIMEOUT_S)]

KINDS = (
    "deployment,statefulset,service,secret,configmap,persistentvolumeclaim,"
    "networkpolicy,serviceaccount,rayjob,servicemonitor,podmonitor,"
    "horizontalpodautoscaler,job"
)


def make(
    cluster: Cluster, *targets: str, check: bool = True, **variables: str
) -> subprocess.CompletedProcess[str]:
    return _run(make_argv(*targets, **variables), env=cluster.env, check=check, timeout=300)


def rlfleet(
    cluster: Cluster, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", *args],
        env=env or cluster.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def replicas(cluster: Cluster, name: str = "rlfleet-rollout", ns: str | None = None) -> int:
    return cluster.kubectl_json("get", "deployment", name, namespace=ns)["spec"]["replicas"]


def release_objects(cluster: Cluster, release: str, ns: str) -> set[str]:
    out = _run(
        [
            cluster.kubectl,
            "-n",
            ns,
            "get",
            KINDS,
            "-l",
            f"app.kubernetes.io/instance={release}",
            "-o",
            "name",
        ],
        env=cluster.env,
    )
    return set(out.stdout.split())


def test_make_deploy_scale_swap_undeploy(cluster: Cluster) -> None:
    ns = cluster.namespace  # the kube context's namespace: make deploy's default

    # --- install: the hyperpod profile (make's default VALUES)
    make(cluster, "deploy")
    objs = release_objects(cluster, "rlfleet", ns)
    for name in (
        "deployment.apps/rlfleet-rollout",
        "deployment.apps/rlfleet-reward-task",
        "deployment.apps/rlfleet-env-maze",
        "deployment.apps/rlfleet-ckptsync",
        "statefulset.apps/rlfleet-redis",
        "rayjob.ray.io/rlfleet-learner",
        "service/rlfleet-reward",
        "service/rlfleet-env",
        "servicemonitor.monitoring.coreos.com/rlfleet-rollout",
        "podmonitor.monitoring.coreos.com/rlfleet-learner",
        "persistentvolumeclaim/rlfleet-shared",
        "secret/rlfleet-auth",
        "secret/rlfleet-redis",
        "networkpolicy.networking.k8s.io/rlfleet-default-deny",
        "configmap/rlfleet-dashboard",
        "configmap/rlfleet-learner",
    ):
        assert name in objs, f"{name} missing after make deploy: {sorted(objs)}"
    assert "deployment.apps/rlfleet-reward-format-task" not in objs
    assert replicas(cluster) == 4
    secrets = {
        s: cluster.kubectl_json("get", "secret", s)["data"]
        for s in ("rlfleet-auth", "rlfleet-redis")
    }
    assert len(base64.b64decode(secrets["rlfleet-auth"]["token"])) >= 32
    job = cluster.kubectl_json("get", "rayjob", "rlfleet-learner")
    rollout_tpl = cluster.kubectl_json("get", "deployment", "rlfleet-rollout")["spec"]["template"]
    args = rollout_tpl["spec"]["containers"][0]["args"]
    assert args[args.index("--env-address") + 1] == "rlfleet-env:50051"
    assert args[args.index("--reward-address") + 1] == "rlfleet-reward:50051"
    env_dep = cluster.kubectl_json("get", "deployment", "rlfleet-env-maze")
    env_svc = cluster.kubectl_json("get", "service", "rlfleet-env")

    # --- rlfleet scale rollout (kubernetes client, the context's namespace)
    out = rlfleet(cluster, "scale", "rollout", "--replicas", "3")
    assert out.returncode == 0, out.stderr
    assert "4 -> 3 replicas" in out.stdout
    assert replicas(cluster) == 3

    # --- swap the reward service: helm upgrade with another selection
    make(cluster, "deploy", HELM_ARGS="--set reward.selected=format-task")
    svc = cluster.kubectl_json("get", "service", "rlfleet-reward")
    assert svc["spec"]["selector"]["rlfleet.io/reward"] == "format-task"
    fmt = cluster.kubectl_json("get", "deployment", "rlfleet-reward-format-task")
    assert fmt["spec"]["template"]["spec"]["containers"][0]["args"] == ["--reward", "format+task"]
    # The learner keeps running: its RayJob is not modified at all.
    job_after = cluster.kubectl_json("get", "rayjob", "rlfleet-learner")
    assert job_after["metadata"]["generation"] == job["metadata"]["generation"]
    assert job_after["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]
    assert job_after["spec"] == job["spec"]
    # The rollout keeps its pods (same template) and the count `rlfleet scale` set.
    dep = cluster.kubectl_json("get", "deployment", "rlfleet-rollout")
    assert dep["spec"]["template"] == rollout_tpl
    assert dep["spec"]["replicas"] == 3
    # Generated secrets survive upgrades (every pod keeps authenticating).
    for s, data in secrets.items():
        assert cluster.kubectl_json("get", "secret", s)["data"] == data

    # --- an upgrade that scales the rollout through values
    make(cluster, "deploy", HELM_ARGS="--set reward.selected=format-task --set rollout.replicas=6")
    assert replicas(cluster) == 6
    assert (
        cluster.kubectl_json("get", "service", "rlfleet-reward")["spec"]["selector"][
            "rlfleet.io/reward"
        ]
        == "format-task"
    )

    # --- swap in a reward service written outside rlfleet, in an image of its own
    make(cluster, "deploy", HELM_ARGS="--set reward.selected=path-efficiency "
                                      "--set rollout.replicas=6")
    svc = cluster.kubectl_json("get", "service", "rlfleet-reward")
    assert svc["spec"]["selector"]["rlfleet.io/reward"] == "path-efficiency"
    pe = cluster.kubectl_json("get", "deployment", "rlfleet-reward-path-efficiency")
    c = pe["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "path-efficiency-reward:1.0.0"
    assert c["command"][0] == "path-efficiency-reward"
    # The env is never touched by reward swaps: same Deployment, same Service.
    env_after = cluster.kubectl_json("get", "deployment", "rlfleet-env-maze")
    assert env_after["metadata"]["generation"] == env_dep["metadata"]["generation"]
    assert env_after["spec"] == env_dep["spec"]
    assert cluster.kubectl_json("get", "service", "rlfleet-env")["spec"]["selector"] == \
        env_svc["spec"]["selector"]
    assert cluster.kubectl_json("get", "rayjob", "rlfleet-learner")["spec"] == job["spec"]

    history = _run([cluster.helm, "history", "rlfleet", "-n", ns, "-o", "json"], env=cluster.env)
    assert history.stdout.count('"status":"deployed"') == 1
    assert history.stdout.count('"revision":') == 4  # install, swap, scale, swap

    # --- uninstall: everything goes but the /shared claim (helm.sh/resource-policy: keep)
    make(cluster, "undeploy")
    left = release_objects(cluster, "rlfleet", ns)
    assert left == {"persistentvolumeclaim/rlfleet-shared"}, sorted(left)
    _run([cluster.kubectl, "-n", ns, "delete", "pvc", "rlfleet-shared"], env=cluster.env)


def test_local_profile_installs_and_uninstalls_cleanly(cluster: Cluster) -> None:
    ns = "rlfleet-local"
    make(
        cluster,
        "deploy",
        VALUES=str(LOCAL.relative_to(LOCAL.parents[3])),
        RELEASE="tiny",
        NAMESPACE=ns,
    )
    objs = release_objects(cluster, "tiny", ns)
    # No KubeRay operator in the local profile: the learner is a plain Job, /shared a
    # directory of the node (no claim).
    assert "job.batch/tiny-rlfleet-learner" in objs
    assert not any(o.startswith("rayjob") for o in objs)
    assert not any(o.startswith("persistentvolumeclaim") for o in objs)
    assert not any("servicemonitor" in o for o in objs)
    assert replicas(cluster, "tiny-rlfleet-rollout", ns) == 1
    out = rlfleet(
        cluster, "scale", "rollout", "--replicas", "2", "--release", "tiny", "--namespace", ns
    )
    assert out.returncode == 0, out.stderr
    assert replicas(cluster, "tiny-rlfleet-rollout", ns) == 2
    make(cluster, "undeploy", RELEASE="tiny", NAMESPACE=ns)
    assert release_objects(cluster, "tiny", ns) == set()


def test_server_side_validation_rejects_what_the_schema_lets_through(cluster: Cluster) -> None:
    ns = "rlfleet-bad"
    out = make(
        cluster,
        "deploy",
        RELEASE="bad",
        NAMESPACE=ns,
        check=False,
        HELM_ARGS="--set podSecurityContext.runAsUser=nobody",
    )
    assert out.returncode != 0
    assert "runAsUser" in out.stdout + out.stderr
    make(cluster, "undeploy", RELEASE="bad", NAMESPACE=ns, check=False)


def test_autoscaled_rollout_uses_the_servers_hpa_api_and_refuses_manual_scale(
    cluster: Cluster,
) -> None:
    ns = "rlfleet-hpa"
    make(
        cluster,
        "deploy",
        RELEASE="auto",
        NAMESPACE=ns,
        HELM_ARGS="--set rollout.autoscaling.enabled=true",
    )
    # A 1.20 server has no autoscaling/v2: the chart picked v2beta2 from its discovery.
    raw = _run(
        [
            cluster.kubectl,
            "get",
            "--raw",
            "/apis/autoscaling/v2beta2/namespaces/"
            f"{ns}/horizontalpodautoscalers/auto-rlfleet-rollout",
        ],
        env=cluster.env,
    )
    hpa = json.loads(raw.stdout)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "rlfleet_rollout_active_episodes"
    out = rlfleet(
        cluster, "scale", "rollout", "--replicas", "3", "--release", "auto", "--namespace", ns
    )
    assert out.returncode == 1
    assert "HorizontalPodAutoscaler 'auto-rlfleet-rollout'" in out.stderr
    make(cluster, "undeploy", RELEASE="auto", NAMESPACE=ns)


def test_scale_says_when_the_release_is_unknown(cluster: Cluster) -> None:
    out = rlfleet(cluster, "scale", "rollout", "--replicas", "2", "--release", "nope")
    assert out.returncode == 1
    assert f"no rlfleet release 'nope' in namespace '{cluster.namespace}'" in out.stderr


def test_scale_says_when_there_is_no_cluster(cluster: Cluster, tmp_path: Path) -> None:
    env = {k: v for k, v in cluster.env.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "none")
    env["HOME"] = str(tmp_path)
    out = rlfleet(cluster, "scale", "rollout", "--replicas", "2", env=env)
    assert out.returncode == 1
    assert "no Kubernetes cluster configured" in out.stderr

    dead = tmp_path / "dead-kubeconfig"
    text = cluster.kubeconfig.read_text()
    server = next(
        line.split("server:")[1].strip() for line in text.splitlines() if "server:" in line
    )
    dead.write_text(text.replace(server, "https://127.0.0.1:1"))
    env["KUBECONFIG"] = str(dead)
    out = rlfleet(cluster, "scale", "rollout", "--replicas", "2", env=env)
    assert out.returncode == 1
    assert "cannot reach the Kubernetes API server at https://127.0.0.1:1" in out.stderr


def test_scale_rejects_negative_replicas(cluster: Cluster) -> None:
    out = rlfleet(cluster, "scale", "rollout", "--replicas", "-1")
    assert out.returncode == 2
    assert "must be 0 or more" in out.stderr
