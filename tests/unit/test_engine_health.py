"""The engine health contract on the hf engine: alive while it can serve; once it cannot
(closed, or the batcher's engine thread gone) `check_health` raises EngineDead, every
call raises EngineDead (never a plain EngineError), and the replica's watch reports the
death exactly once."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rlfleet.engines import EngineDead, EngineError, GenerationRequest, SamplingConfig
from rlfleet.engines.hf import HFEngine
from rlfleet_rollout.batcher import GenerationBatcher
from rlfleet_rollout.engine_health import EngineWatch
from tests.waits import wait_until

PARAMS = SamplingConfig(temperature=0.0, max_new_tokens=2)


def prompt(engine: HFEngine) -> list[GenerationRequest]:
    return [GenerationRequest(engine.processor.tokenizer.encode("hello"))]


def test_an_hf_engine_is_alive_until_closed_then_dead_to_every_call(
        tiny_model_dir: Path) -> None:
    engine = HFEngine(tiny_model_dir)
    engine.check_health()  # alive: returns
    assert len(engine.generate(prompt(engine), PARAMS)) == 1
    engine.close()
    with pytest.raises(EngineDead, match="closed"):
        engine.check_health()
    with pytest.raises(EngineDead):
        engine.generate(prompt(engine), PARAMS)
    assert issubclass(EngineDead, EngineError)  # callers of EngineError still catch it


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_batcher_reports_its_dead_engine_thread_and_the_watch_tells_once(
        tiny_model_dir: Path) -> None:
    engine = HFEngine(tiny_model_dir)
    broken = threading.Event()

    def expected() -> int:  # what the batcher's thread asks before each batch
        if broken.is_set():
            raise RuntimeError("a bug in the batcher's loop")
        return 1

    batcher = GenerationBatcher(engine, expected=expected)
    deaths: list[str] = []
    watch = EngineWatch(batcher.check_health, period_s=0.05, on_dead=deaths.append)
    try:
        assert len(batcher.generate(prompt(engine), PARAMS, None)) == 1
        assert watch.check() is None
        watch.start()
        broken.set()
        job = threading.Thread(target=lambda: batcher.generate(prompt(engine), PARAMS, None),
                               daemon=True)  # the turn that meets the bug: never answered
        job.start()
        wait_until("the watch to find the engine thread dead", lambda: watch.dead)
        with pytest.raises(EngineDead, match="engine thread"):
            batcher.check_health()
        assert "engine thread" in (watch.dead or "")
        wait_until("on_dead to run", lambda: deaths)
        watch.died("again")  # a second report changes nothing
        assert watch.check() == watch.dead
        assert deaths == [watch.dead]
    finally:
        watch.stop()
        batcher.close()
        engine.close()
