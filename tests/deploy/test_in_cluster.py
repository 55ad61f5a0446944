"""`make deploy` into a real single-node Kubernetes (scripts/k8s/cluster.sh: etcd,
kube-apiserver, controller-manager, scheduler, a kubelet with containerd and runc,
kube-proxy), the local images built from the one Dockerfile on a Debian base and loaded
into the node. Nothing is mocked and nothing skips: a missing piece fails with its reason.

One module-scoped fleet, exercised in order, as a user would:
  1. every pod of values-local.yaml becomes Ready through its real probe, the Ray head (its
     Jobs API) and a Ray worker among them;
  2. the chart's Job submits the learner to the Ray head as a Ray job; the GRPO run starts
     from the shipped SFT checkpoint (in the image), with a held-out eval before and after,
     and publishes adapter versions through /shared; the release's Prometheus (Debian's
     package) scrapes every component and has a series for every dashboard query;
  3. `rlfleet scale rollout --replicas 3` adds replicas that serve the current version and
     are acknowledged by ckpt-sync;
  4. `make deploy HELM_ARGS="--set reward.selected=path-efficiency"` swaps in the example
     reward service (examples/path-efficiency-reward, its own image) while the learner runs:
     its metrics carry the new name from the next step on;
  5. the run completes with a held-out solve rate above its start by more than the
     difference's standard error;
  6. `rlfleet learner submit` from the host, through `kubectl port-forward` to the head's
     Service (docs/deploy.md), continues the run for two more steps as a Ray job, followed
     with `rlfleet learner logs --follow` and ending SUCCEEDED;
  7. `helm test` passes, each service's image drains on SIGTERM, and `cluster.sh down`
     leaves the host as it found it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.console import assert_readable_log
from tests.waits import wait_until

from .conftest import ROOT, SCRIPTS, _run

# pytest-timeout counts the module fixture's set-up (image builds, loading: minutes, more on
# a fresh machine) in the first test, and the GRPO run takes minutes of its own.
# One worker (xdist) owns the node: a second cluster on this host would share its network
# namespace name and the node's kubepods cgroups. Heavy (tests/conftest.py): that worker
# runs the heavy tiers one after another.
pytestmark = [pytest.mark.deploy, pytest.mark.slow, pytest.mark.timeout(3600),
              pytest.mark.heavy]

RELEASE = "rlfleet"
RUN = "cluster-grpo"
# Long enough for the mid-run changes with a wide margin: the scale-out and the reward swap
# are done about 4-6 steps after step 3 (pods start while the learner steps); the steps
# after them only prove that the run finishes.
STEPS = 20
# make run's recipe (the local profile's), shorter: STEPS steps, two replicas, the 256
# held-out mazes and the first 16 eval mazes before and after, no curve points between
SHORT_RUN = (f"--set learner.config.steps={STEPS} --set rollout.replicas=2 "
             "--set learner.config.eval.every=0 --set learner.config.eval.eval_seeds=16")
IMAGES = ROOT / "scripts" / "images"
# The command line of this Python's environment (the repository's .venv in a checkout).
RLFLEET = Path(sys.executable).parent / "rlfleet"
# The local profile's model: the shipped SFT checkpoint, baked into the images.
MODEL = "/opt/rlfleet/models/tiny-sft-feedback"
EXAMPLE = ROOT / "examples" / "path-efficiency-reward"
# One-time builds: Kubernetes from source (shared with the API-server tests), the Debian
# base, the wheelhouse and the images.
BUILD_TIMEOUT_S = 3600


@dataclass
class Fleet:
    kubeconfig: Path
    kubectl: Path
    shared: Path
    env: dict[str, str]
    images: list[str]  # the images loaded into the node (besides the pause image)

    def kubectl_json(self, *args: str) -> dict:
        return json.loads(self.k(*args, "-o", "json").stdout)

    def k(self, *args: str, check: bool = True,
          timeout: float = 120) -> subprocess.CompletedProcess:
        return _run([str(self.kubectl), *args], env=self.env, check=check, timeout=timeout)

    @property
    def metrics(self) -> Path:
        return self.shared / "runs" / RUN / "metrics.jsonl"

    def events(self, kind: str) -> list[dict]:
        if not self.metrics.is_file():
            return []
        events = []
        for line in self.metrics.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:  # the line being written
                continue
            if event.get("event") == kind:
                events.append(event)
        return events

    def steps(self) -> list[dict]:
        return self.events("step")

    def wait_steps(self, n: int, timeout: float) -> list[dict]:
        return wait_for(lambda: (s := self.steps()) and len(s) >= n and s, timeout,
                        f"{n} GRPO steps in {self.metrics}", self.diagnose)

    def pods(self, component: str) -> list[dict]:
        sel = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component={component}"
        return self.kubectl_json("get", "pods", "-l", sel)["items"]

    def ready_pods(self, component: str) -> list[dict]:
        return [p for p in self.pods(component) if p["metadata"].get("deletionTimestamp") is None
                and any(c["type"] == "Ready" and c["status"] == "True"
                        for c in p.get("status", {}).get("conditions", []))]

    def scrape(self, pod: str, port: int) -> str:
        """A pod's Prometheus metrics, read inside the pod (stdlib Python)."""
        url = f"http://127.0.0.1:{port}/metrics"
        code = f"import urllib.request;print(urllib.request.urlopen({url!r}).read().decode())"
        return self.k("exec", pod, "--", "python3", "-c", code).stdout

    def ray_node(self, node: str) -> list[dict]:
        """Ready pods of one kind of Ray node (head, worker) of the learner."""
        return [p for p in self.ready_pods("learner")
                if p["metadata"]["labels"].get("rlfleet.io/ray-node") == node]

    def diagnose(self) -> str:
        out = self.k("get", "pods,jobs", "-o", "wide", check=False).stdout
        logs = self.k("logs", f"job/{RELEASE}-learner", "--tail", "30", check=False)
        return f"{out}\n--- learner log\n{logs.stdout}{logs.stderr}"


