"""`rlfleet ckptsync ...`."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("ckptsync", help="the ckptsync service (not yet available)")
