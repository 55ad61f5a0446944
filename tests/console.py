"""What a learner's console for a person (RLFLEET_CONSOLE=human) must look like, checked
the same way wherever it is read: `rlfleet learner submit --wait`, a pod's log."""

from __future__ import annotations

import re

RAY_INFO_LINE = re.compile(r"^\S+ \S+\s+INFO \S+:\d+ -- ")


def assert_readable_log(text: str, steps: int) -> None:
    """A learner's log for a person (--console human): a line per step, no JSON, no
    library INFO lines in Ray's format, no progress bars or terminal control codes."""
    lines = text.splitlines()
    for step in range(1, steps + 1):
        assert any(line.startswith(f"step {step:>3}/{steps}") for line in lines), text
    assert not any(line.lstrip().startswith("{") for line in lines), text
    assert not any(RAY_INFO_LINE.match(line) for line in lines), text
    assert "\x1b[" not in text and "\r" not in text and "%|" not in text, text
    assert "UserWarning" not in text, text  # a library's Python warning
