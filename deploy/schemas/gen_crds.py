"""Writes the structural CRD schemas this repository keeps for the custom resources the
chart renders (RayJob, RayCluster from KubeRay; ServiceMonitor, PodMonitor from the
Prometheus operator) into deploy/schemas/crds/.

They serve twice: the deploy tests install them into a bare API server (so server-side
validation and `helm install` see the kinds), and `rlfleet.kube.manifests` turns them into
strict JSON Schemas for offline validation (unknown fields rejected, embedded pod
templates checked against the Kubernetes PodTemplateSpec schema).

They cover the fields of KubeRay v1 (1.3/1.4) and Prometheus operator v1 (0.7x/0.8x) that
a user of this chart may set; they are not the upstream CRDs (which are ~1 MB each and not
downloadable here). Run `python deploy/schemas/gen_crds.py` after editing; a test checks
the YAML files are up to date.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

OUT = Path(__file__).resolve().parent / "crds"
# Marker read by rlfleet.kube.manifests: this node is validated as a core/v1 PodTemplateSpec.
POD_TEMPLATE_MARK = "PodTemplateSpec (core/v1)"

S = {"type": "string"}
B = {"type": "boolean"}
I32 = {"type": "integer", "format": "int32"}
I64 = {"type": "integer", "format": "int64"}
STRMAP = {"type": "object", "additionalProperties": {"type": "string"}}
STRLIST = {"type": "array", "items": {"type": "string"}}
OPAQUE = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
INT_OR_STRING = {"x-kubernetes-int-or-string": True}
POD_TEMPLATE = {
    "type": "object",
    "description": POD_TEMPLATE_MARK + ": the pod template of this group.",
    "x-kubernetes-preserve-unknown-fields": True,
}
DURATION = {
    "type": "string",
    "pattern": (
        r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?"
        r"(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
    ),
}


def obj(props: dict[str, Any], required: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    d: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        d["required"] = required
    d.update(extra)
    return d


LABEL_SELECTOR = obj(
    {
        "matchLabels": STRMAP,
        "matchExpressions": {
            "type": "array",
            "items": obj(
                {
                    "key": S,
                    "operator": {
                        "type": "string",
                        "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                    },
                    "values": STRLIST,
                },
                required=["key", "operator"],
            ),
        },
    },
    **{"x-kubernetes-map-type": "atomic"},
)

# ---------------------------------------------------------------- KubeRay (ray.io/v1)
RAY_START_PARAMS = STRMAP
HEAD_GROUP = obj(
    {
        "serviceType": {"type": "string", "enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
        "headService": OPAQUE,
        "enableIngress": B,
        "rayStartParams": RAY_START_PARAMS,
        "template": POD_TEMPLATE,
    },
    required=["template"],
)
WORKER_GROUP = obj(
    {
        "groupName": {"type": "string", "minLength": 1},
        "replicas": {**I32, "minimum": 0},
        "minReplicas": {**I32, "minimum": 0},
        "maxReplicas": {**I32, "minimum": 0},
        "idleTimeoutSeconds": I32,
        "suspend": B,
        "numOfHosts": {**I32, "minimum": 1},
        "rayStartParams": RAY_START_PARAMS,
        "template": POD_TEMPLATE,
        "scaleStrategy": obj({"workersToDelete": STRLIST}),
    },
    required=["groupName", "template"],
)
RAY_CLUSTER_SPEC = obj(
    {
        "rayVersion": S,
        "enableInTreeAutoscaling": B,
        "autoscalerOptions": OPAQUE,
        "headServiceAnnotations": STRMAP,
        "suspend": B,
        "managedBy": S,
        "gcsFaultToleranceOptions": OPAQUE,
        "headGroupSpec": HEAD_GROUP,
        "workerGroupSpecs": {"type": "array", "items": WORKER_GROUP},
    },
    required=["headGroupSpec"],
)
RAY_JOB_SPEC = obj(
    {
        "entrypoint": S,
        "runtimeEnvYAML": S,
        "jobId": S,
        "metadata": STRMAP,
        "shutdownAfterJobFinishes": B,
        "ttlSecondsAfterFinished": {**I32, "minimum": 0},
        "activeDeadlineSeconds": {**I32, "minimum": 1},
        "backoffLimit": {**I32, "minimum": 0},
        "rayClusterSpec": RAY_CLUSTER_SPEC,
        "clusterSelector": STRMAP,
        "submitterPodTemplate": POD_TEMPLATE,
        "submitterConfig": obj({"backoffLimit": I32}),
        "submissionMode": {
            "type": "string",
            "enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"],
        },
        "entrypointNumCpus": {"type": "number"},
        "entrypointNumGpus": {"type": "number"},
        "entrypointResources": S,
        "suspend": B,
        "managedBy": S,
        "deletionStrategy": OPAQUE,
    },
)

# ------------------------------------------------- Prometheus operator (monitoring.coreos.com/v1)
RELABEL = obj(
    {
        "sourceLabels": STRLIST,
        "separator": S,
        "targetLabel": S,
        "regex": S,
        "modulus": I64,
        "replacement": S,
        "action": {
            "type": "string",
            "enum": [
                "replace",
                "Replace",
                "keep",
                "Keep",
                "drop",
                "Drop",
                "hashmod",
                "HashMod",
                "labelmap",
                "LabelMap",
                "labeldrop",
                "LabelDrop",
                "labelkeep",
                "LabelKeep",
                "lowercase",
                "Lowercase",
                "uppercase",
                "Uppercase",
                "keepequal",
                "KeepEqual",
                "dropequal",
                "DropEqual",
            ],
        },
    }
)
ENDPOINT_COMMON: dict[str, Any] = {
    "port": S,
    "targetPort": INT_OR_STRING,
    "path": S,
    "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
    "params": {"type": "object", "additionalProperties": STRLIST},
    "interval": DURATION,
    "scrapeTimeout": DURATION,
    "honorLabels": B,
    "honorTimestamps": B,
    "trackTimestampsStaleness": B,
    "relabelings": {"type": "array", "items": RELABEL},
    "metricRelabelings": {"type": "array", "items": RELABEL},
    "tlsConfig": OPAQUE,
    "bearerTokenSecret": OPAQUE,
    "authorization": OPAQUE,
    "basicAuth": OPAQUE,
    "oauth2": OPAQUE,
    "followRedirects": B,
    "enableHttp2": B,
    "filterRunning": B,
    "proxyUrl": S,
}
NAMESPACE_SELECTOR = obj({"any": B, "matchNames": STRLIST})
MONITOR_COMMON: dict[str, Any] = {
    "jobLabel": S,
    "podTargetLabels": STRLIST,
    "selector": LABEL_SELECTOR,
    "namespaceSelector": NAMESPACE_SELECTOR,
    "sampleLimit": I64,
    "targetLimit": I64,
    "labelLimit": I64,
    "labelNameLengthLimit": I64,
    "labelValueLengthLimit": I64,
    "keepDroppedTargets": I64,
    "scrapeProtocols": STRLIST,
    "attachMetadata": obj({"node": B}),
    "scrapeClass": S,
}
SERVICE_MONITOR_SPEC = obj(
    {
        **MONITOR_COMMON,
        "targetLabels": STRLIST,
        "endpoints": {"type": "array", "items": obj(dict(ENDPOINT_COMMON))},
    },
    required=["selector", "endpoints"],
)
POD_MONITOR_SPEC = obj(
    {
        **MONITOR_COMMON,
        "podMetricsEndpoints": {
            "type": "array",
            "items": obj({**ENDPOINT_COMMON, "portNumber": {**I32, "minimum": 1}}),
        },
    },
    required=["selector"],
)


def crd(
    group: str, kind: str, plural: str, short: list[str], spec: dict[str, Any], status: bool
) -> dict[str, Any]:
    schema = obj(
        {"apiVersion": S, "kind": S, "metadata": {"type": "object"}, "spec": spec},
        required=["spec"],
    )
    if status:
        schema["properties"]["status"] = OPAQUE
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "annotations": {"rlfleet.io/source": "deploy/schemas/gen_crds.py (structural subset)"},
        },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": kind + "List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short,
            },
            "versions": [version],
        },
    }


CRDS = {
    "rayjobs.ray.io.yaml": crd("ray.io", "RayJob", "rayjobs", [], RAY_JOB_SPEC, True),
    "rayclusters.ray.io.yaml": crd(
        "ray.io", "RayCluster", "rayclusters", [], RAY_CLUSTER_SPEC, True
    ),
    "servicemonitors.monitoring.coreos.com.yaml": crd(
        "monitoring.coreos.com",
        "ServiceMonitor",
        "servicemonitors",
        ["smon"],
        SERVICE_MONITOR_SPEC,
        False,
    ),
    "podmonitors.monitoring.coreos.com.yaml": crd(
        "monitoring.coreos.com", "PodMonitor", "podmonitors", ["pmon"], POD_MONITOR_SPEC, False
    ),
}


class _NoAliases(yaml.SafeDumper):
    """Shared sub-schemas are written out in full: no YAML anchors in a CRD."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> dict[str, str]:
    head = "# Generated by deploy/schemas/gen_crds.py: edit that file, then run it.\n"
    return {
        name: head + yaml.dump(doc, Dumper=_NoAliases, sort_keys=False)
        for name, doc in CRDS.items()
    }


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text)
        print(f"wrote {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
