"""The hf engine loading LoRA adapters from bytes already in memory (what a rollout replica
verified): the same adapter as loading the directory, exactly the given bytes, and a bad
load leaves the serving version as it was."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from rlfleet.engines import EngineError, GenerationRequest, SamplingConfig
from rlfleet.engines.hf import HFEngine, safetensors_views
from rlfleet.policy import ChatCodec
from rlfleet.storage import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE
from tests.factories import image_request, save_peft_lora

WEIGHTS, CONFIG = ADAPTER_WEIGHTS_FILE, ADAPTER_CONFIG_FILE
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8)


def _adapter(tiny_model_dir: Path, out: Path, seed: int) -> dict[str, bytes]:
    save_peft_lora(tiny_model_dir, out, seed)
    return {n: (out / n).read_bytes() for n in (WEIGHTS, CONFIG)}


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory) -> dict[str, tuple[Path, dict[str, bytes]]]:
    out = tmp_path_factory.mktemp("adapters")
    return {k: (out / k, _adapter(tiny_model_dir, out / k, seed))
            for k, seed in (("a", 1), ("b", 2))}


def _requests(codec: ChatCodec) -> list[GenerationRequest]:
    return [image_request(codec, size, text, seed=i)
            for i, (size, text) in enumerate(((112, "Move."), (144, "Feedback: Moved up.")))]


def _writable(files: dict[str, bytes]) -> dict[str, memoryview]:
    return {n: memoryview(bytearray(b)) for n, b in files.items()}


def _lora_params(eng: HFEngine, name: str) -> dict[str, torch.Tensor]:
    internal = eng._adapters.handle(name)[0]
    return {k.replace(f".{internal}.", "."): p.detach() for k, p in
            eng._peft.named_parameters() if f".{internal}." in k}


def test_memory_load_is_the_directory_load(tiny_model_dir: Path, adapters) -> None:
    eng = HFEngine(tiny_model_dir)
    reqs = _requests(eng.codec)
    base = [g.token_ids for g in eng.generate(reqs, GREEDY)]
    path_a, files_a = adapters["a"]
    eng.load_adapter_files("mem", _writable(files_a))  # first load: wraps the base model
    eng.load_adapter("dir", str(path_a))
    assert eng.adapters == ["dir", "mem"]
    for params in (GREEDY, SamplingConfig(temperature=1.0, max_new_tokens=8, seed=3)):
        mem, dird = eng.generate(reqs, params, adapter="mem"), eng.generate(reqs, params,
                                                                            adapter="dir")
        assert [g.token_ids for g in mem] == [g.token_ids for g in dird]
        assert [g.logprobs for g in mem] == [g.logprobs for g in dird]
    assert [g.token_ids for g in eng.generate(reqs, GREEDY, adapter="mem")] != base
    # the loaded weights are exactly the file's tensors
    saved = st_load(files_a[WEIGHTS])
    mem_params, dir_params = _lora_params(eng, "mem"), _lora_params(eng, "dir")
    assert mem_params.keys() == dir_params.keys() and len(mem_params) == len(saved)
    for k in mem_params:
        assert torch.equal(mem_params[k], dir_params[k])
    assert sorted(torch.cat([t.flatten() for t in saved.values()]).tolist()) == sorted(
        torch.cat([t.flatten() for t in mem_params.values()]).tolist())
    # read-only bytes work too (copied once); unloading all returns the base model
    eng.load_adapter_files("mem", adapters["b"][1])
    eng.unload_adapter("mem")
    eng.unload_adapter("dir")
    assert [g.token_ids for g in eng.generate(reqs, GREEDY)] == base
    eng.close()


def _drop_one_tensor(weights: bytes) -> bytes:
    tensors = st_load(weights)
    tensors.pop(sorted(tensors)[0])
    return st_save(tensors)


@pytest.mark.parametrize("first", [True, False])
def test_bad_memory_load_leaves_the_serving_version(tiny_model_dir: Path, adapters,
                                                    first: bool) -> None:
    eng = HFEngine(tiny_model_dir)
    reqs = _requests(eng.codec)
    files_a, files_b = adapters["a"][1], adapters["b"][1]
    if not first:
        eng.load_adapter_files("x", _writable(files_a))
    before = [g.token_ids for g in eng.generate(reqs, GREEDY, adapter=None if first else "x")]
    rank4 = json.loads(files_b[CONFIG])
    rank4["r"] = 4  # the weights are rank 8: shapes do not match the config
    broken = [
        {WEIGHTS: b"not safetensors", CONFIG: files_b[CONFIG]},
        {WEIGHTS: _drop_one_tensor(files_b[WEIGHTS]), CONFIG: files_b[CONFIG]},
        {WEIGHTS: files_b[WEIGHTS], CONFIG: json.dumps(rank4).encode()},
        {WEIGHTS: files_b[WEIGHTS], CONFIG: b"{"},
        {WEIGHTS: files_b[WEIGHTS], CONFIG: b'{"peft_type": "NOPE"}'},
        {WEIGHTS: files_b[WEIGHTS]},
    ]
    for files in broken:
        with pytest.raises(EngineError, match="cannot load adapter"):
            eng.load_adapter_files("x", _writable(files))
        assert eng.adapters == ([] if first else ["x"])
        after = eng.generate(reqs, GREEDY, adapter=None if first else "x")
        assert [g.token_ids for g in after] == before
    # and a good load still works afterwards
    eng.load_adapter_files("x", _writable(files_b))
    assert eng.adapters == ["x"]
    assert [g.token_ids for g in eng.generate(reqs, GREEDY, adapter="x")] != before
    eng.close()


def _raw_safetensors(header: dict, data: bytes) -> bytes:
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def test_safetensors_views_match_safetensors_and_refuse_malformed() -> None:
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
               "b": torch.tensor([1, 2, 3], dtype=torch.int64),
               "c": torch.ones(0, 4, dtype=torch.bfloat16),
               "d": torch.tensor([0.5], dtype=torch.float16)}
    data = st_save(tensors, metadata={"format": "pt"})
    buf = bytearray(data)
    views = safetensors_views(memoryview(buf))
    assert views.keys() == tensors.keys()
    for k, t in tensors.items():
        assert views[k].dtype == t.dtype and torch.equal(views[k], t)
    # views, not copies: they are over the given buffer
    views["a"][0, 0] = 42.0
    assert safetensors_views(memoryview(buf))["a"][0, 0] == 42.0
    assert torch.equal(safetensors_views(data)["b"], tensors["b"])  # read-only input: copied

    f32 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    bad = [
        b"short",
        struct.pack("<Q", 1 << 40) + b"{}",
        struct.pack("<Q", 2) + b"[]",
        _raw_safetensors({"x": {**f32, "dtype": "Q9"}}, bytes(8)),
        _raw_safetensors({"x": {**f32, "shape": [3]}}, bytes(8)),  # shape vs bytes
        _raw_safetensors({"x": {**f32, "data_offsets": [0, 16]}}, bytes(8)),  # past the end
        _raw_safetensors({"x": f32, "y": {**f32, "data_offsets": [4, 12]}}, bytes(16)),
        _raw_safetensors({"x": {**f32, "data_offsets": [8, 16]}}, bytes(16)),  # a hole
        _raw_safetensors({"x": f32}, bytes(12)),  # trailing bytes nobody owns
        _raw_safetensors({"x": {**f32, "shape": [-2]}}, bytes(8)),
    ]
    for blob in bad:
        with pytest.raises(ValueError):
            safetensors_views(bytearray(blob))
