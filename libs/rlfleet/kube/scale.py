"""`rlfleet scale rollout --replicas N [--release R] [--namespace NS]`.

Scales the rollout Deployment of a Helm release of the rlfleet chart through the
Deployment's scale subresource (what `kubectl scale` does). The chart keeps a count set
this way across later `helm upgrade`s that leave `rollout.replicas` unchanged (e.g. a
reward swap); changing `rollout.replicas` in the values takes over again.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_RELEASE = "rlfleet"
FIELD_MANAGER = "rlfleet-scale"
_SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class ScaleError(Exception):
    """A scale request that cannot be carried out; the message says why."""


@dataclass(frozen=True)
class ScaleResult:
    namespace: str
    release: str
    deployment: str
    previous: int
    replicas: int


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[Any, str]:
    """An ApiClient for the current (or named) kube context and that context's namespace.

    Falls back to the in-cluster service account when no kubeconfig exists.
    """
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())
    first = path.split(os.pathsep)[0]
    if kubeconfig or Path(first).exists():
        try:
            api = config.new_client_from_config(config_file=first, context=context)
            contexts, active = config.list_kube_config_contexts(config_file=first)
        except ConfigException as exc:
            raise ScaleError(f"no usable Kubernetes cluster in kubeconfig {first}: {exc}") from exc
        except OSError as exc:
            raise ScaleError(f"cannot read kubeconfig {first}: {exc.strerror}") from exc
        ctx = next((c for c in contexts if c["name"] == context), None) if context else active
        namespace = ((ctx or {}).get("context") or {}).get("namespace") or "default"
    else:
        try:
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
        except ConfigException:
            raise ScaleError(
                "no Kubernetes cluster configured: no kubeconfig (set KUBECONFIG or "
                "--kubeconfig, or create ~/.kube/config, e.g. with `aws eks "
                "update-kubeconfig`) and not running inside a pod"
            ) from None
        api = client.ApiClient(cfg)
        namespace = _SA_NAMESPACE.read_text().strip() if _SA_NAMESPACE.exists() else "default"
    # Fail fast with one clear message rather than retrying a dead address for a minute.
    api.configuration.retries = 1
    return api, namespace


def _call(api: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Calls the API and turns transport and HTTP failures into ScaleErrors."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        return fn(*args, _request_timeout=15, **kwargs)
    except ApiException as exc:
        if exc.status in (401, 403):
            raise ScaleError(
                f"the Kubernetes API server at {api.configuration.host} refused the request "
                f"({exc.status} {exc.reason}): check your credentials and RBAC"
            ) from None
        raise ScaleError(f"Kubernetes API error {exc.status} {exc.reason}: {exc.body}") from None
    except (HTTPError, OSError) as exc:
        raise ScaleError(
            f"cannot reach the Kubernetes API server at {api.configuration.host}: {exc}"
        ) from None


def find_rollout(api: Any, namespace: str, release: str) -> Any:
    """The rollout Deployment of `release` in `namespace`, or a ScaleError saying why not."""
    from kubernetes import client

    apps = client.AppsV1Api(api)
    selector = (
        f"app.kubernetes.io/instance={release},app.kubernetes.io/part-of=rlfleet,"
        "app.kubernetes.io/component=rollout"
    )
    found = _call(api, apps.list_namespaced_deployment, namespace, label_selector=selector).items
    if len(found) == 1:
        return found[0]
    if len(found) > 1:
        names = ", ".join(d.metadata.name for d in found)
        raise ScaleError(f"release {release!r} has several rollout Deployments ({names})")
    core = client.CoreV1Api(api)
    helm = _call(
        api, core.list_namespaced_secret, namespace, label_selector=f"owner=helm,name={release}"
    ).items
    if helm:
        raise ScaleError(
            f"release {release!r} in namespace {namespace!r} has no rollout Deployment "
            "(rollout.enabled is false?)"
        )
    others = _call(
        api,
        apps.list_namespaced_deployment,
        namespace,
        label_selector="app.kubernetes.io/part-of=rlfleet,app.kubernetes.io/component=rollout",
    ).items
    known = sorted(
        {(d.metadata.labels or {}).get("app.kubernetes.io/instance", "?") for d in others}
    )
    hint = (
        f"; rlfleet releases there: {', '.join(known)}"
        if known
        else f"; `helm list -n {namespace}` shows the releases"
    )
    raise ScaleError(
        f"unknown release: no rlfleet release {release!r} in namespace {namespace!r}{hint}"
    )


def _autoscaler_of(api: Any, namespace: str, deployment: str) -> Any | None:
    from kubernetes import client

    # autoscaling/v1 is served by every Kubernetes version and names the target.
    hpas = _call(
        api, client.AutoscalingV1Api(api).list_namespaced_horizontal_pod_autoscaler, namespace
    ).items
    for hpa in hpas:
        ref = hpa.spec.scale_target_ref
        if ref.kind == "Deployment" and ref.name == deployment:
            return hpa
    return None


def scale_rollout(
    replicas: int,
    release: str = DEFAULT_RELEASE,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> ScaleResult:
    if replicas < 0:
        raise ScaleError(f"replicas must be 0 or more, got {replicas}")
    from kubernetes import client

    api, default_ns = connect(kubeconfig, context)
    ns = namespace or default_ns
    with api:
        dep = find_rollout(api, ns, release)
        name = dep.metadata.name
        hpa = _autoscaler_of(api, ns, name)
        if hpa is not None:
            raise ScaleError(
                f"the rollout of release {release!r} is scaled by HorizontalPodAutoscaler "
                f"{hpa.metadata.name!r} ({hpa.spec.min_replicas}..{hpa.spec.max_replicas} "
                "replicas): change rollout.autoscaling.minReplicas/maxReplicas with "
                "`make deploy`/`helm upgrade`, or set rollout.autoscaling.enabled=false"
            )
        previous = int(dep.spec.replicas or 0)
        scale = _call(
            api,
            client.AppsV1Api(api).patch_namespaced_deployment_scale,
            name,
            ns,
            {"spec": {"replicas": replicas}},
            field_manager=FIELD_MANAGER,
        )
        return ScaleResult(ns, release, name, previous, int(scale.spec.replicas))


def _cmd(args: argparse.Namespace) -> int:
    try:
        result = scale_rollout(
            args.replicas, args.release, args.namespace, args.kubeconfig, args.context
        )
    except ScaleError as exc:
        print(f"rlfleet scale: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"scaled deployment/{result.deployment} in namespace {result.namespace}: "
        f"{result.previous} -> {result.replicas} replicas"
    )
    return 0


def register_scale_command(subparsers: argparse._SubParsersAction) -> None:
    """Adds `scale rollout` to the `rlfleet` command."""
    scale = subparsers.add_parser("scale", help="scale a part of a deployed rlfleet release")
    what = scale.add_subparsers(dest="scale_target", required=True)
    rollout = what.add_parser(
        "rollout",
        help="set the number of rollout replicas",
        description="Scale the rollout Deployment of an rlfleet Helm release in the current "
        "kube context (kubectl's), e.g. `rlfleet scale rollout --replicas 4`.",
    )
    rollout.add_argument("--replicas", type=_non_negative, required=True, metavar="N",
                         help="rollout replicas wanted (0 or more)")
    rollout.add_argument(
        "--release", default=DEFAULT_RELEASE, help=f"Helm release name (default: {DEFAULT_RELEASE})"
    )
    rollout.add_argument(
        "--namespace", "-n", default=None, help="namespace (default: the kube context's)"
    )
    rollout.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG)")
    rollout.add_argument("--context", default=None, help="kube context (default: current)")
    rollout.set_defaults(func=_cmd)
