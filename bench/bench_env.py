"""Env throughput: maze steps/s through gRPC (one episode per call, and batched; with and
without images) against the same workload stepped in-process, plus frame render times.

    python -m bench.bench_env

The workload is what training sends: many episodes on different mazes (every episode its
own training seed from 1,000,000 on, or GRPO groups of 8 episodes per maze), half of them
7×7 at 16 px per cell (the tiny model's recipe) and half 9×9 at VisGym's 25 px, random
moves, the task's turn limit, and finished episodes closed and replaced by new ones on new
mazes (their Open calls count against the rate). The frame cache therefore hits as often
as in training, and the hit rate is reported (from the service's /metrics for gRPC).

Target: 3,000 steps/s through gRPC at batch 256 with images, the upstream VisGym maze_2d
in-process step+render rate on these machines (3,013/s). Every rate is also shown as a
ratio to the in-process rate measured in the same run; on a shared machine compare those
ratios, not absolute figures across runs.
"""

from __future__ import annotations

import random
import re
import time
import urllib.request
from collections.abc import Callable

from bench.common import RESULTS, timed, write_results
from rlfleet.clients.env import EnvClient
from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv
from rlfleet.maze.episode import MazeEpisode
from rlfleet.maze.generate import generate_layout
from rlfleet.maze.render import FRAME_CACHE, encode_frame, render_frame
from rlfleet.maze.tasks import TRAIN_SEED_BASE, new_episode
from rlfleet.v1 import common_pb2, env_pb2

MOVES = ["('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)"]
BATCH = 256
GROUP = 8  # episodes per maze in a GRPO group (configs/*.yaml group_size)
TARGET_STEPS_PER_S = 3000.0  # through gRPC, batch 256, with images
UPSTREAM_IN_PROCESS = 3013.0  # VisGym maze_2d in-process step+render on these machines
SHAPES = ((7, 16), (9, 25))  # (maze size, cell_px), alternating over the batch
MIN_TIME_S = 3.0


_next_cursor = 0  # training-seed cursor shared by all cases


