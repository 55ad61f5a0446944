#!/usr/bin/env python3
"""Keep dnsmasq's hosts file in step with the cluster's Services: the job kube-dns or
CoreDNS does in a full cluster (no registry here holds their images).

  <clusterIP>  NAME.NS.svc.cluster.local               for a Service with a cluster IP
  <pod IP>     NAME.NS.svc.cluster.local               for a headless one, each endpoint
  <pod IP>     HOSTNAME.NAME.NS.svc.cluster.local      and its pods by hostname

Polls the API server once a second (stdlib only: it runs on the host's python3), rewrites
the file when it changed and sends dnsmasq SIGHUP, which re-reads it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import ssl
import sys
import time
import urllib.request
from pathlib import Path

DOMAIN = "svc.cluster.local"


def _get(ctx: ssl.SSLContext, server: str, path: str) -> dict:
    with urllib.request.urlopen(server + path, context=ctx, timeout=5) as resp:
        return json.load(resp)


def hosts_lines(services: dict, endpoints: dict) -> list[str]:
    """The hosts-file lines for these Service and Endpoints lists (sorted, stable)."""
    lines: set[str] = set()
    headless: set[tuple[str, str]] = set()
    for svc in services.get("items", []):
        meta, spec = svc["metadata"], svc.get("spec", {})
        fqdn = f"{meta['name']}.{meta['namespace']}.{DOMAIN}"
        ip = spec.get("clusterIP")
        if ip and ip != "None":
            lines.add(f"{ip} {fqdn}")
        elif spec.get("type", "ClusterIP") == "ClusterIP":
            headless.add((meta["namespace"], meta["name"]))
    for ep in endpoints.get("items", []):
        meta = ep["metadata"]
        if (meta["namespace"], meta["name"]) not in headless:
            continue
        fqdn = f"{meta['name']}.{meta['namespace']}.{DOMAIN}"
        for subset in ep.get("subsets") or []:
            for addr in subset.get("addresses") or []:
                lines.add(f"{addr['ip']} {fqdn}")
                if addr.get("hostname"):
                    lines.add(f"{addr['ip']} {addr['hostname']}.{fqdn}")
    return sorted(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="https://127.0.0.1:6443")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--hosts", required=True, type=Path)
    parser.add_argument("--pid-file", required=True, type=Path)
    args = parser.parse_args(argv)
    ctx = ssl.create_default_context(cafile=args.ca)
    ctx.load_cert_chain(args.cert, args.key)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    current = None
    while True:
        try:
            lines = hosts_lines(_get(ctx, args.server, "/api/v1/services"),
                                _get(ctx, args.server, "/api/v1/endpoints"))
        except OSError as exc:  # the API server restarting: try again next second
            print(f"cluster-dns: {exc}", file=sys.stderr, flush=True)
            lines = current
        if lines is not None and lines != current:
            tmp = args.hosts.with_suffix(".tmp")
            tmp.write_text("".join(f"{line}\n" for line in lines))
            os.replace(tmp, args.hosts)
            try:
                os.kill(int(args.pid_file.read_text().strip()), signal.SIGHUP)
            except (OSError, ValueError):
                pass  # dnsmasq not up yet: it reads the file when it starts
            print(f"cluster-dns: {len(lines)} names", file=sys.stderr, flush=True)
            current = lines
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
