"""The Helm chart with a real helm binary: lint, render both profiles, validate every
rendered object offline (strict Kubernetes 1.33 schemas + this repo's CRD schemas), and
check what the chart promises (probes, GPUs, secrets, labels, swap, dashboard)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlfleet.kube.manifests import Validator

from .conftest import CHART, CRDS, HYPERPOD, LOCAL, ROOT, Rendered

pytestmark = pytest.mark.deploy

PROFILES = {"hyperpod": HYPERPOD, "local": LOCAL, "defaults": None}
RECOMMENDED = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
)


@pytest.fixture(scope="module")
def validator() -> Validator:
    return Validator("1.33.0", CRDS)


def pod_specs(r: Rendered) -> list[tuple[str, dict[str, Any]]]:
    """(owner, pod template) of every workload, RayJob groups and submitter included."""
    out = []
    for o in r.objects:
        name = f"{o['kind']}/{o['metadata']['name']}"
        if o["kind"] in ("Deployment", "StatefulSet"):
            out.append((name, o["spec"]["template"]))
        elif o["kind"] == "RayJob":
            spec = o["spec"]
            out.append((name + "#head", spec["rayClusterSpec"]["headGroupSpec"]["template"]))
            for g in spec["rayClusterSpec"].get("workerGroupSpecs", []):
                out.append((name + "#" + g["groupName"], g["template"]))
            if "submitterPodTemplate" in spec:
                out.append((name + "#submitter", spec["submitterPodTemplate"]))
    return out


def container(template: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    cs = template["spec"]["containers"]
    return cs[0] if name is None else next(c for c in cs if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in c.get("env", [])}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_lint_strict(helm: str, profile: str) -> None:
    argv = [helm, "lint", "--strict", str(CHART)]
    if PROFILES[profile]:
        argv += ["-f", str(PROFILES[profile])]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_rendered_object_validates_offline(
    render, validator: Validator, profile: str
) -> None:
    r = render(PROFILES[profile])
    assert r.objects
    problems = validator.validate_all(r.objects)
    assert not problems, "\n".join(map(str, problems))


def test_hyperpod_renders_the_whole_fleet(render) -> None:
    r = render(HYPERPOD)
    kinds = {o["kind"] for o in r.objects}
    assert {
        "Deployment",
        "Service",
        "StatefulSet",
        "Secret",
        "PersistentVolumeClaim",
        "ConfigMap",
        "RayJob",
        "ServiceMonitor",
        "PodMonitor",
        "NetworkPolicy",
        "ServiceAccount",
    } <= kinds
    deployments = {o["metadata"]["name"] for o in r.of_kind("Deployment")}
    assert deployments == {"rlfleet-env-maze", "rlfleet-reward-task", "rlfleet-rollout",
                           "rlfleet-ckptsync"}
    assert {o["metadata"]["name"] for o in r.of_kind("ServiceMonitor")} == {
        "rlfleet-env",
        "rlfleet-reward",
        "rlfleet-rollout",
        "rlfleet-ckptsync",
    }


def test_no_unknown_kind_escapes_validation(validator: Validator) -> None:
    bogus = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    problems = validator.validate(bogus)
    assert problems and "unknown kind Widget" in problems[0].message


def test_validator_rejects_unknown_fields_in_custom_resources(render, validator: Validator) -> None:
    r = render(HYPERPOD)
    job = json.loads(json.dumps(r.get("RayJob", "rlfleet-learner")))
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0][
        "resourcez"
    ] = {}
    job["spec"]["entrypointz"] = "x"
    msgs = " | ".join(p.message for p in validator.validate(job))
    assert "resourcez" in msgs and "entrypointz" in msgs


def test_crd_schemas_are_generated_from_gen_crds() -> None:
    sys.path.insert(0, str(ROOT / "deploy" / "schemas"))
    try:
        import gen_crds  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    for name, text in gen_crds.render().items():
        assert (CRDS / name).read_text() == text, f"{name} is stale: run deploy/schemas/gen_crds.py"


def test_hpa_on_active_episodes_validates(render, validator: Validator) -> None:
    r = render(HYPERPOD, "rollout.autoscaling.enabled=true")
    (hpa,) = r.of_kind("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == "rlfleet_rollout_active_episodes"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "rlfleet-rollout"
    assert not validator.validate(hpa)
    # With the HPA on, the Deployment starts at minReplicas.
    assert r.get("Deployment", "rlfleet-rollout")["spec"]["replicas"] == 2


@pytest.mark.parametrize("profile", ["hyperpod", "local"])
def test_labels_security_resources_and_shared_volume(render, profile: str) -> None:
    r = render(PROFILES[profile])
    for o in r.objects:
        labels = o["metadata"].get("labels", {})
        missing = [k for k in RECOMMENDED if k not in labels]
        assert not missing, f"{o['kind']}/{o['metadata']['name']} lacks labels {missing}"
    for owner, tpl in pod_specs(r):
        spec = tpl["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, owner
        assert spec["securityContext"]["runAsUser"] != 0, owner
        # Only the release's Prometheus talks to the Kubernetes API (its discovery lists
        # the namespace's pods, through an account of its own with a Role for just that).
        prometheus = owner == "Deployment/rlfleet-prometheus"
        assert spec.get("automountServiceAccountToken") is prometheus, owner
        if prometheus:
            assert spec["serviceAccountName"] == "rlfleet-prometheus"
            role = r.get("Role", "rlfleet-prometheus")
            assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                                      "verbs": ["get", "list", "watch"]}]
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, owner
            assert sc["capabilities"]["drop"] == ["ALL"], owner
            assert c["resources"].get("requests") and c["resources"].get("limits"), owner
            for p in c.get("ports", []):
                assert p["protocol"] == "TCP", (owner, p)  # server-side apply on 1.20
        if "redis" not in owner and "submitter" not in owner and not prometheus:
            mounts = {
                m["mountPath"]: m["name"]
                for c in spec["containers"]
                for m in c.get("volumeMounts", [])
            }
            assert mounts.get("/shared") == "shared", owner
            shared = next(v for v in spec["volumes"] if v["name"] == "shared")
            if profile == "local":  # a directory of the node (single-node clusters)
                assert shared["hostPath"]["path"] == "/var/lib/rlfleet/shared", owner
            else:
                assert shared["persistentVolumeClaim"]["claimName"] == "rlfleet-shared"
    for svc in r.of_kind("Service"):
        for p in svc["spec"]["ports"]:
            assert p["protocol"] == "TCP", svc["metadata"]["name"]


def test_shared_claim_is_rwx_on_fsx(render) -> None:
    pvc = render(HYPERPOD).get("PersistentVolumeClaim", "rlfleet-shared")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == "fsx-sc"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    r = render(HYPERPOD, "shared.existingClaim=my-fsx")
    assert not r.of_kind("PersistentVolumeClaim")
    for _, tpl in pod_specs(r):
        vols = {v["name"]: v for v in tpl["spec"].get("volumes", [])}
        if "shared" in vols:
            assert vols["shared"]["persistentVolumeClaim"]["claimName"] == "my-fsx"


def test_every_service_gets_redis_password_and_auth_token_from_secrets(render) -> None:
    r = render(HYPERPOD)
    for owner, tpl in pod_specs(r):
        if "submitter" in owner:
            continue
        env = env_of(container(tpl))
        if "redis" not in owner:
            assert env["RLFLEET_HOST"]["value"] == "0.0.0.0", owner
        ref = env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "rlfleet-redis", "key": "password"}, owner
        if "redis" not in owner:
            ref = env["RLFLEET_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]
            assert ref == {"name": "rlfleet-auth", "key": "token"}, owner
    for name in ("rlfleet-redis", "rlfleet-auth"):
        assert r.get("Secret", name)["data"]
    # Existing secrets: none generated, references follow (the TLS secrets are the
    # chart's own, one CA per release).
    r = render(HYPERPOD, "redis.auth.existingSecret=my-redis", "auth.existingSecret=my-auth")
    assert not [s for s in r.of_kind("Secret")
                if not s["metadata"]["name"].startswith("rlfleet-tls-")]
    env = env_of(container(r.get("Deployment", "rlfleet-rollout")["spec"]["template"]))
    assert env["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "my-redis"
    assert env["RLFLEET_AUTH_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "my-auth"


def test_redis_password_never_on_a_command_line(render) -> None:
    sts = render(HYPERPOD).get("StatefulSet", "rlfleet-redis")
    c = container(sts["spec"]["template"])
    assert "requirepass" not in " ".join(c["command"])
    assert "$REDIS_PASSWORD" not in " ".join(c["command"])
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"]
    local = render(LOCAL).get("StatefulSet", "rlfleet-redis")
    assert "volumeClaimTemplates" not in local["spec"]


def test_rollout_is_ready_only_when_its_adapter_is_loaded(render) -> None:
    dep = render(HYPERPOD).get("Deployment", "rlfleet-rollout")
    c = container(dep["spec"]["template"])
    # over mTLS with the pod's own certificate, checking the name its Service gives it
    assert c["readinessProbe"]["exec"]["command"] == [
        "rlfleet", "health", "127.0.0.1:50052", "--tls-server-name", "rlfleet-rollout"]
    # Liveness must not restart a replica that is only loading its adapter.
    assert "exec" not in c["livenessProbe"]
    assert c["command"] == ["rlfleet", "rollout", "serve"]
    args = c["args"]
    assert args[args.index("--port") + 1] == "50052"
    assert args[args.index("--metrics-port") + 1] == "9102"
    assert args[args.index("--env-address") + 1] == "rlfleet-env:50051"
    assert args[args.index("--reward-address") + 1] == "rlfleet-reward:50051"
    assert args[args.index("--engine") + 1] == "vllm"


def test_local_rollout_runs_one_torch_thread_and_hyperpod_leaves_it_to_torch(render) -> None:
    """Two CPU replicas beside the learner on a 2-core node: a torch thread per core each
    slowed every GRPO step ~5x (the in-cluster test, before rollout.torchThreads)."""
    def args(values: Path) -> list[str]:
        dep = render(values).get("Deployment", "rlfleet-rollout")
        return container(dep["spec"]["template"])["args"]

    local = args(LOCAL)
    assert local[local.index("--torch-threads") + 1] == "1"
    assert "--torch-threads" not in args(HYPERPOD)


def test_rollout_and_learner_placement_on_hyperpod(render) -> None:
    r = render(HYPERPOD)
    dep = r.get("Deployment", "rlfleet-rollout")
    spec = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 4
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "ml.g7e.12xlarge"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    res = container(dep["spec"]["template"])["resources"]
    assert res["limits"]["nvidia.com/gpu"] == "1" and res["requests"]["nvidia.com/gpu"] == "1"

    job = r.get("RayJob", "rlfleet-learner")
    assert job["apiVersion"] == "ray.io/v1"
    # every start (first, retry, redeploy) continues the run; failures are retried
    assert job["spec"]["entrypoint"] == ("rlfleet learner run --config "
                                         "/etc/rlfleet/learner.yaml --resume auto")
    assert job["spec"]["backoffLimit"] >= 1
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"node.kubernetes.io/instance-type": "ml.r5d.16xlarge"}
    assert "nvidia.com/gpu" not in json.dumps(head)
    (workers,) = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    wspec = workers["template"]["spec"]
    assert wspec["nodeSelector"] == {"node.kubernetes.io/instance-type": "ml.g7e.12xlarge"}
    assert container(workers["template"])["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert any(t["key"] == "nvidia.com/gpu" for t in wspec["tolerations"])
    # 4 rollout GPUs + 2 learner GPUs = the 6 GPUs of 3× ml.g7e.12xlarge.
    assert dep["spec"]["replicas"] * 1 + workers["replicas"] * 1 == 6
    mounts = {m["mountPath"] for m in container(workers["template"])["volumeMounts"]}
    assert "/etc/rlfleet" in mounts


def test_the_learners_console_is_chosen_in_values(render) -> None:
    def consoles(r) -> set[str]:  # noqa: ANN001 - a Rendered
        ray_pods = [t for name, t in pod_specs(r) if "learner" in name
                    and not name.endswith("#submitter")]
        ray_pods += [o["spec"]["template"] for o in r.objects
                     if o["kind"] == "Deployment" and "ray-" in o["metadata"]["name"]]
        assert ray_pods
        return {env_of(container(t))["RLFLEET_CONSOLE"]["value"] for t in ray_pods}

    # JSON lines for log tooling unless asked; the local profile's person reads lines
    assert consoles(render(HYPERPOD)) == {"json"}
    assert consoles(render(HYPERPOD, extra=["--set", "learner.console=human"])) == {"human"}
    assert consoles(render(LOCAL)) == {"human"}


def test_learner_config_comes_from_values_or_a_file(render, helm: str, tmp_path: Path) -> None:
    cm = render(HYPERPOD).get("ConfigMap", "rlfleet-learner")
    # The recipe only: the run name and model path come from the pod's environment.
    assert "profile: qwen3-vl-8b" in cm["data"]["learner.yaml"]
    cfg = tmp_path / "learner.yaml"
    cfg.write_text("run: from-file\nlora_rank: 32\n")
    r = render(HYPERPOD, extra=["--set-file", f"learner.configFile={cfg}"])
    assert (
        r.get("ConfigMap", "rlfleet-learner")["data"]["learner.yaml"].strip()
        == cfg.read_text().strip()
    )


def test_reward_swap_changes_only_the_stable_service(render) -> None:
    a = render(HYPERPOD)
    b = render(HYPERPOD, "reward.selected=format-task")
    assert a.get("Service", "rlfleet-reward")["spec"]["selector"]["rlfleet.io/reward"] == "task"
    assert (
        b.get("Service", "rlfleet-reward")["spec"]["selector"]["rlfleet.io/reward"] == "format-task"
    )
    dep = b.get("Deployment", "rlfleet-reward-format-task")
    c = container(dep["spec"]["template"])
    assert c["args"] == ["--reward", "format+task"]
    assert c["command"][:5] == ["rlfleet", "env", "serve", "--role", "reward"]
    # The learner, the rollout replicas and the env are untouched by the swap (secrets
    # aside, which are random per `helm template` and kept live by lookup on upgrade).
    for kind, name in [
        ("RayJob", "rlfleet-learner"),
        ("Deployment", "rlfleet-rollout"),
        ("ConfigMap", "rlfleet-learner"),
        ("Deployment", "rlfleet-ckptsync"),
        ("Deployment", "rlfleet-env-maze"),
        ("Service", "rlfleet-env"),
    ]:
        assert a.get(kind, name) == b.get(kind, name), f"{kind}/{name} changed on a reward swap"
    for _, tpl in pod_specs(a):
        env = env_of(container(tpl))
        if "RLFLEET_ENV_ADDRESS" in env:
            assert env["RLFLEET_ENV_ADDRESS"]["value"] == "rlfleet-env:50051"
            assert env["RLFLEET_REWARD_ADDRESS"]["value"] == "rlfleet-reward:50051"


def test_env_and_reward_services_are_listed_apart(render) -> None:
    r = render(HYPERPOD)
    env_dep = r.get("Deployment", "rlfleet-env-maze")
    c = container(env_dep["spec"]["template"])
    assert c["command"] == ["rlfleet", "env", "serve", "--role", "env", "--port", "50051",
                            "--metrics-port", "9101"]
    assert env_of(c)["RLFLEET_ENV_SERVICE"]["value"] == "maze"
    assert env_dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] \
        == "env"
    assert r.get("Service", "rlfleet-env")["spec"]["selector"]["rlfleet.io/env"] == "maze"
    reward_dep = r.get("Deployment", "rlfleet-reward-task")
    assert reward_dep["spec"]["template"]["metadata"]["labels"][
        "app.kubernetes.io/component"] == "reward"
    assert "rlfleet.io/env" not in r.get("Service", "rlfleet-reward")["spec"]["selector"]


def test_env_swap_changes_only_the_stable_env_service(render, tmp_path: Path) -> None:
    values = tmp_path / "env.yaml"
    values.write_text(
        "env:\n  selected: maze\n  services:\n"
        "    - {name: maze, enabled: true, image: {repository: rlfleet-env}, args: []}\n"
        "    - name: gsm8k\n      image: {repository: rlfleet-env}\n"
        "      args: [--skyrl-env, gsm8k_multi_turn=/shared/data/gsm8k.jsonl]\n")
    a = render(HYPERPOD, extra=["-f", str(values)])
    b = render(HYPERPOD, "env.selected=gsm8k", extra=["-f", str(values)])
    assert b.get("Service", "rlfleet-env")["spec"]["selector"]["rlfleet.io/env"] == "gsm8k"
    c = container(b.get("Deployment", "rlfleet-env-gsm8k")["spec"]["template"])
    assert c["args"] == ["--skyrl-env", "gsm8k_multi_turn=/shared/data/gsm8k.jsonl"]
    assert "rlfleet-env-gsm8k" not in {d["metadata"]["name"] for d in a.of_kind("Deployment")}
    for kind, name in [
        ("Deployment", "rlfleet-reward-task"),
        ("Service", "rlfleet-reward"),
        ("Deployment", "rlfleet-rollout"),
        ("RayJob", "rlfleet-learner"),
    ]:
        assert a.get(kind, name) == b.get(kind, name), f"{kind}/{name} changed on an env swap"


@pytest.mark.parametrize("profile", ["hyperpod", "local", "defaults"])
def test_a_reward_service_in_an_image_of_its_own(render, validator: Validator,
                                                 profile: str) -> None:
    """examples/path-efficiency-reward, selected: its own image and command, rlfleet's
    probes, ports and environment; only the stable reward Service moves to it."""
    a = render(PROFILES[profile])
    b = render(PROFILES[profile], "reward.selected=path-efficiency")
    assert not validator.validate_all(b.objects)
    dep = b.get("Deployment", "rlfleet-reward-path-efficiency")
    c = container(dep["spec"]["template"])
    registry = "localhost/" if profile == "local" else ""
    assert c["image"] == f"{registry}path-efficiency-reward:1.0.0"
    assert c["command"] == ["path-efficiency-reward", "--port", "50051", "--metrics-port",
                            "9101"]
    assert c["args"] == []
    assert c["readinessProbe"]["exec"]["command"] == [
        "rlfleet", "health", "127.0.0.1:50051", "--tls-server-name", "rlfleet-reward"]
    assert {p["containerPort"] for p in c["ports"]} == {50051, 9101}
    assert {"RLFLEET_AUTH_TOKEN", "RLFLEET_HOST"} <= set(env_of(c))
    assert b.get("Service", "rlfleet-reward")["spec"]["selector"]["rlfleet.io/reward"] == \
        "path-efficiency"
    assert b.get("Service", "rlfleet-reward")["metadata"]["annotations"][
        "rlfleet.io/selected-reward"] == "path-efficiency"
    learner = "Job" if profile == "local" else "RayJob"
    for kind, name in [("Deployment", "rlfleet-env-maze"), ("Deployment", "rlfleet-rollout"),
                       (learner, "rlfleet-learner")]:
        assert a.get(kind, name) == b.get(kind, name), f"{kind}/{name} changed"
    deployments = {d["metadata"]["name"] for d in b.of_kind("Deployment")}
    if profile == "local":
        # only the selected reward runs there: the previous one is removed by the swap
        assert a.get("Service", "rlfleet-reward")["spec"]["selector"]["rlfleet.io/reward"] \
            == "novelty"
        assert not {"rlfleet-reward-novelty", "rlfleet-reward-task"} & deployments
    else:
        # the previous reward service keeps running (enabled): a swap back is instant
        assert "rlfleet-reward-task" in deployments


def test_network_policies_cover_every_component(render) -> None:
    r = render(HYPERPOD)
    pols = {p["metadata"]["name"]: p for p in r.of_kind("NetworkPolicy")}
    assert pols["rlfleet-default-deny"]["spec"]["policyTypes"] == ["Ingress"]
    assert "ingress" not in pols["rlfleet-default-deny"]["spec"]

    def allowed(policy: str, port: int) -> set[str]:
        comps = set()
        for rule in pols[policy]["spec"]["ingress"]:
            if rule.get("ports") and port not in [p["port"] for p in rule["ports"]]:
                continue
            for peer in rule.get("from", []):
                comp = (
                    peer.get("podSelector", {})
                    .get("matchLabels", {})
                    .get("app.kubernetes.io/component")
                )
                if comp:
                    comps.add(comp)
        return comps

    assert allowed("rlfleet-env", 50051) == {"rollout", "learner"}
    assert allowed("rlfleet-reward", 50051) == {"rollout", "learner"}
    assert allowed("rlfleet-rollout", 50052) == {"learner", "ckptsync"}
    assert allowed("rlfleet-ckptsync", 50053) == {"learner", "rollout"}
    assert allowed("rlfleet-redis", 6379) == {"rollout", "ckptsync", "learner"}
    assert "reward" not in allowed("rlfleet-redis", 6379)
    assert "env" not in allowed("rlfleet-redis", 6379)


def test_dashboard_configmap_has_every_panel(render) -> None:
    cm = render(HYPERPOD).get("ConfigMap", "rlfleet-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["rlfleet.json"])
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for metric in (
        "rlfleet_learner_reward_mean",
        "rlfleet_learner_eval_solve_ratio",
        "rlfleet_rollout_trajectories_total",
        "rlfleet_rollout_tokens_total",
        "rlfleet_learner_staleness_versions",
        "rlfleet_sync_publish_to_live_seconds_bucket",
        "rlfleet_rollout_adapter_version",
        "rlfleet_rollout_active_episodes",
        "rlfleet_learner_loss",
        "rlfleet_learner_kl",
        "rlfleet_learner_entropy",
        "rlfleet_learner_clip_ratio",
        "rlfleet_learner_grad_norm",
    ):
        assert metric in exprs, metric
    assert "by (replica)" in exprs
    assert "histogram_quantile(0.95" in exprs
    # The solve-rate panel keeps the eval and held-out sets apart, one series each.
    for s in ("eval", "heldout"):
        assert f'rlfleet_learner_eval_solve_ratio{{namespace=~"$namespace", set="{s}"}}' in exprs
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))


def test_monitors_scrape_the_metrics_ports(render) -> None:
    r = render(HYPERPOD)
    for sm in r.of_kind("ServiceMonitor"):
        assert sm["spec"]["endpoints"][0]["port"] == "metrics"
        assert sm["spec"]["selector"]["matchLabels"]["rlfleet.io/scrape"] == "true"
    ports = {
        s["metadata"]["name"]: {p["name"]: p["port"] for p in s["spec"]["ports"]}
        for s in r.of_kind("Service")
    }
    assert ports["rlfleet-reward-task"]["metrics"] == 9101
    assert ports["rlfleet-env-maze"]["metrics"] == 9101
    assert "metrics" not in ports["rlfleet-env"] and "metrics" not in ports["rlfleet-reward"]
    assert ports["rlfleet-rollout"]["metrics"] == 9102
    assert ports["rlfleet-ckptsync"]["metrics"] == 9103
    pm = r.get("PodMonitor", "rlfleet-learner")
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == {"learner-metrics", "metrics"}


def test_hyperpod_rollout_serves_the_8b_profile_with_the_learners_staleness(render) -> None:
    """The replicas get the 8B serving profile (vLLM's max_model_len, GPU memory, LoRA
    rank, images per prompt) and the learner's staleness bound."""
    import yaml

    from rlfleet.policy.profiles import serving_profile

    args = container(render(HYPERPOD).get("Deployment", "rlfleet-rollout")["spec"]["template"]
                     )["args"]
    assert args[args.index("--profile") + 1] == "qwen3-vl-8b"
    learner = yaml.safe_load((ROOT / "configs" / "qwen3-vl-8b-hyperpod.yaml").read_text())
    assert int(args[args.index("--max-staleness") + 1]) == learner["grpo"]["max_staleness"]
    assert learner["model"]["profile"] == "qwen3-vl-8b"
    profile = serving_profile("qwen3-vl-8b")
    assert profile.max_lora_rank == learner["model"]["lora_rank"] == 32
    assert profile.max_turns == learner["data"]["max_turns"]
    assert profile.max_new_tokens >= learner["data"]["max_new_tokens"]
    assert profile.frame_px == learner["data"]["size"] * learner["data"]["cell_px"]


