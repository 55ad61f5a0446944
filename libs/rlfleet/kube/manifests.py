"""Offline validation of rendered Kubernetes manifests (e.g. `helm template` output).

Built-in kinds are checked with kubernetes-validate's strict schemas for one Kubernetes
version (unknown fields rejected). Custom resources are checked against the structural
CRD schemas kept in deploy/schemas/crds (and its subdirectories: cert-manager's
Certificate and Issuer), made strict here: unknown fields are rejected,
int-or-string fields accept either, and embedded pod templates (RayJob/RayCluster groups)
are checked against the Kubernetes PodTemplateSpec schema of the same version. A kind with
no schema is an error, never a warning.

    helm template rlfleet deploy/helm/rlfleet -f VALUES | python -m rlfleet.kube.manifests -
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

DEFAULT_KUBE_VERSION = "1.33.0"
# The repository's CRD schemas, relative to the current directory: the validator is run
# from the repository root (an installed rlfleet knows no checkout); elsewhere pass the
# directory (--crds, `crd_dir`).
DEFAULT_CRD_DIR = Path("deploy", "schemas", "crds")
POD_TEMPLATE_MARK = "PodTemplateSpec (core/v1)"
_DEFS_ID = "https://kubernetes.io/api/_definitions.json"


@dataclass(frozen=True)
class Problem:
    """One validation failure of one object."""

    obj: str  # "Kind/name"
    message: str

    def __str__(self) -> str:
        return f"{self.obj}: {self.message}"


def _schema_dir(kube_version: str) -> Any:
    from kubernetes_validate import utils

    want = tuple(int(x) for x in kube_version.lstrip("v").split(".")[:2])
    versions = [v for v in utils.all_versions() if tuple(int(x) for x in v.split(".")[:2]) <= want]
    if not versions:
        raise ValueError(f"kubernetes-validate has no schemas for Kubernetes {kube_version}")
    root = resources.files("kubernetes_validate").joinpath("kubernetes-json-schema")
    return root.joinpath(f"v{versions[-1]}-local-strict")


def _strict(node: Any) -> Any:
    """A CRD structural schema node as a strict JSON Schema (2020-12) node."""
    if not isinstance(node, dict):
        return node
    preserve = bool(node.get("x-kubernetes-preserve-unknown-fields"))
    if preserve and str(node.get("description", "")).startswith(POD_TEMPLATE_MARK):
        return {"$ref": f"{_DEFS_ID}#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}
    if node.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in out:
        out["properties"] = {k: _strict(v) for k, v in out["properties"].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    if "items" in out:
        out["items"] = _strict(out["items"])
    if out.get("type") == "object" and "properties" in out and not preserve:
        out.setdefault("additionalProperties", False)
    return out


def load_crd_schemas(crd_dir: Path = DEFAULT_CRD_DIR) -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict JSON Schema, from the CRD files in crd_dir."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    # Subdirectories too: deploy/schemas/crds/cert-manager holds cert-manager's Certificate
    # and Issuer, for validation only (`kubectl apply -f crds` leaves them out: a cluster
    # with those kinds registered makes the chart ask cert-manager for its certificates).
    files = sorted(Path(crd_dir).rglob("*.yaml"))
    if not files:
        where = "" if Path(crd_dir).is_absolute() else f" (under {Path.cwd()})"
        raise FileNotFoundError(f"no CRD schemas (*.yaml) in {crd_dir}{where}: run from the "
                                "repository root or give the directory (--crds DIR)")
    for path in files:
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                api_version = f"{spec['group']}/{version['name']}"
                kind = spec["names"]["kind"]
                schema = _strict(version["schema"]["openAPIV3Schema"])
                schema["properties"]["apiVersion"] = {"const": api_version}
                schema["properties"]["kind"] = {"const": kind}
                schema["properties"]["metadata"] = {
                    "$ref": f"{_DEFS_ID}#/$defs/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
                }
                schema["required"] = sorted(
                    {"apiVersion", "kind", "metadata", *schema.get("required", [])}
                )
                out[(api_version, kind)] = schema
    return out


class Validator:
    """Validates manifests for one Kubernetes version plus this repo's custom resources."""

    def __init__(
        self, kube_version: str = DEFAULT_KUBE_VERSION, crd_dir: Path = DEFAULT_CRD_DIR
    ) -> None:
        import jsonschema
        from referencing import Registry, Resource

        self.kube_version = kube_version
        self._crds = load_crd_schemas(crd_dir)
        defs = json.loads(_schema_dir(kube_version).joinpath("_definitions.json").read_text())
        self._registry = Resource.from_contents(defs) @ Registry()
        self._jsonschema = jsonschema

    def validate(self, obj: dict[str, Any]) -> list[Problem]:
        from kubernetes_validate import utils as kv

        if not isinstance(obj, dict):
            return [Problem("?", f"not a mapping: {type(obj).__name__}")]
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        name = (obj.get("metadata") or {}).get("name", "?")
        ident = f"{kind}/{name}"
        if not kind or not api_version:
            return [Problem(ident, "apiVersion and kind are required")]
        schema = self._crds.get((api_version, kind))
        if schema is not None:
            validator = self._jsonschema.Draft202012Validator(schema, registry=self._registry)
            return [
                Problem(
                    ident, f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
                )
                for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.path))
            ]
        try:
            kv.validate(obj, self.kube_version, strict=True)
        except kv.SchemaNotFoundError:
            return [
                Problem(
                    ident,
                    f"unknown kind {kind} ({api_version}): no schema for Kubernetes "
                    f"{self.kube_version} and no CRD schema in deploy/schemas/crds",
                )
            ]
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path) or "<root>"
            return [Problem(ident, f"{path}: {e.message}")]
        return []

    def validate_all(self, objs: Iterable[Any]) -> list[Problem]:
        problems: list[Problem] = []
        for obj in objs:
            if obj is None:  # empty YAML documents
                continue
            problems.extend(self.validate(obj))
        return problems


def load_documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m rlfleet.kube.manifests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("files", nargs="+", help="YAML files ('-' = standard input)")
    ap.add_argument("-k", "--kube-version", default=DEFAULT_KUBE_VERSION)
    ap.add_argument("--crds", type=Path, default=DEFAULT_CRD_DIR,
                    help="CRD schema directory (default: %(default)s, from the current "
                         "directory)")
    args = ap.parse_args(argv)
    try:
        validator = Validator(args.kube_version, args.crds)
    except FileNotFoundError as exc:
        ap.exit(2, f"{ap.prog}: {exc}\n")
    failed = 0
    total = 0
    for f in args.files:
        docs = load_documents(sys.stdin.read() if f == "-" else Path(f).read_text())
        total += len(docs)
        for p in validator.validate_all(docs):
            failed += 1
            print(f"ERROR {f}: {p}")
    print(
        f"{total} objects checked against Kubernetes {args.kube_version}: "
        f"{'no problems' if not failed else f'{failed} problems'}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