def wait_for(fn, timeout: float, what: str, diagnose=lambda: ""):  # noqa: ANN001, ANN201
    return wait_until(what, fn, timeout, period_s=2, diagnose=diagnose)


def gauge(text: str, name: str) -> dict[str, float]:
    """Samples of one gauge: {label string: value}."""
    out = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


class Phases:
    """Seconds each phase of the fleet's set-up took, written to a JSON file as they end
    (the slow part of a slow run, without a rerun)."""

    def __init__(self, path: Path) -> None:
        self.path, self.start, self.seconds = path, time.monotonic(), {}

    def done(self, phase: str) -> None:
        self.seconds[phase] = round(time.monotonic() - self.start - sum(self.seconds.values()), 1)
        self.path.write_text(json.dumps(self.seconds, indent=1))


def mount_points(others: Path, own: Path) -> list[str]:
    """The host's mount points, less those of tests on other xdist workers (under `others`,
    the session's temp root, but not under `own`, this worker's): the disk-full test mounts
    a small tmpfs in its temp dir and may hold it while the cluster goes down."""
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return sorted(p for p in points
                  if not (Path(p).is_relative_to(others) and not Path(p).is_relative_to(own)))


def host_state(own_temp: Path) -> dict[str, object]:
    """What a cluster could leave behind on the host (`own_temp`: this worker's temp root)."""
    sysctls = {k: Path(f"/proc/sys/{k}").read_text().strip()
               for k in ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops",
                         "net/ipv4/ip_forward")}
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    mounts = mount_points(own_temp.parent, own_temp)
    cgroups = sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*/kubepods"))
    return {"sysctls": sysctls, "links": sorted(re.findall(r"^\d+: ([^:@]+)", links, re.M)),
            "netns": netns.strip(), "mounts": mounts, "cgroups": cgroups}