def install_notes(helm: str, values: Path | None, *sets: str) -> str:
    """The NOTES.txt `helm install` prints (`helm template` leaves NOTES out; a client-side
    dry run renders them with no cluster)."""
    argv = [helm, "install", "rlfleet", str(CHART), "--namespace", "rlfleet",
            "--dry-run=client"]
    if values is not None:
        argv += ["-f", str(values)]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "NOTES:" in out.stdout, out.stdout
    return out.stdout.split("NOTES:", 1)[1]


def commands(notes: str) -> list[str]:
    return [line.strip() for line in notes.splitlines() if line.startswith("  ")
            and line.split()[0] in ("kubectl", "helm", "make", "rlfleet", "export")]


def test_local_notes_print_only_what_the_local_profile_has(helm: str) -> None:
    notes = install_notes(helm, LOCAL)
    cmds = commands(notes)
    assert "rayjob" not in notes.lower()  # the local profile has no RayJob (no KubeRay)
    assert "kubectl -n rlfleet get deploy,statefulset,job -l app.kubernetes.io/instance=rlfleet" \
        in cmds
    assert "kubectl -n rlfleet logs -f job/rlfleet-learner" in cmds
    # the Ray head's Jobs API, as docs/deploy.md reaches it from the host
    assert any(c.startswith("kubectl -n rlfleet port-forward svc/rlfleet-ray-head 8265:8265 &")
               for c in cmds), cmds
    assert any(c.startswith("rlfleet learner submit --address http://127.0.0.1:8265 "
                            "--ray-token-secret rlfleet/rlfleet-ray --token-secret "
                            "rlfleet/rlfleet-auth") for c in cmds), cmds
    assert "helm test rlfleet -n rlfleet --logs" in cmds
    # the local route's tools are not on a default PATH: the notes say where they are
    assert 'export PATH="$HOME/.cache/rlfleet/k8s/bin:$PWD/.venv/bin:$PATH"' in cmds
    deploys = [c for c in cmds if c.startswith("make deploy")]
    assert len(deploys) == 2
    assert all("VALUES=deploy/helm/rlfleet/values-local.yaml" in c for c in deploys), deploys
    assert "resume" in notes and "/shared/runs/tiny-maze" in notes


