"""`rlfleet rollout serve` (a replica) and `rlfleet rollout sample` (one group, printed)."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from rlfleet.service import add_common_args, serve_forever, settings_or_exit


def _serve(args: argparse.Namespace) -> int:
    from rlfleet.config import ConfigError
    from rlfleet.policy.loading import CheckpointError
    from rlfleet_rollout.server import build_replica
    from rlfleet_rollout.settings import RolloutSettings

    settings = settings_or_exit(RolloutSettings, args, "rollout")
    try:
        replica = build_replica(settings)
    except (ConfigError, CheckpointError) as exc:
        raise SystemExit(f"rlfleet rollout: {exc}") from None
    try:
        return serve_forever(replica.server, f"rollout replica {settings.replica_id}",
                             on_stop=replica.stop, until_ready=replica.until_ready)
    finally:
        replica.close()


def _sample(args: argparse.Namespace) -> int:
    import grpc

    from rlfleet.v1 import common_pb2, rollout_pb2

    request = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task=args.task, seed=args.seed, size=args.size,
                                 max_turns=args.max_turns),
        group_size=args.group_size,
        sampling=rollout_pb2.SamplingParams(temperature=args.temperature,
                                            max_new_tokens=args.max_new_tokens,
                                            seed=args.sampling_seed),
        idempotency_key=args.key or uuid.uuid4().hex,
        env_address=args.env_address or "",
        context=args.context,
    )
    try:
        for t in _trajectories(args, request):
            doc = {
                "index": t.index, "reward": t.reward, "solved": t.solved,
                "components": dict(t.reward_components), "turns": len(t.turns),
                "tokens": len(t.token_ids), "model_tokens": sum(t.loss_mask),
                "adapter_version": t.adapter.version, "replica": t.replica_id,
                "actions": [turn.text for turn in t.turns],
                "feedback": [turn.feedback for turn in t.turns][-3:],
                "total_s": round(t.timings.total_s, 3),
            }
            print(json.dumps(doc))
    except grpc.RpcError as err:
        print(f"rollout sample: {err.code().name}: {err.details()}", file=sys.stderr)
        return 1
    return 0


def _trajectories(args: argparse.Namespace, request):  # noqa: ANN001, ANN202
    """From a running replica (--target), or from a policy loaded in this process."""
    from rlfleet.config import read_secret
    from rlfleet.rpc.client import RpcClient
    from rlfleet.v1 import rollout_pb2_grpc

    if args.target:
        client = RpcClient(args.target, token=read_secret("RLFLEET_AUTH_TOKEN"), timeout_s=600)
        yield from client.stream(rollout_pb2_grpc.RolloutServiceStub, "RolloutGroup", request)
        return
    if not args.env_address:
        raise SystemExit("rollout sample: give --target (a replica) or --env-address")
    from rlfleet_rollout.adapters import LiveAdapter
    from rlfleet_rollout.server import build_replica
    from rlfleet_rollout.settings import RolloutSettings

    settings = RolloutSettings(env_address=args.env_address, model=args.model,
                               metrics_port=None, port=0)
    replica = build_replica(settings)
    try:
        yield from replica.player.play(request, LiveAdapter.base(settings.run), lambda: True)
    finally:
        replica.close()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rollout", help="rollout replicas")
    p_sub = p.add_subparsers(dest="subcommand", required=True)
    serve = p_sub.add_parser("serve", help="serve a rollout replica")
    add_common_args(serve, port=50052, metrics_port=9102)
    for flag, kind in (("--engine", str), ("--profile", str), ("--model", Path),
                       ("--model-cache", Path), ("--device", str), ("--torch-threads", int),
                       ("--env-address", str), ("--reward-address", str),
                       ("--redis-url", str), ("--sync-address", str), ("--runs-root", Path),
                       ("--run", str), ("--replica-id", str), ("--advertise-address", str),
                       ("--max-batch", int), ("--max-groups", int), ("--max-episodes", int),
                       ("--adapter-wait-s", float), ("--max-staleness", int), ("--cell-px", int),
                       ("--heartbeat-s", float), ("--heartbeat-ttl-s", float)):
        serve.add_argument(flag, type=kind, default=None)
    serve.add_argument("--engine-args", type=json.loads, default=None,
                       help='engine keyword arguments as JSON, e.g. \'{"dtype": "float32"}\'')
    serve.set_defaults(func=_serve)

    sample = p_sub.add_parser("sample", help="roll out one group and print the trajectories")
    sample.add_argument("--target", default=None,
                        help="HOST:PORT of a rollout replica (default: play in this process "
                             "with --model against --env-address)")
    sample.add_argument("--model", type=Path, default=None,
                        help="model dir for in-process play (default: the tiny base)")
    sample.add_argument("--env-address", default=None)
    sample.add_argument("--task", default="maze_2d")
    sample.add_argument("--seed", type=int, default=1_000_000)
    sample.add_argument("--size", type=int, default=0)
    sample.add_argument("--max-turns", type=int, default=0)
    sample.add_argument("--group-size", type=int, default=4)
    sample.add_argument("--temperature", type=float, default=1.0)
    sample.add_argument("--max-new-tokens", type=int, default=8)
    sample.add_argument("--sampling-seed", type=int, default=0)
    sample.add_argument("--context", default="full", choices=["full", "last_frame", "frame_only"])
    sample.add_argument("--key", default=None, help="idempotency key (default: random)")
    sample.set_defaults(func=_sample)
