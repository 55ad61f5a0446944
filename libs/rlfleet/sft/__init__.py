"""Supervised warm start (SFT) of the policy on BFS-oracle maze states.

- ``rlfleet.sft.data``: examples in the rollout service's ``last_frame`` format, from
  played episodes (oracle with probability p, random moves otherwise) and every floor cell.
- ``rlfleet.sft.evaluate.evaluate_greedy``: in-process greedy play, true solve rate.
- ``rlfleet.sft.train.train_sft``: full-weight SFT, writes an HF model directory.
- ``rlfleet.sft.cli.register``: the ``rlfleet sft`` command.
"""

from rlfleet.sft.data import (
    DataMix,
    SFTExample,
    encode_example,
    example_stream,
    floor_cell_examples,
    maze_examples,
    played_examples,
)
from rlfleet.sft.evaluate import evaluate_greedy, solve_rate_stderr
from rlfleet.sft.train import SFTConfig, save_policy, train_sft

__all__ = [
    "DataMix",
    "SFTConfig",
    "SFTExample",
    "encode_example",
    "evaluate_greedy",
    "example_stream",
    "floor_cell_examples",
    "maze_examples",
    "played_examples",
    "save_policy",
    "solve_rate_stderr",
    "train_sft",
]