def test_hyperpod_notes_name_the_rayjob_and_the_images(helm: str) -> None:
    notes = install_notes(helm, HYPERPOD, "global.imageRegistry=123.dkr.ecr.x.amazonaws.com",
                          "global.imageTag=v7")
    cmds = commands(notes)
    assert any(",rayjob -l" in c for c in cmds)
    assert "helm test rlfleet -n rlfleet --logs" in cmds
    assert not any(c.startswith("export PATH") for c in cmds)
    deploys = [c for c in cmds if c.startswith("make deploy")]
    assert len(deploys) == 2
    for c in deploys:  # make's default VALUES is this profile's; the images as installed
        assert "VALUES=" not in c and "REGISTRY=123.dkr.ecr.x.amazonaws.com TAG=v7" in c


def test_notes_without_a_profile_upgrade_with_helm(helm: str) -> None:
    cmds = commands(install_notes(helm, None))
    assert not any(c.startswith("make deploy") for c in cmds)
    assert sum("--reuse-values" in c for c in cmds) == 2


# ----------------------------------------------------------------- mutual TLS

# The role whose certificate a workload mounts, by the component label of its pods; the
# Service name each server's probe checks.
TLS_ROLE = {"env": "env", "reward": "reward", "ckptsync": "ckptsync", "rollout": "rollout",
            "learner": "client"}
