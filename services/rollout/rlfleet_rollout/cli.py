"""`rlfleet rollout serve` (a replica) and `rlfleet rollout sample` (one group, printed)."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from rlfleet.cliargs import (
    Deferred,
    add_common_args,
    add_setting,
    address,
    directory,
    field_choices,
    one_line,
    optional_address,
)
from rlfleet.names import CONTEXTS
from rlfleet.policy.profiles import profile_names

# named, not imported: registering the command must not import pydantic, torch or grpc
SETTINGS = "rlfleet_rollout.settings:RolloutSettings"


def _serve(args: argparse.Namespace) -> int:
    from rlfleet.service import serve_forever, settings_or_exit
    from rlfleet_rollout.settings import RolloutSettings

    # settings (and their ports) first: a bad flag fails before torch loads
    settings = settings_or_exit(RolloutSettings, args, "rollout")
    from rlfleet.config import ConfigError
    from rlfleet.policy.loading import ModelLoadError
    from rlfleet_rollout.server import build_replica

    try:
        replica = build_replica(settings)
    except (ConfigError, ModelLoadError) as exc:
        raise SystemExit(f"rlfleet rollout: {one_line(exc)}") from None
    try:
        code = serve_forever(replica.server, f"rollout replica {settings.replica_id}",
                             on_stop=replica.stop, until_ready=replica.until_ready)
    finally:
        replica.close()
    if replica.engine_dead is not None:  # non-zero: the Deployment starts a fresh replica
        raise SystemExit(f"rlfleet rollout: the engine died ({replica.engine_dead}); "
                         "exiting to be restarted")
    return code


def _sample(args: argparse.Namespace) -> int:
    from rlfleet.names import to_wire
    from rlfleet.rpc.errors import RpcError
    from rlfleet.v1 import common_pb2, rollout_pb2

    request = rollout_pb2.GroupRequest(
        task=common_pb2.TaskSpec(task=args.task, seed=args.seed, size=args.size,
                                 max_turns=args.max_turns),
        group_size=args.group_size,
        sampling=rollout_pb2.SamplingParams(temperature=args.temperature,
                                            max_new_tokens=args.max_new_tokens,
                                            seed=args.sampling_seed),
        idempotency_key=args.key or uuid.uuid4().hex,
        context_mode=to_wire(common_pb2.Context, args.context),
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
    except RpcError as err:
        print(f"rollout sample: {err.code.name}: {err.message}", file=sys.stderr)
        return 1
    return 0


def _trajectories(args: argparse.Namespace, request):  # noqa: ANN001, ANN202
    """From a running replica (--target), or from a policy loaded in this process."""
    from rlfleet.clients.rollout import RolloutClient
    from rlfleet.config import read_secret

    if args.target:
        client = RolloutClient(args.target, token=read_secret("RLFLEET_AUTH_TOKEN"),
                               timeout_s=600)
        yield from client.stream(request)
        return
    if not args.env_address:
        raise SystemExit("rollout sample: give --target (a replica) or --env-address")
    from rlfleet_rollout.loaded_adapters import LiveAdapter
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
    add_common_args(serve, SETTINGS)
    # every flag's help is its settings field's description (RolloutSettings)
    flag = lambda name, **kw: add_setting(serve, name, SETTINGS, **kw)  # noqa: E731
    flag("--engine", choices=field_choices(SETTINGS, "engine"))
    flag("--engine-args", type=json.loads)
    flag("--profile", choices=Deferred(profile_names))  # a package may add profiles
    flag("--model", type=directory, metavar="DIR")
    flag("--model-cache", type=Path, metavar="DIR")
    flag("--device")
    flag("--torch-threads", type=int, metavar="N")
    flag("--env-address", type=address, metavar="HOST:PORT")
    flag("--reward-address", type=optional_address, metavar="HOST:PORT")
    flag("--redis-url", metavar="URL")
    flag("--sync-address", type=optional_address, metavar="HOST:PORT")
    flag("--runs-root", type=Path, metavar="DIR")
    flag("--run")
    flag("--replica-id")
    flag("--advertise-address", type=optional_address, metavar="HOST:PORT")
    flag("--max-batch", type=int, metavar="N")
    flag("--max-groups", type=int, metavar="N")
    flag("--max-episodes", type=int, metavar="N")
    flag("--adapter-wait-s", type=float, metavar="SECONDS")
    flag("--max-staleness", type=int, metavar="N")
    flag("--cell-px", type=int, metavar="PX")
    flag("--heartbeat-s", type=float, metavar="SECONDS")
    flag("--heartbeat-ttl-s", type=float, metavar="SECONDS")
    serve.set_defaults(func=_serve)

    sample = p_sub.add_parser("sample", help="roll out one group and print the trajectories")
    sample.add_argument("--target", type=address, default=None, metavar="HOST:PORT",
                        help="HOST:PORT of a rollout replica (default: play in this process "
                             "with --model against --env-address)")
    sample.add_argument("--model", type=Path, default=None,
                        help="model dir for in-process play (default: the tiny base)")
    sample.add_argument("--env-address", type=address, default=None, metavar="HOST:PORT",
                        help="env service for in-process play (default: none)")
    sample.add_argument("--task", default="maze_2d", help="task name")
    sample.add_argument("--seed", type=int, default=1_000_000, help="task seed")
    sample.add_argument("--size", type=int, default=0, help="maze size (0: the task's)")
    sample.add_argument("--max-turns", type=int, default=0, help="turn limit (0: the task's)")
    sample.add_argument("--group-size", type=int, default=4, help="episodes in the group")
    sample.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    sample.add_argument("--max-new-tokens", type=int, default=8, help="tokens per turn")
    sample.add_argument("--sampling-seed", type=int, default=0, help="sampling seed")
    sample.add_argument("--context", default="full", choices=CONTEXTS,
                        help="what the policy sees each turn (rlfleet.policy.contexts)")
    sample.add_argument("--key", default=None, help="idempotency key (default: random)")
    sample.set_defaults(func=_sample)
