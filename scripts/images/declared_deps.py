#!/usr/bin/env python3
"""Print the requirements that pyproject.toml declares for the given extras, one a line.

The images install a service's dependencies from this list (and the lock file as
constraints) before the code, so a code change does not reinstall torch. Self-references
such as `rlfleet[rollout]` are expanded. Stdlib only: it runs on a bare base image.

    declared_deps.py [--pyproject FILE] EXTRA[,EXTRA...]
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path


def declared(project: dict, extras: list[str]) -> list[str]:
    """Core dependencies plus every requirement of `extras`, self-references expanded."""
    name = project["name"]
    optional = project.get("optional-dependencies", {})
    self_ref = re.compile(rf"^{re.escape(name)}\[([^\]]+)\]$")
    seen_extras: set[str] = set()
    out: list[str] = list(project.get("dependencies", []))

    def add(extra: str) -> None:
        if extra in seen_extras:
            return
        if extra not in optional:
            raise SystemExit(f"declared_deps: unknown extra {extra!r}; known: {sorted(optional)}")
        seen_extras.add(extra)
        for req in optional[extra]:
            m = self_ref.match(req.replace(" ", ""))
            if m:
                for sub in m.group(1).split(","):
                    add(sub)
            elif req not in out:
                out.append(req)

    for extra in extras:
        if extra:
            add(extra)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("extras", help="comma-separated extras, e.g. env or rollout,learner")
    parser.add_argument("--pyproject", default="pyproject.toml")
    args = parser.parse_args(argv)
    project = tomllib.loads(Path(args.pyproject).read_text())["project"]
    print("\n".join(declared(project, args.extras.split(","))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