TLS_DIR = "/etc/rlfleet/tls"


def _tls_secrets(r: Rendered) -> dict[str, dict[str, bytes]]:
    import base64

    return {o["metadata"]["name"].split("-tls-", 1)[1]:
            {k: base64.b64decode(v) for k, v in o["data"].items()}
            for o in r.of_kind("Secret") if "-tls-" in o["metadata"]["name"]}


def _sans(pem: bytes) -> set[str]:
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem)
    return set(cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName))


@pytest.mark.parametrize("profile", ["hyperpod", "local"])
def test_every_service_to_service_call_is_mutual_tls(render, profile: str,
                                                     tmp_path: Path) -> None:
    """Both profiles: every pod of the fleet has its role's certificate mounted and the
    RLFLEET_TLS_* that make its servers ask for a client certificate of the fleet's CA and
    its clients present one and check the server's name; every readiness probe checks over
    mTLS; the chart-made certificates name their Services and verify against the one CA."""
    from rlfleet.rpc.tls import check_pair

    r = render(PROFILES[profile])
    fullname = "rlfleet"
    ns = "rlfleet"
    checked = set()
    for owner, template in pod_specs(r):
        component = template["metadata"]["labels"]["app.kubernetes.io/component"]
        if component not in TLS_ROLE or owner.endswith("#submitter"):
            continue  # redis, prometheus; the submitter talks to Ray's Jobs API only
        role = TLS_ROLE[component]
        c = template["spec"]["containers"][0]
        env = env_of(c)
        assert env["RLFLEET_TLS_CERT"]["value"] == f"{TLS_DIR}/tls.crt", owner
        assert env["RLFLEET_TLS_KEY"]["value"] == f"{TLS_DIR}/tls.key", owner
        assert env["RLFLEET_TLS_CLIENT_CA"]["value"] == f"{TLS_DIR}/ca.crt", owner
        assert env["RLFLEET_TLS_IP_SERVER_NAME"]["value"] == f"{fullname}-rollout", owner
        assert {"name": "tls", "mountPath": TLS_DIR, "readOnly": True} in c["volumeMounts"]
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == "tls")
        assert volume["secret"]["secretName"] == f"{fullname}-tls-{role}", owner
        if role != "client":
            service = f"{fullname}-{role}"
            probe = c["readinessProbe"]["exec"]["command"]
            assert probe[:2] == ["rlfleet", "health"] and \
                probe[-2:] == ["--tls-server-name", service], (owner, probe)
        checked.add(role)
    assert checked == set(TLS_ROLE.values()), checked
    # helm test's pod calls every service with the client certificate
    (test_pod,) = [o for o in r.of_kind("Pod") if o["metadata"]["name"].endswith("test-fleet")]
    assert env_of(test_pod["spec"]["containers"][0])["RLFLEET_TLS_CERT"]
    assert any(v.get("secret", {}).get("secretName") == f"{fullname}-tls-client"
               for v in test_pod["spec"]["volumes"])

    secrets = _tls_secrets(r)
    assert set(secrets) == {"ca", *TLS_ROLE.values()}
    ca = tmp_path / "ca.crt"
    ca.write_bytes(secrets["ca"]["tls.crt"])
    services = {o["metadata"]["name"] for o in r.of_kind("Service")}
    for role, files in secrets.items():
        if role == "ca":
            continue
        assert files["ca.crt"] == secrets["ca"]["tls.crt"], role  # one CA per release
        crt, key = tmp_path / f"{role}.crt", tmp_path / f"{role}.key"
        crt.write_bytes(files["tls.crt"])
        key.write_bytes(files["tls.key"])
        check_pair(crt, key, ca, as_server=role != "client", as_client=True)
        if role == "client":
            continue
        names = _sans(files["tls.crt"])
        # every Service of the role, by each of its DNS names
        own = {s for s in services if s == f"{fullname}-{role}"
               or s.startswith(f"{fullname}-{role}-")}
        assert own, role
        for s in own:
            assert {s, f"{s}.{ns}", f"{s}.{ns}.svc", f"{s}.{ns}.svc.cluster.local"} <= names, \
                (role, s, names)
        # and no other role's: the env's certificate cannot pass for the rollout
        others = {f"{fullname}-{o}" for o in ("env", "reward", "ckptsync", "rollout")
                  if o != role}
        assert not names & others, (role, names)


