"""Supervised warm start (SFT) of the policy on BFS-oracle maze states.

- ``rlfleet.sft.data``: examples in the rollout service's ``last_frame`` format, from
  played episodes (oracle with probability p, random moves otherwise) and every floor cell.
- ``rlfleet.sft.evaluate.evaluate_greedy``: in-process greedy play, true solve rate.
- ``rlfleet.sft.train.train_sft``: full-weight SFT, writes an HF model directory.
- ``rlfleet.sft.cli.register``: the ``rlfleet sft`` command.
"""

from rlfleet.lazy import lazy_exports

# each public name -> the submodule that defines it, imported on first use
_EXPORTS = {
    "DataMix": "rlfleet.sft.data",
    "SFTConfig": "rlfleet.sft.train",
    "SFTExample": "rlfleet.sft.data",
    "encode_example": "rlfleet.sft.data",
    "evaluate_greedy": "rlfleet.sft.evaluate",
    "example_stream": "rlfleet.sft.data",
    "floor_cell_examples": "rlfleet.sft.data",
    "maze_examples": "rlfleet.sft.data",
    "played_examples": "rlfleet.sft.data",
    "save_policy": "rlfleet.sft.train",
    "solve_rate_stderr": "rlfleet.sft.evaluate",
    "train_sft": "rlfleet.sft.train",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
