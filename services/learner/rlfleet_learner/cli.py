"""`rlfleet learner ...`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("learner", help="the learner service (not yet available)")
