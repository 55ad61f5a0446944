"""Env throughput: steps/s through gRPC (one step per call, and batched) against the same
maze stepped in-process, and render time per frame.

    python -m bench.bench_env
"""

from __future__ import annotations

import itertools

from bench.common import RESULTS, timed, write_results
from rlfleet.local.procs import ProcessGroup, free_port, rlfleet_argv
from rlfleet.maze.render import render_png
from rlfleet.maze.tasks import new_episode
from rlfleet.rpc.client import RpcClient
from rlfleet.v1 import common_pb2, env_pb2, env_pb2_grpc

MOVES = ["('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)"]
BATCH = 256


def bench_in_process() -> float:
    moves = itertools.cycle(MOVES)
    state = {"ep": new_episode("maze_2d", 1_000_000, max_turns=1000)}

    def step() -> None:
        ep = state["ep"]
        if ep.done:
            state["ep"] = ep = new_episode("maze_2d", 1_000_000, max_turns=1000)
        ep.step(next(moves))
        ep.observe()  # the service renders the observation too

    per_call, _ = timed(step)
    return 1 / per_call


def bench_grpc(client: RpcClient, batch: int, image: bool) -> float:
    env = env_pb2_grpc.EnvServiceStub
    spec = common_pb2.TaskSpec(task="maze_2d", seed=1_000_000, max_turns=1000)
    ids = [e.episode_id for e in client.call(
        env, "Open", env_pb2.OpenRequest(tasks=[spec] * batch)).episodes]
    moves = itertools.cycle(MOVES)

    def step() -> None:
        text = next(moves)
        client.call(env, "Step", env_pb2.StepRequest(
            actions=[env_pb2.Action(episode_id=i, text=text) for i in ids],
            include_image=image))

    per_call, _ = timed(step, min_time_s=2.0, max_iters=900 // batch + 50)
    client.call(env, "Close", env_pb2.CloseRequest(episode_ids=ids))
    return batch / per_call


def main() -> None:
    rows = []
    in_proc = bench_in_process()
    rows.append({"case": "in-process step+render", "steps_per_s": in_proc, "vs_in_process": 1.0})
    with ProcessGroup(RESULTS / "logs") as group:
        port = free_port()
        address = f"127.0.0.1:{port}"
        group.start_service("env", rlfleet_argv("env", "serve", "--port", str(port),
                                                "--metrics-port", str(free_port())), address)
        client = RpcClient(address, timeout_s=120)
        for batch, image in ((1, True), (1, False), (BATCH, True), (BATCH, False)):
            sps = bench_grpc(client, batch, image)
            rows.append({"case": f"gRPC batch={batch} image={'yes' if image else 'no'}",
                         "steps_per_s": sps, "vs_in_process": sps / in_proc})
    layout = new_episode("maze_2d", 3).layout
    for cell_px in (16, 25):
        per_frame, _ = timed(lambda c=cell_px: render_png(layout, layout.agent, c))
        rows.append({"case": f"render {9 * cell_px}px PNG", "steps_per_s": 1 / per_frame,
                     "vs_in_process": (1 / per_frame) / in_proc,
                     "ms_per_frame": 1000 * per_frame})
    write_results("env", rows, value_key="steps_per_s", unit="steps (or frames) per second",
                  meta={"batch": BATCH}, title="env service throughput (one run; compare ratios)")


if __name__ == "__main__":
    main()