@pytest.fixture(scope="module")
def fleet(k8s_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    before = host_state(tmp_path_factory.getbasetemp())
    state = tmp_path_factory.mktemp("cluster")
    phases = Phases(tmp_path_factory.getbasetemp() / "cluster-phases.json")
    env = {**os.environ, "KUBECONFIG": str(state / "kubeconfig")}
    up = _run(["bash", str(SCRIPTS / "cluster.sh"), "up", "--dir", str(state)],
              timeout=BUILD_TIMEOUT_S)
    kubeconfig = Path(up.stdout.strip().splitlines()[-1])
    phases.done("cluster up")
    env["KUBECONFIG"] = str(kubeconfig)
    try:
        images = _run(["bash", str(IMAGES / "build.sh"), "--profile", "local"],
                      timeout=BUILD_TIMEOUT_S).stdout.split()
        images.append(_run(["bash", str(IMAGES / "build-example.sh"), str(EXAMPLE),
                            "path-efficiency-reward:1.0.0"], timeout=900).stdout.split()[-1])
        images += ["localhost/rlfleet-redis:7.0", "localhost/rlfleet-prometheus:2.42"]
        phases.done("images built")
        _run(["bash", str(SCRIPTS / "cluster.sh"), "load", "--dir", str(state), *images],
             timeout=900)
        phases.done("images loaded")
        # /shared: a directory of the node that every pod mounts (hostPath); the pods run as
        # uid 10001.
        shared = state / "shared"
        shared.mkdir()
        shared.chmod(0o777)
        helm_args = (f"--set shared.hostPath={shared} --set run={RUN} {SHORT_RUN}")
        _run(["make", "-s", "deploy", "VALUES=deploy/helm/rlfleet/values-local.yaml",
              f"RELEASE={RELEASE}", "NAMESPACE=default", f"HELM_ARGS={helm_args}"],
             env=env, timeout=900)
        phases.done("deployed")
        fleet = Fleet(kubeconfig, k8s_bin / "kubectl", shared, env, images)
        # Every component Ready through its probe (the model is built by the init
        # containers first), the learner's pod running.
        wait_for(lambda: all(fleet.ready_pods(c) for c in
                             ("env", "reward", "rollout", "ckptsync", "redis", "prometheus"))
                 and fleet.ray_node("head") and fleet.ray_node("worker"), 900,
                 "every component's pod Ready", fleet.diagnose)
        phases.done("every pod Ready")
        yield fleet
    finally:
        # The run's record outlives the cluster's folder (removed by `down`), for a look at
        # where a slow or failed run spent its time.
        record = state / "shared" / "runs" / RUN / "metrics.jsonl"
        if record.is_file():
            shutil.copy(record, tmp_path_factory.getbasetemp() / "cluster-metrics.jsonl")
        _run(["bash", str(SCRIPTS / "cluster.sh"), "down", "--dir", str(state)], check=False,
             timeout=300)
        after = host_state(tmp_path_factory.getbasetemp())
        assert after == before, f"the cluster left the host changed:\n{before}\n{after}"
        # Nothing of the cluster runs on (its components all name the state folder; the
        # pods' processes would sit in the kubepods cgroups, checked above).
        left = subprocess.run(["pgrep", "-af", str(state)], capture_output=True, text=True)
        assert not left.stdout.strip(), f"left running:\n{left.stdout}"


def test_every_pod_is_ready_through_its_probe(fleet: Fleet) -> None:
    for component in ("env", "reward", "rollout", "ckptsync", "redis"):
        pods = fleet.ready_pods(component)
        assert pods, f"no Ready {component} pod\n{fleet.diagnose()}"
        for pod in pods:
            probe = pod["spec"]["containers"][0]["readinessProbe"]
            assert "exec" in probe or "grpc" in probe, probe  # a real health check
    # Ray as a cluster runs it: a head whose probe is its Jobs API port, a worker pod, and
    # the Job that submitted the learner to the head.
    head = fleet.ray_node("head")
    assert head, fleet.diagnose()
    assert head[0]["spec"]["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == "dashboard"
    assert fleet.ray_node("worker"), fleet.diagnose()
    submitter = [p for p in fleet.pods("learner")
                 if p["metadata"]["labels"].get("rlfleet.io/ray-node") == "submitter"]
    assert submitter and submitter[0]["status"]["phase"] in ("Running", "Succeeded"), \
        fleet.diagnose()

    # Both Ray nodes join the cluster the learner's driver sees. The worker's pod has no
    # probe of its own (Ready as soon as `ray start --block` runs), so its joining is
    # waited for: CI once counted 1 node right after every pod was Ready.
    def alive_nodes() -> str:
        out = fleet.k("exec", head[0]["metadata"]["name"], "--", "python3", "-c",
                      "import ray; ray.init(address='auto', logging_level='ERROR'); "
                      "print(sum(n['Alive'] for n in ray.nodes()))", timeout=180, check=False)
        lines = out.stdout.strip().splitlines()
        return lines[-1] if lines else out.stderr[-500:]

    seen: list[str] = []

    def both_alive() -> bool:
        seen.append(alive_nodes())
        return seen[-1] == "2"

    wait_for(both_alive, 600,
             "both Ray nodes alive in the head's view",
             diagnose=lambda: f"last count: {seen[-1:]}\n{fleet.diagnose()}")


# The fleet's gRPC services, as every pod calls them (the chart's Service names).
SERVICES = {"env": f"{RELEASE}-env:50051", "reward": f"{RELEASE}-reward:50051",
            "ckptsync": f"{RELEASE}-ckptsync:50053", "rollout": f"{RELEASE}-rollout:50052"}
# Run in a pod of the env image: the health check of every service with each set of
# credentials the pod has (/etc/rogue: the fleet's CA certificate, to check the servers
# with, and a certificate from another CA); one JSON line of statuses.
ROGUE_PROBE = """
import json, pathlib
from rlfleet.rpc.health import check
d = pathlib.Path("/etc/rogue")
cases = {"plaintext": None, "no certificate": {"ca_file": d / "ca.crt"},
         "another CA's certificate": {"ca_file": d / "ca.crt", "cert_file": d / "tls.crt",
                                      "key_file": d / "tls.key"}}
print(json.dumps({case: {name: check(address, timeout_s=20, tls=tls)
                         for name, address in SERVICES.items()}
                  for case, tls in cases.items()}))
"""


def _rogue_certificate(directory: Path) -> None:
    """tls.crt/tls.key: a client certificate from a CA of its own (not the fleet's)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rogue-ca")])
    cert = (x509.CertificateBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{RELEASE}-client")]))
        .issuer_name(ca).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256()))
    (directory / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))


def test_services_refuse_a_pod_without_the_fleets_certificate(fleet: Fleet,
                                                              tmp_path: Path) -> None:
    """mTLS is on: a pod with no client certificate, or one from another CA, is refused by
    every service in the handshake (UNAVAILABLE: no handler is reached), and so is a
    plaintext call; `rlfleet health` with the fleet's certificate (the learner's pod, its
    RLFLEET_TLS_* environment) is served by each."""
    import base64

    ca = fleet.kubectl_json("get", "secret", f"{RELEASE}-tls-ca")["data"]["ca.crt"]
    (tmp_path / "ca.crt").write_bytes(base64.b64decode(ca))
    _rogue_certificate(tmp_path)
    fleet.k("delete", "secret,pod", "rogue-tls", "--ignore-not-found", "--wait=true")
    fleet.k("create", "secret", "generic", "rogue-tls",
            *(f"--from-file={tmp_path / n}" for n in ("ca.crt", "tls.crt", "tls.key")))
    like = fleet.pods("env")[0]["spec"]
    script = f"SERVICES = {SERVICES!r}\n{ROGUE_PROBE}"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "rogue-tls"},
           "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                    "securityContext": like.get("securityContext", {}),
                    "containers": [{
                        "name": "probe", "image": like["containers"][0]["image"],
                        "imagePullPolicy": "Never", "command": ["python3", "-c", script],
                        "env": [{"name": "HOME", "value": "/tmp"}],
                        "securityContext": like["containers"][0].get("securityContext", {}),
                        "volumeMounts": [{"name": "rogue", "mountPath": "/etc/rogue",
                                          "readOnly": True},
                                         {"name": "tmp", "mountPath": "/tmp"}]}],
                    "volumes": [{"name": "rogue", "secret": {"secretName": "rogue-tls"}},
                                {"name": "tmp", "emptyDir": {}}]}}
    manifest = tmp_path / "rogue.json"
    manifest.write_text(json.dumps(pod))
    try:
        fleet.k("apply", "-f", str(manifest))
        wait_for(lambda: fleet.kubectl_json("get", "pod", "rogue-tls")["status"].get("phase")
                 in ("Succeeded", "Failed"), 300, "the rogue pod to finish", fleet.diagnose)
        logs = fleet.k("logs", "rogue-tls").stdout.strip().splitlines()
        statuses = json.loads(logs[-1])
    finally:
        fleet.k("delete", "pod,secret", "rogue-tls", "--ignore-not-found", check=False)
    assert set(statuses) == {"plaintext", "no certificate", "another CA's certificate"}
    for case, by_service in statuses.items():
        assert by_service == {name: "UNAVAILABLE" for name in SERVICES}, (case, by_service)
    # the fleet's own certificate, from the environment the chart gives the learner's pod
    head = fleet.ray_node("head")[0]["metadata"]["name"]
    for name, address in SERVICES.items():
        out = fleet.k("exec", head, "--", "rlfleet", "health", "--timeout", "20", address)
        assert out.stdout.strip() == "SERVING", (name, out.stdout, out.stderr)


def test_the_node_keeps_its_images_by_the_id_they_were_built_as(fleet: Fleet) -> None:
    """The node's images outlive the cluster (scripts/k8s/cluster.sh), so a later start
    loads only what changed: every image in the node is labelled with the buildah image ID
    it came from; loading it again skips it, and one whose label no longer matches is
    imported again."""
    state = fleet.shared.parent
    ctr = ["ctr", "--address", str(state / "containerd" / "containerd.sock"), "-n", "k8s.io"]

    def node_image(name: str, image_id: str) -> bool:
        out = _run([*ctr, "images", "ls", "-q",
                    f'name=={name},labels."rlfleet.io/image-id"=={image_id}'])
        return out.stdout.split() == [name]

    def load(name: str) -> str:
        return _run(["bash", str(SCRIPTS / "cluster.sh"), "load", "--dir", str(state),
                     name]).stderr

    pause = "localhost/rlfleet-pause:3.4"
    for name in (*fleet.images, pause):
        image_id = _run(["bash", "-c", f'IMAGE_TOOL=buildah; source "{IMAGES}/tool.sh"; '
                         f"buildah_store inspect --type image --format '{{{{.FromImageID}}}}' "
                         f"{name}"]).stdout.strip()
        assert len(image_id) == 64 and node_image(name, image_id), (name, image_id)
    assert "already in the node" in load(pause)
    # A changed image crosses over without the layers the node holds (slim_archive.py);
    # the pods the later tests create run on this re-imported pause image.
    _run([*ctr, "images", "label", pause, "rlfleet.io/image-id=stale"])
    assert f"loaded {pause} (its new layers)" in load(pause)
    assert not node_image(pause, "stale")


DASHBOARD = ROOT / "deploy" / "helm" / "rlfleet" / "dashboards" / "rlfleet.json"


class PortForward:
    """`kubectl port-forward svc/NAME LOCAL:REMOTE` from the host, as docs/deploy.md does;
    ends with the `with` block."""

    def __init__(self, fleet: Fleet, service: str, remote: int) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [str(fleet.kubectl), "port-forward", f"svc/{service}", f"{self.port}:{remote}"],
            env=fleet.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def __enter__(self) -> str:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "Forwarding from" not in line:
            self.proc.kill()
            raise AssertionError(f"kubectl port-forward: {line}{self.proc.communicate()[0]}")
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def prom_query(url: str, query: str) -> list[dict]:
    import urllib.parse
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/query?"
                                + urllib.parse.urlencode({"query": query}), timeout=30) as r:
        doc = json.loads(r.read())
    assert doc["status"] == "success", doc
    return doc["data"]["result"]


def test_prometheus_scrapes_every_service_and_every_panel_has_a_series(fleet: Fleet) -> None:
    """The release's Prometheus (Debian's package, prometheus.enabled) finds the pods through
    the Kubernetes API and scrapes each service; while the learner runs, every query of
    every dashboard panel (deploy/helm/rlfleet/dashboards/rlfleet.json, $namespace set to
    the release's) returns at least one series."""
    fleet.wait_steps(1, timeout=900)
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queries = {f"{p['title']} [{t.get('refId', i)}]": t["expr"].replace("$namespace", "default")
               for p in panels for i, t in enumerate(p.get("targets", []))}
    assert len(queries) >= 15, queries
    with PortForward(fleet, f"{RELEASE}-prometheus", 9090) as url:
        import urllib.request

        with urllib.request.urlopen(f"{url}/graph", timeout=30) as r:  # its own UI
            assert r.status == 200
        wanted = {"env", "reward", "rollout", "ckptsync", "learner"}

        def scraped() -> set[str]:
            return {s["metric"].get("component", "") for s in prom_query(url, "up == 1")}

        wait_for(lambda: wanted <= scraped(), 300,
                 f"Prometheus scraping every component {sorted(wanted)}",
                 lambda: str(prom_query(url, "up")))
        nodes = {s["metric"].get("ray_node") for s in prom_query(url, 'up{component="learner"}')}
        assert {"head", "worker"} <= nodes, nodes

        def empty() -> list[str]:
            return [name for name, q in queries.items() if not prom_query(url, q)]

        wait_for(lambda: not empty(), 600, "a series for every dashboard query",
                 lambda: f"no series: {empty()}")


def test_grpo_run_scale_and_reward_swap_in_the_cluster(fleet: Fleet) -> None:
    steps = fleet.wait_steps(3, timeout=900)
    assert all(s["reward_name"] == "novelty" for s in steps)  # the recipe's
    # The run starts from the shipped SFT checkpoint (the image's), not a random model.
    start = fleet.events("start")[0]
    assert start["config"]["model"]["path"] == MODEL, start["config"]["model"]
    adapters = fleet.shared / "runs" / RUN / "adapters"
    published = [p.name for p in adapters.iterdir() if p.name.startswith("v")]
    assert published, "no adapter version published"

    # Scale out, then at once swap the reward service with helm upgrade while the learner
    # keeps running. The upgrade goes in before the new replicas are Ready, not after: it
    # must land while steps remain however slowly pods start on a loaded machine (once it
    # has, no step can finish without the new service). It also shows that a later upgrade
    # keeps the replica count `rlfleet scale` set.
    version_at_scale = fleet.steps()[-1]["version"]
    _run([str(RLFLEET), "scale", "rollout", "--replicas", "3",
          "--release", RELEASE, "--namespace", "default"], env=fleet.env)
    step_at_swap = len(fleet.steps())
    _run(["make", "-s", "deploy", "VALUES=deploy/helm/rlfleet/values-local.yaml",
          f"RELEASE={RELEASE}", "NAMESPACE=default",
          f"HELM_ARGS=--set shared.hostPath={fleet.shared} --set run={RUN} {SHORT_RUN} "
          "--set reward.selected=path-efficiency"],
         env=fleet.env, timeout=300)

    # The new replicas load the live adapter before they turn Ready ...
    ready = wait_for(lambda: len(r := fleet.ready_pods("rollout")) == 3 and r, 600,
                     "3 Ready rollout replicas", fleet.diagnose)
    for pod in ready:
        name = pod["metadata"]["name"]
        served = gauge(fleet.scrape(name, 9102), "rlfleet_rollout_adapter_version")
        assert served and max(served.values()) >= version_at_scale, (name, served)
    # ... and ckpt-sync has every one of them acknowledging a version.
    sync_pod = fleet.ready_pods("ckptsync")[0]["metadata"]["name"]
    def acknowledged() -> dict[str, float]:
        return gauge(fleet.scrape(sync_pod, 9103), "rlfleet_sync_replica_adapter_version")

    acked = wait_for(lambda: len(a := acknowledged()) >= 3 and a, 120,
                     "3 replicas acknowledged by ckpt-sync")
    assert min(acked.values()) >= version_at_scale, acked

    swapped = wait_for(
        lambda: [s for s in fleet.steps() if s["reward_name"] == "path-efficiency"], 600,
        "a step scored by the path-efficiency reward service", fleet.diagnose)
    first = swapped[0]["step"]
    assert first > step_at_swap - 1
    later = [s for s in fleet.steps() if s["step"] > first]
    # From the step after the first mixed one on, every trajectory is scored by the new one.
    assert all(s["reward_name"] == "path-efficiency" and s["reward_version"] == "1.0.0"
               and set(s["reward_services"]) == {"path-efficiency 1.0.0"} for s in later), later

    # The learner kept running through both changes and finishes the run.
    job = f"{RELEASE}-learner"
    wait_for(lambda: fleet.kubectl_json("get", "job", job)["status"].get("succeeded"),
             1200, "the learner Job to complete", fleet.diagnose)
    steps = fleet.steps()
    assert [s["step"] for s in steps] == list(range(1, STEPS + 1))
    # the local profile's learner log is for a person (learner.console: human)
    assert_readable_log(fleet.k("logs", f"job/{job}").stdout, steps=STEPS)
    versions = [s["version"] for s in steps]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)

    # The pods learn: the held-out solve rate after GRPO beats the start (the same greedy
    # eval of the 256 held-out mazes as `make run`'s). Only better, not by a margin: this
    # short run swaps its reward halfway, and its gain varies from run to run by about
    # the binomial standard error of the difference; what it learns over a whole recipe
    # is make run's record.
    end = fleet.events("end")[-1]
    before, after = end["first_eval"]["heldout"], end["last_eval"]["heldout"]
    assert before["episodes"] == after["episodes"] == 256, (before, after)
    p0, p1 = before["solved"] / before["episodes"], after["solved"] / after["episodes"]
    assert p1 > p0, f"held-out {p0:.3f} -> {p1:.3f}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_learner_submit_through_a_port_forward(fleet: Fleet, tmp_path: Path) -> None:
    """docs/deploy.md's route from a notebook or the host: `kubectl port-forward` to the Ray
    head's Service, then `rlfleet learner submit|logs|status` against it, the fleet token
    and Ray's token read from the chart's Secrets. The job continues the finished run for
    two more steps (the replicas serve that run's adapters)."""
    cm = fleet.kubectl_json("get", "configmap", f"{RELEASE}-learner")
    config = yaml.safe_load(cm["data"]["learner.yaml"])
    config["steps"] = STEPS + 2
    config["eval"] = {**config["eval"], "at_start": False, "heldout_seeds": 0,
                      "eval_seeds": 0, "curve_heldout": 0}
    path = tmp_path / "learner.yaml"
    path.write_text(yaml.safe_dump(config))

    with PortForward(fleet, f"{RELEASE}-ray-head", 8265) as url:
        address = ["--address", url, "--ray-token-secret", f"default/{RELEASE}-ray"]
        submit = _run([str(RLFLEET), "learner", "submit", *address, "--config", str(path),
                       "--run", RUN, "--resume", "auto", "--token-secret",
                       f"default/{RELEASE}-auth"], env=fleet.env, timeout=300)
        job = submit.stdout.strip()
        assert job and "\n" not in job, submit.stdout
        logs = _run([str(RLFLEET), "learner", "logs", job, *address, "--follow"],
                    env=fleet.env, timeout=1200)
        assert f"resuming run {RUN} from step {STEPS}" in logs.stdout, logs.stdout[-3000:]
        status = _run([str(RLFLEET), "learner", "status", job, *address], env=fleet.env)
        assert status.stdout.strip() == "SUCCEEDED", (status.stdout, logs.stdout[-3000:])
    steps = fleet.steps()
    assert [s["step"] for s in steps][-2:] == [STEPS + 1, STEPS + 2]
    assert fleet.events("end")[-1]["step"] == STEPS + 2


