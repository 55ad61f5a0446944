"""`path-efficiency-reward` / `python -m path_efficiency_reward`: serve the reward with
rlfleet's standard flags (--port, --metrics-port, --host, --config, --log-level,
--grace-s, --insecure-no-auth) and RLFLEET_<KEY> environment overrides."""

from __future__ import annotations

import sys

from path_efficiency_reward import reward
from rlfleet.reward import main as serve_main


def main(argv: list[str] | None = None) -> int:
    return serve_main(reward, argv, prog="path-efficiency-reward", port=50051,
                      metrics_port=9101)


if __name__ == "__main__":
    sys.exit(main())
