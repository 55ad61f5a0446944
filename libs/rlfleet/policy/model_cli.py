"""`rlfleet model init-tiny DIR`: put the tiny policy (random weights from its config, no
download) at DIR, once. The chart's local profile runs it in an init container of every pod
that loads the model, so /shared/models/tiny exists before a replica or the learner starts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _init_tiny(args: argparse.Namespace) -> int:
    from rlfleet.policy.tiny import install_tiny_model

    try:
        path = install_tiny_model(Path(args.dir), seed=args.seed)
    except (OSError, FileExistsError) as exc:
        print(f"rlfleet model init-tiny: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    model = sub.add_parser("model", help="base-model utilities")
    msub = model.add_subparsers(dest="model_command", required=True)
    tiny = msub.add_parser("init-tiny", help="build the tiny policy into DIR unless it is there",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    tiny.add_argument("dir", help="target directory, e.g. /shared/models/tiny")
    tiny.add_argument("--seed", type=int, default=0, help="weight-initialisation seed")
    tiny.set_defaults(func=_init_tiny)