class Workload:
    """Hands out tasks: fresh training seeds (`group` consecutive episodes per seed),
    SHAPES alternating by maze, and a seeded random move per step. The seed cursor keeps
    increasing across cases, so no case starts on mazes an earlier one has cached."""

    def __init__(self, group: int) -> None:
        self.group = group
        self.rng = random.Random(group)
        self.first = _next_cursor
        self.handed = 0

    def next_task(self) -> tuple[int, int, int]:
        """(seed, size, cell_px) of the next episode."""
        maze = self.handed // self.group
        self.handed += 1
        size, cell_px = SHAPES[maze % len(SHAPES)]
        return TRAIN_SEED_BASE + self.first + maze, size, cell_px

    def move(self) -> str:
        return self.rng.choice(MOVES)

    def finish(self) -> None:
        global _next_cursor
        _next_cursor = self.first + -(-self.handed // self.group)


def _run_for(step: Callable[[], int], min_time_s: float) -> float:
    """Calls step() (which returns the steps it made) for min_time_s; steps per second."""
    steps, start = 0, time.perf_counter()
    while True:
        steps += step()
        elapsed = time.perf_counter() - start
        if elapsed >= min_time_s:
            return steps / elapsed


def bench_in_process(batch: int, group: int, *, cached: bool = True) -> tuple[float, float]:
    """(steps/s, frame cache hit rate) stepping and rendering episodes in this process."""
    w = Workload(group)

    def fresh() -> MazeEpisode:
        seed, size, cell_px = w.next_task()
        return new_episode("maze_2d", seed, size=size, cell_px=cell_px)

    def observe(ep: MazeEpisode) -> None:
        if cached:
            ep.observe()  # what the service renders for an observation (frame cache)
        else:
            encode_frame(ep.layout, ep.agent, ep.cell_px)
            ep.status()

    episodes = [fresh() for _ in range(batch)]
    for ep in episodes:
        observe(ep)
    before = FRAME_CACHE.info()

    def step() -> int:
        for i, ep in enumerate(episodes):
            if ep.done:
                episodes[i] = ep = fresh()
                observe(ep)
            ep.step(w.move())
            observe(ep)
        return batch

    rate = _run_for(step, MIN_TIME_S)
    after = FRAME_CACHE.info()
    w.finish()
    lookups = (after.hits - before.hits) + (after.misses - before.misses)
    return rate, ((after.hits - before.hits) / lookups if lookups else float("nan"))


def _scrape(metrics_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read()
    return {m[2]: float(m[3]) for m in re.finditer(
        r"^(rlfleet_env_frame_cache_(\w+?)(?:_total)?) ([0-9.e+-]+)$", text.decode(), re.M)}


def bench_grpc(client: EnvClient, metrics_port: int, batch: int, image: bool,
               group: int) -> tuple[float, float]:
    """(steps/s, frame cache hit rate) through the service; Open/Close of replacement
    episodes included in the time."""
    w = Workload(group)

    def specs(n: int) -> list[common_pb2.TaskSpec]:
        out = []
        for _ in range(n):
            seed, size, cell_px = w.next_task()
            out.append(common_pb2.TaskSpec(task="maze_2d", seed=seed, size=size,
                                           render=common_pb2.RenderOptions(cell_px=cell_px)))
        return out

    def open_(n: int) -> list[str]:
        return [e.episode_id for e in client.open(specs(n), include_image=image)]

    live = open_(batch)
    before = _scrape(metrics_port)

    def step() -> int:
        nonlocal live
        results = client.step([env_pb2.Action(episode_id=i, text=w.move()) for i in live],
                              include_image=image)
        done = [r.episode_id for r in results if r.observation.done]
        if done:
            client.close_episodes(done)
            finished = set(done)
            live = [i for i in live if i not in finished] + open_(len(done))
        return len(results)

    rate = _run_for(step, MIN_TIME_S)
    after = _scrape(metrics_port)
    client.close_episodes(live)
    w.finish()
    hits = after["hits"] - before["hits"]
    lookups = hits + after["misses"] - before["misses"]
    return rate, (hits / lookups if lookups else float("nan"))


def _row(case: str, rate: float, in_proc: float, hit_rate: float | None,
         *, acceptance: bool = False) -> dict:
    return {
        "case": case,
        "steps_per_s": rate,
        "target": TARGET_STEPS_PER_S,
        "met": ("yes" if rate >= TARGET_STEPS_PER_S else "NO") + (" (acceptance)"
                                                                   if acceptance else ""),
        "vs_in_process": rate / in_proc,
        "cache_hit_rate": "-" if hit_rate is None or hit_rate != hit_rate else hit_rate,
    }


def main() -> None:
    rows = []
    in_proc, in_hit = bench_in_process(BATCH, 1)
    rows.append(_row("in-process step+render", in_proc, in_proc, in_hit))
    uncached, _ = bench_in_process(BATCH, 1, cached=False)
    rows.append(_row("in-process step+render, no frame cache", uncached, in_proc, None))
    accepted = None
    with ProcessGroup(RESULTS / "logs") as group:
        port, metrics_port = free_port(), free_port()
        address = f"127.0.0.1:{port}"
        group.start_service("env", rlfleet_argv("env", "serve", "--port", str(port),
                                                "--metrics-port", str(metrics_port),
                                                "--insecure-no-auth"), address)
        client = EnvClient(address, timeout_s=120)
        cases = [(1, True, 1), (1, False, 1), (BATCH, True, 1), (BATCH, False, 1),
                 (BATCH, True, GROUP)]
        for batch, image, per_maze in cases:
            sps, hit = bench_grpc(client, metrics_port, batch, image, per_maze)
            name = f"gRPC batch={batch} image={'yes' if image else 'no'}"
            if per_maze > 1:
                name += f", groups of {per_maze}"
            acceptance = batch == BATCH and image and per_maze == 1
            if acceptance:
                accepted = sps
            rows.append(_row(name, sps, in_proc, hit if image else None,
                             acceptance=acceptance))
        client.close()
    for size, cell_px in SHAPES:
        layout = generate_layout(TRAIN_SEED_BASE, size)
        side = size * cell_px
        per_frame, _ = timed(lambda c=cell_px, lay=layout: encode_frame(lay, lay.agent, c))
        rows.append({"case": f"render+encode {side}px PNG ({size}x{size} at {cell_px}px)",
                     "steps_per_s": 1 / per_frame, "vs_in_process": (1 / per_frame) / in_proc,
                     "ms_per_frame": 1000 * per_frame})
        render_frame(layout, layout.agent, cell_px)
        per_hit, _ = timed(lambda c=cell_px, lay=layout: render_frame(lay, lay.agent, c))
        rows.append({"case": f"cached frame {side}px", "steps_per_s": 1 / per_hit,
                     "vs_in_process": (1 / per_hit) / in_proc, "ms_per_frame": 1000 * per_hit})
    meta = {"batch": BATCH, "group": GROUP, "shapes": [list(s) for s in SHAPES],
            "target_steps_per_s": TARGET_STEPS_PER_S,
            "target_case": f"gRPC batch={BATCH} image=yes",
            "target_met": accepted is not None and accepted >= TARGET_STEPS_PER_S,
            "upstream_visgym_in_process_steps_per_s": UPSTREAM_IN_PROCESS,
            "frame_cache_max_bytes": FRAME_CACHE.max_bytes}
    write_results("bench_env", rows, value_key="steps_per_s",
                  unit="steps (or frames) per second", meta=meta,
                  title="env service throughput (one run; compare ratios)")
    verdict = "MET" if meta["target_met"] else "NOT MET"
    print(f"target: >= {TARGET_STEPS_PER_S:,.0f} steps/s through gRPC at batch {BATCH} with "
          f"images: {verdict} ({accepted:,.0f}/s, {accepted / in_proc:.2f}x in-process; "
          f"upstream VisGym in-process {UPSTREAM_IN_PROCESS:,.0f}/s)")


if __name__ == "__main__":
    main()
