"""A checkpoint directory that is not complete gets one clear error naming every missing
piece (docs/your-model.md); a complete one loads exactly as before."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from rlfleet.policy import load_policy
from rlfleet.policy.loading import ModelLoadError, check_checkpoint, checkpoint_problems


@pytest.fixture(scope="module")
def tiny_dir(tiny_model_dir: Path) -> Path:
    return tiny_model_dir


@pytest.fixture
def copy(tiny_dir: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, dst)
    return dst


def test_a_complete_checkpoint_has_no_problems(tiny_dir: Path) -> None:
    assert checkpoint_problems(tiny_dir) == []
    assert check_checkpoint(tiny_dir) == tiny_dir


def test_a_good_checkpoint_loads_as_before(copy: Path, tiny_dir: Path) -> None:
    a, _ = load_policy(tiny_dir)
    b, processor = load_policy(copy)
    assert processor.merge_size == 2
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert k == k2 and torch.equal(v, v2)


@pytest.mark.parametrize(("remove", "named"), [
    ("model.safetensors", "weights (model.safetensors"),
    ("tokenizer.json", "the tokenizer (tokenizer.json"),
    ("tokenizer_config.json", "tokenizer_config.json"),
    ("preprocessor_config.json", "preprocessor_config.json (the image processor"),
])
def test_each_missing_piece_is_named(copy: Path, remove: str, named: str) -> None:
    (copy / remove).unlink()
    with pytest.raises(ModelLoadError) as err:
        load_policy(copy)
    assert any(m.startswith(named) for m in err.value.missing), err.value.missing
    assert str(copy) in str(err.value) and "is not a complete Qwen3-VL checkpoint" in str(err.value)


def test_everything_missing_is_named_at_once(copy: Path) -> None:
    for name in ("model.safetensors", "preprocessor_config.json", "tokenizer_config.json"):
        (copy / name).unlink()
    problems = checkpoint_problems(copy)
    assert len(problems) == 3
    message = str(ModelLoadError(copy, problems))
    assert message.count("\n  - ") == 3


def test_missing_shards_and_special_tokens(copy: Path) -> None:
    (copy / "model.safetensors").rename(copy / "model-00001-of-00002.safetensors")
    (copy / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    tokenizer = copy / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace("<|image_pad|>", "<|img|>"))
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace("<|image_pad|>", "<|img|>"))
    problems = checkpoint_problems(copy)
    assert "weights: 1 of the 2 files model.safetensors.index.json lists, e.g. " \
        "model-00002-of-00002.safetensors" in problems
    assert "Qwen's special tokens in the tokenizer: <|image_pad|>" in problems


def test_not_a_qwen3_vl_and_not_a_directory(copy: Path, tmp_path: Path) -> None:
    config = json.loads((copy / "config.json").read_text())
    config["model_type"] = "llama"
    (copy / "config.json").write_text(json.dumps(config))
    assert "config.json: model_type is 'llama', expected 'qwen3_vl'" in checkpoint_problems(copy)
    assert checkpoint_problems(tmp_path / "nope")[0].startswith("the directory itself")
    with pytest.raises(FileNotFoundError):  # as before: no config.json, no directory
        load_policy(tmp_path / "nope")


def test_every_service_resolves_its_model_through_the_check(copy: Path) -> None:
    """`resolve_model_dir` (what the rollout replica, either engine, and the learner call
    before anything loads a model) refuses an incomplete checkpoint, naming the pieces."""
    from rlfleet.policy import resolve_model_dir

    assert resolve_model_dir("qwen3-vl-8b", model_path=copy) == copy
    (copy / "preprocessor_config.json").unlink()
    with pytest.raises(ModelLoadError) as err:
        resolve_model_dir("qwen3-vl-8b", model_path=copy)
    assert [m.split(" ")[0] for m in err.value.missing] == ["preprocessor_config.json"]


def test_a_replica_on_an_incomplete_checkpoint_exits_with_the_list(copy: Path) -> None:
    """`rlfleet rollout serve --model DIR` with pieces missing: exit status 1 and one line
    naming each missing piece, no traceback."""
    import subprocess

    from rlfleet.local.procs import rlfleet_argv

    for name in ("model.safetensors", "tokenizer_config.json"):
        (copy / name).unlink()
    done = subprocess.run(
        rlfleet_argv("rollout", "serve", "--port", "0", "--metrics-port", "0", "--model",
                     str(copy), "--env-address", "127.0.0.1:1", "--insecure-no-auth"),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert f"rlfleet rollout: {copy} is not a complete Qwen3-VL checkpoint" in done.stderr
    line = next(ln for ln in done.stderr.splitlines() if "not a complete" in ln)
    assert "Missing: weights (model.safetensors" in line and "tokenizer_config.json" in line
    assert "Traceback" not in done.stderr


def test_the_class_and_the_chat_template_the_code_takes_from_the_checkpoint(copy: Path) -> None:
    """The model class comes from config.json's `architectures` and the chat from the
    checkpoint's own template: a checkpoint without either is refused up front."""
    config = json.loads((copy / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (copy / "config.json").write_text(json.dumps(config))
    (copy / "chat_template.jinja").unlink()
    tokenizer_config = json.loads((copy / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    problems = checkpoint_problems(copy)
    assert "config.json: architectures is ['LlamaForCausalLM'], expected a list naming one " \
        "of ['Qwen3VLForConditionalGeneration']" in problems
    assert "the chat template (chat_template.jinja, or chat_template in " \
        "tokenizer_config.json)" in problems
    assert len(problems) == 2
    # a template kept in tokenizer_config.json (the older layout) is as good as the file
    tokenizer_config["chat_template"] = "{{ messages }}"
    (copy / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    assert not any(p.startswith("the chat template") for p in checkpoint_problems(copy))