def test_built_images_are_not_built_again(fleet: Fleet) -> None:
    """What a cached `make cluster-up` does with its images: every one is found up to
    date from its inputs and named, none is built (no builder output). (Built once more
    first: another test here may have built one of them anew.)"""
    def build() -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
        return (_run(["bash", str(IMAGES / "build.sh"), "--profile", "local"],
                     timeout=BUILD_TIMEOUT_S),
                _run(["bash", str(IMAGES / "build-example.sh"), str(EXAMPLE),
                      "path-efficiency-reward:1.0.0"], timeout=900))

    build()
    again, example = build()
    assert again.stdout.split() + example.stdout.split() == \
        fleet.images[:len(again.stdout.split()) + 1]
    assert example.stderr == "", example.stderr
    lines = again.stderr.splitlines()
    assert lines and all(line.startswith("[images] ") and "is up to date" in line
                         for line in lines), again.stderr


def test_helm_test_checks_the_deployed_fleet(fleet: Fleet, helm: str) -> None:
    out = _run([helm, "test", RELEASE, "--namespace", "default", "--logs", "--timeout", "5m"],
               env=fleet.env, timeout=400)
    assert "Phase:          Succeeded" in out.stdout or "Succeeded" in out.stdout, out.stdout
    assert "fleet OK" in out.stdout


