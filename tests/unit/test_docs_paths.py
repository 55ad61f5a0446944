"""Every repository path the docs (README.md, docs/*.md) name in backticks exists: a file or
folder moved or removed takes its mentions with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# what a repository path starts with: a top-level folder, or a file at the root
TOP_FOLDERS = ("bench", "configs", "deploy", "docs", "examples", "libs", "protos", "scripts",
               "services", "tests")
ROOT_FILES = ("Dockerfile", "Makefile", "README.md", "pyproject.toml", "requirements.txt")
# written by a command, never kept in the repository (.gitignore): the benches' output,
# the stubs `make proto` generates
OUTPUTS = ("bench/results/", "libs/rlfleet/v1/")
CODE = re.compile(r"`([^`\n]+)`")
# a placeholder or a shell variable is not a path of the repository
TEMPLATE = re.compile(r"[<>$…]|\.\.\.|\{[^}]*\}|[A-Z_]+=")


def named_paths(text: str) -> list[str]:
    """The repository paths among the backticked spans of one document."""
    paths = []
    for span in CODE.findall(text):
        word = span.strip().split()[0] if span.strip() else ""
        word = word.split("::")[0].rstrip(".,;:)")  # a pytest node id names its file
        if TEMPLATE.search(word):
            continue
        first = word.split("/")[0]
        if (first in TOP_FOLDERS and "/" in word) or word in ROOT_FILES:
            paths.append(word)
    return paths


def exists(path: str) -> bool:
    if path.startswith(OUTPUTS):
        return True
    if any(c in path for c in "*?["):
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = sorted({p for p in named_paths(doc.read_text()) if not exists(p)})
    assert missing == [], f"{doc.relative_to(ROOT)} names paths that do not exist"


def test_paths_are_found_in_backticks() -> None:
    text = ("`libs/rlfleet/defaults.py` and `tests/unit/test_x.py::test_y`, "
            "`make run`, `services/<name>/cli.py`, `Dockerfile`, `rlfleet.defaults`")
    assert named_paths(text) == ["libs/rlfleet/defaults.py", "tests/unit/test_x.py",
                                 "Dockerfile"]
