"""The transformers engine on the tiny policy: sampling, logprobs, stopping, LoRA."""

from __future__ import annotations

import pytest
import torch

from rlfleet.engines import EngineError, GenerationRequest, SamplingConfig
from rlfleet.engines.base import vision_token_ids
from rlfleet.engines.hf import HFEngine, filter_logits
from rlfleet.policy import (
    ChatCodec,
    collate,
    forward_logits,
    load_policy,
    sequence_logprobs,
)
from tests.factories import image_request, save_peft_lora


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    eng = HFEngine(tiny_model_dir)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def requests_(engine) -> list[GenerationRequest]:
    c = engine.codec
    return [
        image_request(c, 112, "Move.", 0),
        image_request(c, 144, "You are navigating a 9x9 maze. Feedback: Moved up.", 1),
        image_request(c, 176, "x", 2),
    ]


def assert_logprobs_match(model, processor, reqs, gens, temperature):
    for r, g in zip(reqs, gens, strict=True):
        with torch.no_grad():
            full = sequence_logprobs(
                model, processor, r.prompt_ids + g.token_ids, r.images, temperature=temperature
            )
        torch.testing.assert_close(
            torch.tensor(g.logprobs), full[len(r.prompt_ids) :], atol=1e-4, rtol=1e-4
        )


# -- sampling ----------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_batch_independent(engine, requests_):
    params = SamplingConfig(temperature=1.0, max_new_tokens=10, seed=7)
    a = engine.generate(requests_, params)
    b = engine.generate(requests_, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.logprobs for g in a] == [g.logprobs for g in b]
    # request i is sampled with seed + i, whatever batch it rides in
    alone = engine.generate(
        [requests_[1]], SamplingConfig(temperature=1.0, max_new_tokens=10, seed=8)
    )
    assert alone[0].token_ids == a[1].token_ids
    other = engine.generate(requests_, SamplingConfig(temperature=1.0, max_new_tokens=10, seed=99))
    assert [g.token_ids for g in other] != [g.token_ids for g in a]
    for g in a:
        assert len(g.token_ids) == len(g.logprobs) <= 10
        assert g.finish_reason in ("stop", "length")
        assert g.text == engine.codec.decode(g.token_ids)


def test_duplicate_prompts_share_one_prefill_and_keep_their_own_seeds(engine, requests_):
    """A batch with repeated prompts prefills each distinct prompt once; every request is
    still sampled from its own seed and records the logprobs a fresh forward pass gives."""
    r0, r1 = requests_[0], requests_[1]
    batch = [GenerationRequest(r.prompt_ids, r.images, seed=s)
             for r, s in ((r0, 11), (r1, 12), (r0, 13), (r0, 14), (r1, 15))]
    params = SamplingConfig(temperature=1.0, max_new_tokens=6)
    before_rows, before_served = engine.prefill_rows, engine.requests_served
    gens = engine.generate(batch, params)
    assert engine.prefill_rows - before_rows == 2
    assert engine.requests_served - before_served == 5
    for req, gen in zip(batch, gens, strict=True):  # the same as generating each alone
        assert engine.generate([req], params)[0].token_ids == gen.token_ids
    with engine.using(None) as model:
        assert_logprobs_match(model, engine.processor, batch, gens, 1.0)


def test_the_vision_tower_runs_once_per_distinct_frame(engine, requests_):
    engine.vision.clear()
    params = SamplingConfig(temperature=0.0, max_new_tokens=2)
    engine.generate(requests_, params)
    misses = engine.vision.misses
    engine.generate(requests_ + requests_, params)
    assert engine.vision.misses == misses  # every frame came from the cache
    assert len(engine.vision) == len(requests_)


def test_greedy_is_deterministic_and_takes_the_argmax(engine, requests_):
    params = SamplingConfig(temperature=0.0, max_new_tokens=6)
    a = engine.generate(requests_, params)
    b = engine.generate(list(reversed(requests_)), params)
    assert [g.token_ids for g in a] == [g.token_ids for g in reversed(b)]
    processor = engine.processor
    for r, g in zip(requests_, a, strict=True):
        with torch.no_grad(), engine.using(None) as model:
            logits = forward_logits(
                model, collate(processor, [r.prompt_ids + g.token_ids], [r.images])
            )
        start = len(r.prompt_ids) - 1
        rows = logits[0, start : start + len(g.token_ids)].float()
        # the vision placeholders are outside the action space
        rows[:, vision_token_ids(processor)] = float("-inf")
        assert rows.argmax(-1).tolist() == g.token_ids
        picked = torch.log_softmax(rows, -1).max(-1).values
        torch.testing.assert_close(torch.tensor(g.logprobs), picked, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "params",
    [
        SamplingConfig(temperature=1.0, max_new_tokens=8, seed=1),
        SamplingConfig(temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=8, seed=2),
        SamplingConfig(temperature=0.0, max_new_tokens=8),
    ],
    ids=["t1", "t0.7-topk-topp", "greedy"],
)
def test_recorded_logprobs_equal_a_fresh_forward_pass(engine, requests_, params):
    gens = engine.generate(requests_, params)
    with engine.using(None) as model:
        assert_logprobs_match(model, engine.processor, requests_, gens, params.temperature)


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert torch.isfinite(filter_logits(logits, 2, 1.0)).sum() == 2
    probs = torch.softmax(logits, -1)[0]
    kept = torch.isfinite(filter_logits(logits, 0, float(probs[0]) + 1e-3))
    assert kept.tolist() == [[True, True, False, False, False]]
    assert torch.isfinite(filter_logits(logits, 0, 0.01)).sum() == 1