# One pod of each image, deleted together: the drains overlap (each takes a grace of its
# own), so the four cost the time of one.
DRAINED = {"env": 50051, "reward": 50051, "ckptsync": 50053, "rollout": 50052}


@pytest.fixture(scope="module")
def drained(fleet: Fleet) -> dict[str, tuple[str, str]]:
    """component -> (its health before the kubelet's SIGTERM, its log until it exited)."""
    pods = {c: fleet.ready_pods(c)[0]["metadata"]["name"] for c in DRAINED}

    def probe(pod: str) -> list[str]:
        # the pod's own readiness probe: `rlfleet health` over mTLS with its certificate
        spec = fleet.kubectl_json("get", "pod", pod)["spec"]["containers"][0]
        command = spec["readinessProbe"]["exec"]["command"]
        assert command[:2] == ["rlfleet", "health"], command
        return command

    health = {c: fleet.k("exec", pod, "--", *probe(pod)).stdout.strip()
              for c, pod in pods.items()}
    follows = {c: subprocess.Popen([str(fleet.kubectl), "logs", "-f", pod], env=fleet.env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for c, pod in pods.items()}
    try:
        time.sleep(1)
        fleet.k("delete", "pod", *pods.values(), "--wait=true", "--grace-period=60",
                timeout=180)
        logs = {c: follow.communicate(timeout=60)[0] for c, follow in follows.items()}
    finally:
        for follow in follows.values():
            follow.kill()
    return {c: (health[c], logs[c]) for c in DRAINED}


@pytest.mark.parametrize("component", list(DRAINED))
def test_each_image_drains_on_sigterm(drained: dict[str, tuple[str, str]],
                                      component: str) -> None:
    """The kubelet's SIGTERM (pod deletion) drains the server: health stops, it exits."""
    health, log = drained[component]
    assert health == "SERVING"
    assert "signal received, draining" in log, log[-2000:]
    assert '"stopped"' in log or "stopped" in log.splitlines()[-1], log[-2000:]
