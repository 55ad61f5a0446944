"""`rlfleet sft`: the supervised warm start of the tiny policy (see rlfleet.sft.train)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from rlfleet.cliargs import Parser
from rlfleet.policy.contexts import PER_TURN_CONTEXTS


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="output model directory")
    p.add_argument("--size", type=int, default=7, help="maze size (odd, walls included)")
    p.add_argument("--steps", type=int, default=None,
                   help="optimizer steps (default: none: give --steps, --minutes or both)")
    p.add_argument("--minutes", type=float, default=None,
                   help="training-time budget (evaluation not counted); with --steps, "
                        "whichever ends first")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate")
    p.add_argument("--batch", type=int, default=64, help="examples per optimizer step")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and the init")
    p.add_argument("--base", type=Path, default=None,
                   help="base model directory (default: the tiny base in $RLFLEET_CACHE)")
    p.add_argument("--layers", type=int, default=None,
                   help="language-model layers of a fresh tiny base (default: 4); not with --base")
    p.add_argument("--warmup", type=int, default=20, help="linear warm-up steps")
    p.add_argument("--schedule", default="constant", choices=["constant", "cosine", "linear"],
                   help="learning rate after the warm-up")
    p.add_argument("--decay-steps", type=int, default=None,
                   help="where a cosine/linear decay ends (default: --steps)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="lr at the end of the decay, as a share of --lr")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    p.add_argument("--grad-clip", type=float, default=1.0,
                   help="clip the gradient norm to this")
    p.add_argument("--qk-gain", type=float, default=1.0,
                   help="start the language model's q/k RMSNorm gains at this value (fresh "
                        "base: 1.0), which lets attention get sharp enough to read the maze")
    p.add_argument("--agent-aux", type=float, default=0.0,
                   help="weight of an auxiliary loss at the agent cell's image token: "
                        "cross entropy against a uniform choice of the legal moves")
    p.add_argument("--feedback-aux", type=float, default=0.0,
                   help="weight of an auxiliary loss at the position before the action "
                        "token: cross entropy against the move the feedback sentence "
                        "reports, so the last move stays readable there")
    p.add_argument("--context", choices=PER_TURN_CONTEXTS, default="last_frame",
                   help="prompt format to train and evaluate (rlfleet.policy.contexts); "
                        "serve the model with the same context")
    p.add_argument("--short-steps", type=int, default=0,
                   help="curriculum: the first N steps use the frame_only wording (frame + "
                        "feedback); later steps and evaluation use --context")
    p.add_argument("--log-every", type=int, default=10, help="log a line every N steps")
    p.add_argument("--eval-every", type=int, default=0,
                   help="greedy eval on the 64 eval mazes every N steps (0: only at the end)")
    p.add_argument("--snapshots", action="store_true",
                   help="save the model at every in-training eval under OUT/snapshots/")
    p.add_argument("--no-eval", action="store_true", help="skip the final evaluation")
    p.add_argument("--no-heldout", action="store_true",
                   help="final evaluation on the 64 eval mazes only")
    p.add_argument("--max-turns", type=int, default=None,
                   help="turn limit (default: the size's, 20 up to 9x9)")
    p.add_argument("--episodes-per-maze", type=int, default=2,
                   help="played episodes (oracle with prob p, random move otherwise) per maze")
    p.add_argument("--p-oracle", default="0.5:0.9",
                   help="MIN:MAX of the per-episode oracle probability")
    p.add_argument("--no-floor-cells", action="store_true",
                   help="leave out the every-floor-cell states")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1 is fastest on shared CPUs)")


def _command_line(argv: list[str]) -> str:
    args = argv[argv.index("sft") + 1:] if "sft" in argv else argv[1:]
    return "rlfleet sft " + shlex.join(args)


def run(args: argparse.Namespace) -> int:
    import torch

    from rlfleet.sft.data import DataMix
    from rlfleet.sft.train import SFTConfig, train_sft

    torch.set_num_threads(args.threads)
    try:
        lo, hi = (float(x) for x in args.p_oracle.split(":"))
    except ValueError:
        print(f"rlfleet sft: --p-oracle must be MIN:MAX, got {args.p_oracle!r}", file=sys.stderr)
        return 2
    try:
        cfg = SFTConfig(
            out=args.out, size=args.size, steps=args.steps, minutes=args.minutes, lr=args.lr,
            batch=args.batch, seed=args.seed, base=args.base, layers=args.layers,
            warmup=args.warmup,
            schedule=args.schedule, decay_steps=args.decay_steps,
            min_lr_ratio=args.min_lr_ratio,
            weight_decay=args.weight_decay, grad_clip=args.grad_clip,
            short_steps=args.short_steps, context=args.context,
            qk_gain=args.qk_gain, agent_aux=args.agent_aux,
            feedback_aux=args.feedback_aux,
            log_every=args.log_every, eval_every=args.eval_every, snapshots=args.snapshots,
            final_eval=not args.no_eval, heldout=not args.no_heldout,
            max_turns=args.max_turns,
            mix=DataMix(floor_cells=not args.no_floor_cells,
                         episodes_per_maze=args.episodes_per_maze,
                         p_oracle_min=lo, p_oracle_max=hi),
            command=getattr(args, "command_line", None) or _command_line(sys.argv),
        )
    except ValueError as e:
        print(f"rlfleet sft: {e}", file=sys.stderr)
        return 2
    train_sft(cfg, log=lambda line: print(line, flush=True))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds `rlfleet sft` to the `rlfleet` command."""
    p = sub.add_parser("sft", help="supervised warm start of the tiny policy on oracle mazes",
                       description=__doc__)
    _add_arguments(p)
    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="rlfleet")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