def test_generation_stops_at_im_end(tiny_model_dir):
    """Teach the policy one reply, then check the engine stops after <|im_end|>."""
    torch.manual_seed(0)
    model, processor = load_policy(tiny_model_dir)
    codec = ChatCodec(processor)
    req = image_request(codec, 112, "Move.", 3)
    turn = processor.tokenizer.encode("('move', 0)", add_special_tokens=False) + [codec.im_end_id]
    ids = req.prompt_ids + turn
    mask = torch.zeros(len(ids))
    mask[len(req.prompt_ids) :] = 1
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(25):
        loss = -(sequence_logprobs(model, processor, ids, req.images) * mask).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    eng = HFEngine(model=model, processor=processor)
    g = eng.generate([req], SamplingConfig(temperature=0.0, max_new_tokens=8))[0]
    assert g.token_ids == turn
    assert g.finish_reason == "stop"
    assert g.text == "('move', 0)"
    assert len(g.logprobs) == 2
    # a limit of one token cuts the turn before <|im_end|>
    cut = eng.generate([req], SamplingConfig(temperature=0.0, max_new_tokens=1))[0]
    assert cut.token_ids == turn[:1] and cut.finish_reason == "length"


def test_bad_requests_are_refused(engine, requests_):
    with pytest.raises(EngineError):
        engine.generate([GenerationRequest([], [])], SamplingConfig())
    r = requests_[0]
    with pytest.raises(EngineError):  # placeholders without their image
        engine.generate([GenerationRequest(r.prompt_ids, [])], SamplingConfig())
    with pytest.raises(EngineError):
        engine.generate(requests_, SamplingConfig(), adapter="nope")
    with pytest.raises(ValueError):
        SamplingConfig(temperature=-1)
    assert engine.generate([], SamplingConfig()) == []


# -- LoRA --------------------------------------------------------------------------------


def test_lora_adapters_load_switch_and_unload(tiny_model_dir, requests_, tmp_path):
    eng = HFEngine(tiny_model_dir)
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=8)
    sampled = SamplingConfig(temperature=1.0, max_new_tokens=8, seed=5)
    base = eng.generate(requests_, greedy)

    peft_a = save_peft_lora(tiny_model_dir, tmp_path / "a", seed=1)
    save_peft_lora(tiny_model_dir, tmp_path / "b", seed=2)
    # adapters on the language model only: the vision tower is never adapted
    assert not any("visual" in n for n, _ in peft_a.named_parameters() if "lora_" in n)
    eng.load_adapter("a", str(tmp_path / "a"))
    eng.load_adapter("b", str(tmp_path / "b"))
    assert eng.adapters == ["a", "b"]

    with_a = eng.generate(requests_, greedy, adapter="a")
    with_b = eng.generate(requests_, greedy, adapter="b")
    assert [g.token_ids for g in with_a] != [g.token_ids for g in base]
    assert [g.token_ids for g in with_a] != [g.token_ids for g in with_b]
    # the engine's adapter "a" is the PEFT model that saved it
    for params in (greedy, sampled):
        gens = eng.generate(requests_, params, adapter="a")
        assert_logprobs_match(peft_a, eng.processor, requests_, gens, params.temperature)
    r = requests_[0]
    with torch.no_grad(), eng.using("a") as model:
        ref = sequence_logprobs(peft_a, eng.processor, r.prompt_ids, r.images)
        ours = sequence_logprobs(model, eng.processor, r.prompt_ids, r.images)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)

    # adapter=None is the base model, adapters disabled
    assert [g.token_ids for g in eng.generate(requests_, greedy)] == [g.token_ids for g in base]

    # reloading a name replaces it; unloading one leaves the other
    eng.load_adapter("a", str(tmp_path / "b"))
    assert [g.token_ids for g in eng.generate(requests_, greedy, adapter="a")] == [
        g.token_ids for g in with_b
    ]
    eng.unload_adapter("a")
    with pytest.raises(EngineError):
        eng.generate(requests_, greedy, adapter="a")
    assert [g.token_ids for g in eng.generate(requests_, greedy, adapter="b")] == [
        g.token_ids for g in with_b
    ]
    eng.unload_adapter("b")
    assert eng.adapters == []
    assert [g.token_ids for g in eng.generate(requests_, greedy)] == [g.token_ids for g in base]
    with pytest.raises(EngineError):
        eng.unload_adapter("b")
    with pytest.raises(EngineError):
        eng.load_adapter("c", str(tmp_path / "missing"))
    # a broken reload keeps the version that was serving
    eng.load_adapter("b", str(tmp_path / "b"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text(
        (tmp_path / "a" / "adapter_config.json").read_text()
    )
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(EngineError):
        eng.load_adapter("b", str(broken))
    assert eng.adapters == ["b"]
    assert [g.token_ids for g in eng.generate(requests_, greedy, adapter="b")] == [
        g.token_ids for g in with_b
    ]
    eng.close()
    with pytest.raises(EngineError):
        eng.generate(requests_, greedy)
