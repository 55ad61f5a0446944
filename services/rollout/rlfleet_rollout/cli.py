"""`rlfleet rollout ...`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("rollout", help="the rollout service (not yet available)")
