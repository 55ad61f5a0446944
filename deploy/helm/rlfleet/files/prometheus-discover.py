"""Service discovery for Debian's Prometheus, which is built without the Kubernetes one:
every INTERVAL seconds, list the namespace's pods that match SELECTOR through the
Kubernetes API (the pod's service-account token; the chart's Role lets it list pods) and
write those that ask to be scraped (the prometheus.io/scrape, /port and /path annotations)
as a file_sd target file, labelled with namespace, pod, component, Ray node, env and reward
service. Replaced atomically, so Prometheus never reads half a file.

    python3 prometheus-discover.py OUT.json LABEL_SELECTOR INTERVAL_S

Standard library only: it runs in the Prometheus image (Debian's python3)."""

from __future__ import annotations

import json
import os
import ssl
import sys
import time
import urllib.parse
import urllib.request

ACCOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
LABELS = {  # target label: pod label
    "component": "app.kubernetes.io/component",
    "ray_node": "rlfleet.io/ray-node",
    "env": "rlfleet.io/env",
    "reward": "rlfleet.io/reward",
}


def targets(pods: list[dict], namespace: str) -> list[dict]:
    groups = []
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        notes = meta.get("annotations") or {}
        ip, port = status.get("podIP"), notes.get("prometheus.io/port")
        if notes.get("prometheus.io/scrape") != "true" or not ip or not port \
                or status.get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        labels = meta.get("labels") or {}
        group = {"namespace": namespace, "pod": meta["name"],
                 "__metrics_path__": notes.get("prometheus.io/path", "/metrics")}
        group.update({k: labels[v] for k, v in LABELS.items() if labels.get(v)})
        groups.append({"targets": [f"{ip}:{port}"], "labels": group})
    return sorted(groups, key=lambda g: g["labels"]["pod"])


def main(argv: list[str]) -> int:
    out, selector, interval = argv[0], argv[1], float(argv[2])
    with open(f"{ACCOUNT}/namespace") as f:
        namespace = f.read().strip()
    server = (f"https://{os.environ['KUBERNETES_SERVICE_HOST']}:"
              f"{os.environ['KUBERNETES_SERVICE_PORT']}")
    url = (f"{server}/api/v1/namespaces/{namespace}/pods?"
           + urllib.parse.urlencode({"labelSelector": selector}))
    context = ssl.create_default_context(cafile=f"{ACCOUNT}/ca.crt")
    last = None
    while True:
        try:
            with open(f"{ACCOUNT}/token") as f:  # re-read: the kubelet rotates it
                token = f.read().strip()
            request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request, context=context, timeout=10) as response:
                found = targets(json.load(response)["items"], namespace)
            if found != last:
                with open(out + ".tmp", "w") as f:
                    json.dump(found, f, indent=1)
                os.replace(out + ".tmp", out)
                print(f"discover: {len(found)} targets: "
                      + ", ".join(g["labels"]["pod"] for g in found), flush=True)
                last = found
        except (OSError, ValueError, KeyError) as exc:
            print(f"discover: {url}: {exc}", file=sys.stderr, flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