@pytest.mark.parametrize("how", [["--set", "tls.certManager=true"],
                                 ["--api-versions", "cert-manager.io/v1"]])
def test_cert_manager_makes_the_certificates_when_it_is_there(render, validator: Validator,
                                                              how: list[str]) -> None:
    r = render(HYPERPOD, extra=how)
    objs = {(o["kind"], o["metadata"]["name"]): o for o in r.objects}
    assert not [n for (k, n) in objs if k == "Secret" and "-tls-" in n]  # cert-manager's
    for o in r.objects:
        if o["apiVersion"] == "cert-manager.io/v1":
            assert validator.validate(o) == [], o["metadata"]["name"]
    assert objs[("Issuer", "rlfleet-selfsigned")]["spec"] == {"selfSigned": {}}
    ca = objs[("Certificate", "rlfleet-ca")]["spec"]
    assert ca["isCA"] and ca["secretName"] == "rlfleet-tls-ca"
    assert ca["privateKey"]["rotationPolicy"] == "Never"  # renewals keep the CA's key
    assert objs[("Issuer", "rlfleet-ca")]["spec"] == {"ca": {"secretName": "rlfleet-tls-ca"}}
    for role in ("env", "reward", "ckptsync", "rollout", "client"):
        spec = objs[("Certificate", f"rlfleet-{role}")]["spec"]
        assert spec["secretName"] == f"rlfleet-tls-{role}"
        assert spec["issuerRef"] == {"group": "cert-manager.io", "kind": "Issuer",
                                     "name": "rlfleet-ca"}
        assert ("server auth" in spec["usages"]) == (role != "client")
        assert "client auth" in spec["usages"]
        if role != "client":
            assert {f"rlfleet-{role}", f"rlfleet-{role}.rlfleet.svc.cluster.local"} \
                <= set(spec["dnsNames"])
    # without cert-manager (auto, and not served) the chart makes them
    plain = render(HYPERPOD)
    assert not [o for o in plain.objects if o["apiVersion"].startswith("cert-manager.io")]


def test_cert_manager_schemas_reject_a_bad_certificate(validator: Validator) -> None:
    bad = {"apiVersion": "cert-manager.io/v1", "kind": "Certificate",
           "metadata": {"name": "x"},
           "spec": {"secretName": "s", "issuerRef": {"name": "i"}, "dnsNamez": ["a"]}}
    assert "dnsNamez" in " | ".join(p.message for p in validator.validate(bad))
    issuer = {"apiVersion": "cert-manager.io/v1", "kind": "Issuer", "metadata": {"name": "i"},
              "spec": {"ca": {}}}
    assert "secretName" in " | ".join(p.message for p in validator.validate(issuer))


def test_tls_off_is_plaintext_explicitly(render) -> None:
    r = render(LOCAL, "tls.enabled=false")
    assert "RLFLEET_TLS_" not in r.text and "-tls-" not in r.text
    for owner, template in pod_specs(r):
        probe = template["spec"]["containers"][0].get("readinessProbe", {})
        assert "--tls-server-name" not in probe.get("exec", {}).get("command", []), owner
