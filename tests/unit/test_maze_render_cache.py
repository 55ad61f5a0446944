"""The frame cache: cached frames are the bytes a fresh render gives, responses without
images never touch the encoder, and the cache stays within its memory bound."""

from __future__ import annotations

import hashlib
import multiprocessing
import random
import struct
import time
import zlib

import numpy as np
import pytest

from rlfleet.maze import generate_layout, render_png, render_rgb
from rlfleet.maze import render as render_mod
from rlfleet.maze.png import encode_png_rgb, encode_png_rows
from rlfleet.maze.render import (
    BACKGROUND_CACHE_MAX_BYTES,
    FRAME_CACHE,
    FRAME_CACHE_MAX_BYTES,
    FrameCache,
    encode_frame,
    render_frame,
    render_frames,
    submit_frames,
)
from rlfleet.maze.tasks import new_episode
from rlfleet.v1 import common_pb2, env_pb2
from rlfleet_env.episodes import EpisodeTable
from rlfleet_env.servicer import EnvServicer
from tests.waits import scaled

MOVES = ["('move', 0)", "('move', 1)", "('move', 2)", "('move', 3)"]


def reference_png(pixels: np.ndarray) -> bytes:
    """The encoder as it was before the frame cache (verbatim), to pin the output bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    height, width = pixels.shape[:2]
    rows = np.zeros((height, 1 + width * 3), dtype=np.uint8)
    rows[:, 1:] = pixels.reshape(height, width * 3)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes(), 6))
        + chunk(b"IEND", b"")
    )


@pytest.fixture
def cold_cache():
    FRAME_CACHE.clear()
    yield FRAME_CACHE
    FRAME_CACHE.clear()


def test_cached_frames_equal_fresh_renders_for_every_state(cold_cache) -> None:
    checked = 0
    for seed, size in [(0, 9), (1_000_000, 7), (3, 11), (7, 5), (11, 15)]:
        layout = generate_layout(seed, size)
        for cell_px in (1, 4, 16, 25):
            for agent in layout.floor_cells():
                expected = reference_png(render_rgb(layout, agent, cell_px))
                miss = render_frame(layout, agent, cell_px)
                hit = render_frame(layout, agent, cell_px)
                assert miss.png == expected and hit.png == expected
                assert hit.sha256 == hashlib.sha256(expected).hexdigest()
                assert (hit.width, hit.height) == (size * cell_px, size * cell_px)
                assert render_png(layout, agent, cell_px) == expected
                checked += 1
    info = cold_cache.info()
    assert checked > 500 and info.misses == checked and info.hits == 2 * checked


def test_encoders_agree_with_the_reference_bytes() -> None:
    rng = np.random.default_rng(0)
    for height, width in [(1, 1), (3, 5), (64, 7), (225, 225)]:
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        expected = reference_png(pixels)
        assert encode_png_rgb(pixels) == expected
        rows = np.zeros((height, 1 + 3 * width), dtype=np.uint8)
        rows[:, 1:] = pixels.reshape(height, -1)
        assert encode_png_rows(rows) == expected
    with pytest.raises(ValueError, match="filter"):
        encode_png_rows(np.ones((2, 4), dtype=np.uint8))
    with pytest.raises(ValueError, match="scanlines"):
        encode_png_rows(np.zeros((2, 5), dtype=np.uint8))


@pytest.mark.skipif(zlib.ZLIB_RUNTIME_VERSION != "1.2.13", reason="digests taken with zlib 1.2.13")
@pytest.mark.parametrize(
    ("seed", "size", "cell_px", "on_target", "digest"),
    [  # sha256 of render_png with VisGym's (pygame's) agent disc
        (0, 9, 25, False, "efd5e03f2c22f201f5e152606f54d290f59c51c07c9d1fd3d6a1e1683ab1fe4d"),
        (0, 9, 25, True, "0a7f41eb2b22b026a46bc4963603327c6a31b6b16fdae59ec7c93b0c2f74cf7c"),
        (1_000_000, 7, 16, False,
         "5f1aeb4f1e20811e99d0a07846052ff35649c39f4860d5174ef86842561ed5d7"),
        (3, 11, 1, False, "bc705e30bbaaaffd8f809880da637d5fc112e70bca8a1148a2a238ac9a2ec9da"),
        (5, 9, 8, False, "142e13c2db63d8925d662a7f8ad44ecf42a21acdfba96e6be53c254c24b8671c"),
    ],
)
def test_png_bytes_unchanged(seed, size, cell_px, on_target, digest) -> None:
    layout = generate_layout(seed, size)
    agent = layout.target if on_target else None
    assert hashlib.sha256(render_png(layout, agent, cell_px)).hexdigest() == digest
    assert encode_frame(layout, agent, cell_px).sha256 == digest


def test_batch_lookup_encodes_each_new_state_once(cold_cache, monkeypatch) -> None:
    layout = generate_layout(2, 9)
    cells = layout.floor_cells()[:6]
    states = [(layout, cell, 16) for cell in cells] * 3 + [(layout, None, 16)]
    calls = []
    real = render_mod.encode_frame

    def counting(*key):
        calls.append(key)
        return real(*key)

    monkeypatch.setattr(render_mod, "encode_frame", counting)
    frames = render_frames(states)
    assert [f.png for f in frames] == [reference_png(render_rgb(*s)) for s in states]
    assert sorted(calls) == sorted({(layout, c, 16) for c in [*cells, layout.agent]})
    calls.clear()
    assert render_frames(states) == frames and not calls  # all hits now


def test_a_state_in_flight_is_encoded_once(cold_cache, monkeypatch) -> None:
    layout = generate_layout(4, 9)
    cells = layout.floor_cells()[:5]
    calls = []
    real = render_mod.encode_frame

    def counting(*key):
        calls.append(key)
        return real(*key)

    monkeypatch.setattr(render_mod, "encode_frame", counting)
    first = submit_frames([(layout, c, 25) for c in cells])
    second = submit_frames([(layout, c, 25) for c in reversed(cells)])  # before any is done
    frames = first()
    assert second() == frames[::-1]
    assert len(calls) == len(cells) and not cold_cache._pending
    info = cold_cache.info()
    assert (info.misses, info.hits, info.entries) == (5, 5, 5)


def test_bad_states_still_rejected(cold_cache) -> None:
    layout = generate_layout(0, 9)
    with pytest.raises(ValueError, match="floor"):
        render_frame(layout, (0, 0))
    good = layout.floor_cells()[0]
    with pytest.raises(ValueError, match="floor"):
        render_frames([(layout, (0, 0), 8), (layout, good, 8)])
    with pytest.raises(ValueError, match="cell_px"):
        render_frame(layout, None, 0)
    deadline = time.monotonic() + scaled(30)
    while cold_cache._pending and time.monotonic() < deadline:  # the good one may still run
        time.sleep(0.01)
    assert not cold_cache._pending
    assert render_frame(layout, good, 8).png == reference_png(render_rgb(layout, good, 8))
    with pytest.raises(ValueError, match="floor"):  # a failed state is not remembered
        render_frame(layout, (0, 0), 8)


def test_cache_stays_within_its_bound() -> None:
    assert FRAME_CACHE.max_bytes == FRAME_CACHE_MAX_BYTES
    assert FRAME_CACHE_MAX_BYTES + BACKGROUND_CACHE_MAX_BYTES <= 64 * 2**20
    cache = FrameCache(max_bytes=40_000)
    layouts = [generate_layout(seed, 9) for seed in range(6)]
    first = (layouts[0], layouts[0].agent, 25)
    for layout in layouts:
        for cell in layout.floor_cells():
            cache.frame(layout, cell, 25)
            cache.frame(*first)  # kept warm: the least recently used go first
            info = cache.info()
            assert 0 < info.bytes <= 40_000
    info = cache.info()
    assert info.evictions > 0 and info.entries == len(cache)
    assert info.entries * 1000 < info.bytes  # each entry costs its PNG plus overhead
    misses = info.misses
    cache.frame(*first)
    assert cache.info().misses == misses  # still cached
    cache.frame(layouts[0], layouts[0].floor_cells()[-1], 25)
    assert cache.info().misses == misses + 1  # long evicted
    # A frame larger than the whole bound is served but not kept.
    tiny = FrameCache(max_bytes=100)
    assert tiny.frame(layouts[0], None, 25).png == render_png(layouts[0], None, 25)
    assert len(tiny) == 0 and tiny.info().bytes == 0


def test_background_cache_stays_within_its_bound() -> None:
    for seed in range(40):
        render_mod._background_rows(generate_layout(seed, 15), 64)  # 2.7 MiB each
        assert render_mod._BACKGROUNDS.info().bytes <= BACKGROUND_CACHE_MAX_BYTES


def _frames_in_child(queue) -> None:  # noqa: ANN001
    layout = generate_layout(9, 9)
    queue.put([f.sha256 for f in render_frames([(layout, c, 8) for c in layout.floor_cells()])])


def test_parallel_encoding_works_after_fork(cold_cache) -> None:
    layout = generate_layout(8, 9)
    render_frames([(layout, c, 8) for c in layout.floor_cells()])  # the pool now runs here
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_frames_in_child, args=(queue,))
    child.start()
    digests = queue.get(timeout=60)
    child.join(60)
    layout = generate_layout(9, 9)
    assert digests == [encode_frame(layout, c, 8).sha256 for c in layout.floor_cells()]


# -- the env servicer, in process ---------------------------------------------------------


def _play(servicer: EnvServicer, include_image: bool, turns: int = 6):  # noqa: ANN202
    """Opens 12 episodes, 4 per maze (7x7 at 16 px, 9x9 at the default 25 px), and steps
    them with random moves; returns the replies and each episode's (layout, cell_px)."""
    rng = random.Random(0)
    mazes = [(1_000_000 + i // 4, (7, 9)[(i // 4) % 2]) for i in range(12)]
    specs = [common_pb2.TaskSpec(task="maze_2d", seed=seed, size=size,
                                 render=common_pb2.RenderOptions(cell_px=16 if size == 7 else 0))
             for seed, size in mazes]
    opened = servicer.Open(env_pb2.OpenRequest(tasks=specs, include_image=include_image), None)
    ids = [e.episode_id for e in opened.episodes]
    replies = [opened]
    for _ in range(turns):
        actions = [env_pb2.Action(episode_id=i, text=rng.choice(MOVES)) for i in ids]
        replies.append(servicer.Step(
            env_pb2.StepRequest(actions=actions, include_image=include_image), None))
    return replies, [(generate_layout(seed, size), 16 if size == 7 else 25) for seed, size in mazes]


def _observations(reply) -> list:  # noqa: ANN001
    items = reply.episodes if isinstance(reply, env_pb2.OpenResponse) else reply.results
    return [(item.observation, item.state) for item in items]


def test_servicer_images_are_fresh_render_bytes(cold_cache) -> None:
    table = EpisodeTable()
    try:
        replies, mazes = _play(EnvServicer(table), include_image=True)
    finally:
        table.close()
    for reply in replies:
        for (obs, state), (layout, cell_px) in zip(_observations(reply), mazes, strict=True):
            expected = reference_png(
                render_rgb(layout, (state.agent.row, state.agent.col), cell_px))
            assert obs.HasField("image")
            assert obs.image.png == expected
            assert obs.image.sha256 == hashlib.sha256(expected).hexdigest()
            assert obs.image.height == obs.image.width == layout.width * cell_px
    assert cold_cache.info().hits > 0  # the four episodes on each maze share frames


def test_no_image_means_no_png_and_no_encoder(monkeypatch, cold_cache) -> None:
    def boom(*args, **kwargs):
        raise AssertionError("a frame was looked up or encoded for include_image=false")

    monkeypatch.setattr(render_mod, "encode_png_rows", boom)
    monkeypatch.setattr(render_mod, "encode_frame", boom)
    monkeypatch.setattr(render_mod.hashlib, "sha256", boom)
    monkeypatch.setattr(FrameCache, "frames", boom)
    monkeypatch.setattr(FrameCache, "submit", boom)
    monkeypatch.setattr("rlfleet_env.servicer.render_frames", boom)
    monkeypatch.setattr("rlfleet_env.servicer.submit_frames", boom)
    table = EpisodeTable()
    try:
        replies, _ = _play(EnvServicer(table), include_image=False)
    finally:
        table.close()
    for reply in replies:
        for obs, _ in _observations(reply):
            # Present but empty, as before: two bytes on the wire, no PNG, no digest.
            assert obs.HasField("image") and obs.image.ByteSize() == 0
            assert obs.image.png == b"" and obs.image.sha256 == ""
            assert obs.text.startswith(("Feedback:", "You are navigating"))
    info = cold_cache.info()
    assert info.hits == info.misses == 0


def test_messages_match_the_episode_text() -> None:
    table = EpisodeTable()
    try:
        servicer = EnvServicer(table)
        spec = common_pb2.TaskSpec(task="maze_2d", seed=1_000_003)
        opened = servicer.Open(env_pb2.OpenRequest(tasks=[spec]), None).episodes[0]
        twin = new_episode("maze_2d", 1_000_003)
        obs = twin.observe()
        assert opened.observation.text == obs.text
        assert opened.observation.instruction == obs.instruction
        assert opened.observation.feedback == twin.feedback
        step = servicer.Step(env_pb2.StepRequest(actions=[env_pb2.Action(
            episode_id=opened.episode_id, text="('move', 1)")], include_image=True), None)
        twin.step("('move', 1)")
        result = step.results[0]
        assert result.observation.text == twin.observe().status
        assert result.observation.instruction == ""
        assert result.observation.image.png == twin.observe().png
        assert result.state.turns == 1 and result.state.agent.row == twin.agent[0]
    finally:
        table.close()
