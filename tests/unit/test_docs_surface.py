"""What a newcomer reads first stays short and speaks to users: the README's length, and
no reference to this project's tracker in the product's code, configs or docs."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200
PRODUCT = ("libs", "services", "configs", "docs", "deploy", "README.md")
# "#12" as an issue or "issue 12" / "issues 3" in prose; hex colours and anchors are not
TRACKER = re.compile(r"(?<![\w&/#-])#\d{1,4}\b(?![\w-])|\bissues? #?\d+\b", re.IGNORECASE)


def tracked(*paths: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / p for p in out if not p.endswith((".png", ".safetensors", ".jpg"))]


def test_the_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_no_tracker_reference_in_the_product() -> None:
    found = []
    for path in tracked(*PRODUCT):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if TRACKER.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "tracker references:\n" + "\n".join(found)
