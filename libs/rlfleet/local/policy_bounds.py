"""The bounds a learned policy lies between, through a real env service: the BFS oracle
(a perfect player) and a uniform random policy on the 64 fixed eval mazes, as a table
and JSON (`make policy-bounds`, `python -m rlfleet.local.policy_bounds`). No model plays:
to evaluate a model, see `rlfleet eval`.

Both policies play over gRPC exactly as a rollout replica does (batched Open/Step/Close),
so this is also an end-to-end check of the env service.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rlfleet.cliargs import DocHelpFormatter, Parser
from rlfleet.cliargs import address as address_type
from rlfleet.clients.env import EnvClient
from rlfleet.clients.reward import RewardClient
from rlfleet.maze.actions import Action, ActionFormat, format_action
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.oracle import distance_to_target, oracle_action
from rlfleet.maze.tasks import EVAL_SEEDS, get_task
from rlfleet.v1 import common_pb2, env_pb2, reward_pb2

Policy = Callable[[int, tuple[int, int]], str]  # (seed, agent position) -> action text


def oracle_policy(size: int) -> Policy:
    def act(seed: int, agent: tuple[int, int]) -> str:
        return format_action(oracle_action(generate_layout(seed, size), agent),
                             ActionFormat.LITERAL)

    return act


def random_policy(rng: random.Random) -> Policy:
    actions = [Action.move(d) for d in range(4)] + [Action.stop()]

    def act(seed: int, agent: tuple[int, int]) -> str:
        return format_action(rng.choice(actions), ActionFormat.LITERAL)

    return act


def play(env: EnvClient, reward: RewardClient, policy: Policy, seeds: list[int], task: str
         ) -> dict:
    """Plays one episode per seed in lock-step batches and scores them with the reward
    service."""
    specs = [common_pb2.TaskSpec(task=task, seed=s) for s in seeds]
    opened = env.open(specs)
    live = {e.episode_id: (seed, e.state) for e, seed in zip(opened, seeds, strict=True)}
    actions: dict[str, list[str]] = {e.episode_id: [] for e in opened}
    finals: dict[str, common_pb2.EpisodeState] = {}
    while live:
        batch = []
        for episode_id, (seed, state) in live.items():
            text = policy(seed, (state.agent.row, state.agent.col))
            actions[episode_id].append(text)
            batch.append(env_pb2.Action(episode_id=episode_id, text=text))
        results = env.step(batch)
        for r in results:
            seed = live[r.episode_id][0]
            if r.observation.done:
                finals[r.episode_id] = r.state
                del live[r.episode_id]
            else:
                live[r.episode_id] = (seed, r.state)
    env.close_episodes(list(actions))
    records = [reward_pb2.EpisodeRecord(task=spec, actions=actions[e.episode_id])
               for spec, e in zip(specs, opened, strict=True)]
    scores = reward.score(records)
    solved = [finals[e.episode_id].solved for e in opened]
    turns = [finals[e.episode_id].turns for e in opened]
    n = len(seeds)
    rate = sum(solved) / n
    return {
        "episodes": n,
        "solved": sum(solved),
        "solve_rate": rate,
        "solve_rate_se": (rate * (1 - rate) / n) ** 0.5,
        "pass_at_1": sum(s.reward > 0 for s in scores.scores) / n,
        "mean_reward": statistics.fmean(s.reward for s in scores.scores),
        "mean_turns": statistics.fmean(turns),
        "reward_service": f"{scores.info.name} {scores.info.version}",
    }


def run(address: str, out: Path, task: str = "maze_2d", seed: int = 0) -> dict:
    size = get_task(task).size
    seeds = list(EVAL_SEEDS)
    env, reward = EnvClient(address, timeout_s=60), RewardClient(address, timeout_s=60)
    paths = [distance_to_target(generate_layout(s, size)) for s in seeds]
    start = time.perf_counter()
    results = {
        "oracle": play(env, reward, oracle_policy(size), seeds, task),
        "random": play(env, reward, random_policy(random.Random(seed)), seeds, task),
    }
    summary = {
        "task": task,
        "eval_seeds": f"{seeds[0]}..{seeds[-1]}",
        "shortest_path_moves": {"min": min(paths), "mean": statistics.fmean(paths),
                                "max": max(paths)},
        "turn_limit": get_task(task).max_turns,
        "policies": results,
        "wall_s": round(time.perf_counter() - start, 3),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2))
    print_table(summary)
    print(f"wrote {out}")
    return summary


def print_table(summary: dict) -> None:
    p = summary["shortest_path_moves"]
    print(f"\n{summary['task']} on eval seeds {summary['eval_seeds']} "
          f"(turn limit {summary['turn_limit']}; shortest paths {p['min']}..{p['max']} moves, "
          f"mean {p['mean']:.2f})")
    print(f"{'policy':<8} {'solved':>7} {'solve rate':>16} {'pass@1':>7} {'mean turns':>11}")
    for name, r in summary["policies"].items():
        rate = f"{100 * r['solve_rate']:.1f}% ±{100 * r['solve_rate_se']:.1f}"
        print(f"{name:<8} {r['solved']:>3}/{r['episodes']:<3} {rate:>16} "
              f"{100 * r['pass_at_1']:>6.1f}% {r['mean_turns']:>11.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m rlfleet.local.policy_bounds", description=__doc__,
                    formatter_class=DocHelpFormatter)
    parser.add_argument("--env-address", type=address_type, metavar="HOST:PORT",
                        help="use a running env service instead of starting one (default: "
                             "start one)")
    parser.add_argument("--out", type=Path, default=Path("runs/policy-bounds/summary.json"),
                        help="where the summary is written")
    parser.add_argument("--task", default="maze_2d", help="the env task played")
    args = parser.parse_args(argv)
    if args.env_address:
        run(args.env_address, args.out, args.task)
        return 0
    from rlfleet.local.procs import ProcessGroup, free_port, serve_argv

    with ProcessGroup(args.out.parent / "logs") as group:
        port = free_port()
        address = f"127.0.0.1:{port}"
        print(f"starting env service on {address}", flush=True)
        # auth off: the service binds loopback and lives only as long as this command
        group.start_service("env", serve_argv("env", args.out.parent / "configs", "env", {
            "port": port, "metrics_port": free_port(), "auth": "none"}), address)
        run(address, args.out, args.task)
    return 0


if __name__ == "__main__":
    sys.exit(main())
