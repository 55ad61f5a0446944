"""The vLLM engine: Qwen3-VL + LoRA adapters served by vLLM's offline engine (``vllm.LLM``).

Two classes implement :class:`rlfleet.engines.base.Engine`:

* :class:`VLLMEngine` runs vLLM in this process. It needs ``import vllm`` to work, i.e.
  the vllm virtual environment (``scripts/setup_vllm_venv.sh``); a rollout replica started
  with ``--engine vllm`` runs entirely inside that venv.
* :class:`VLLMProcessEngine` runs a :class:`VLLMEngine` in a child process of another
  interpreter (by default the vllm venv's) and talks to it over JSON lines on its
  stdin/stdout, so code in the main venv (tests, benchmarks) can drive the real engine.
  ``python -m rlfleet.engines.vllm --model DIR`` is that child.

How the rlfleet conventions (see ``base.py``) map onto vLLM:

* Prompts are token ids whose image placeholders are already expanded. vLLM 0.32 always
  expands each ``<|image_pad|>`` of a token prompt itself, so every run of pads is
  collapsed to one before submission; vLLM re-expands it from the image, and the engine
  checks that the prompt vLLM ran equals the one it was given (a mismatch means the two
  processors disagree on an image's token count, and raises ``EngineError``).
* Logprobs: ``logprobs_mode="processed_logprobs"`` records ``log_softmax(logits / T)``
  of the sampled token (greedy: ``log_softmax(logits)``). vLLM computes that value after
  top-k / top-p truncation, which the convention forbids, so sampling with T > 0 and
  top-k or top-p raises ``EngineError`` rather than record a different quantity.
* Stopping: only ``<|im_end|>`` stops (``ignore_eos`` + ``stop_token_ids``, and the
  model's generation_config is not read, so its extra eos ids do not stop); the token is
  kept in the output.
* Seeds: request i is sampled with seed ``seed + i`` (a per-request vLLM seed).
* Adapters: each load gets a fresh LoRA int id and a fresh vLLM LoRA name
  (``NAME#ID``), so loading a new version under an existing name is a hot swap, even when
  the new version was written over the old directory: vLLM caches adapter weights by id
  and prefix-cache (KV) blocks by LoRA name + path, never by content. The old id is
  removed from the engine afterwards. vLLM applies LoRA to the language model only.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from rlfleet.engines.base import (
    Engine,
    EngineError,
    Generation,
    GenerationRequest,
    SamplingConfig,
    request_seed,
    vision_token_ids,
)

IM_END = "<|im_end|>"

# Small defaults that fit the tiny policy on a shared 2-core machine; the 8B profile on a
# GPU passes its own (max_model_len, gpu_memory_utilization, max_lora_rank=32, ...).
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_CPU_KV_CACHE_BYTES = 256 << 20


def default_venv_python() -> Path:
    """The interpreter of the venv built by ``scripts/setup_vllm_venv.sh``."""
    venv = os.environ.get("RLFLEET_VLLM_VENV")
    if venv:
        return Path(venv) / "bin" / "python"
    cache = Path(os.environ.get("RLFLEET_CACHE", Path.home() / ".cache" / "rlfleet"))
    return cache / "venv-vllm" / "bin" / "python"


def image_runs(ids: Sequence[int], pad_id: int) -> int:
    """How many runs of consecutive ``pad_id`` tokens ``ids`` holds (one per image)."""
    runs = 0
    prev = None
    for t in ids:
        if t == pad_id and prev != pad_id:
            runs += 1
        prev = t
    return runs


def collapse_image_runs(ids: Sequence[int], pad_id: int) -> list[int]:
    """``ids`` with every run of ``pad_id`` reduced to one token (vLLM re-expands it)."""
    out: list[int] = []
    for t in ids:
        if t == pad_id and out and out[-1] == pad_id:
            continue
        out.append(int(t))
    return out


def check_sampling(params: SamplingConfig) -> None:
    """Refuse what vLLM cannot record under the rlfleet logprob convention."""
    if not params.greedy and (params.top_k > 0 or params.top_p < 1.0):
        raise EngineError(
            "the vllm engine records logprobs after top-k/top-p truncation, but rlfleet "
            "records them before it: sample with top_k=0 and top_p=1.0 (or use the hf engine)"
        )


class VLLMEngine(Engine):
    """Hosts a Qwen3-VL policy in vLLM (this process); LoRA adapters by name.

    ``engine_args`` are passed to ``vllm.LLM`` last and override everything else.
    ``kv_cache_memory_bytes`` defaults to 256 MiB on the CPU (vLLM would otherwise
    reserve 92 % of the machine's memory, and refuse to start when that much is not free);
    on a GPU give ``gpu_memory_utilization`` instead. ``enforce_eager`` defaults to True on
    the CPU (no torch.compile warm-up) and False elsewhere.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "auto",
        max_model_len: int = DEFAULT_MAX_MODEL_LEN,
        max_lora_rank: int = 32,
        max_loras: int = 2,
        enable_lora: bool = True,
        max_images_per_prompt: int = 16,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool | None = None,
        seed: int = 0,
        multiprocessing: bool = False,
        engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        # In-process engine core unless asked: no extra process, no __main__ guard needed,
        # and errors (a bad adapter, a bad image) surface here as exceptions.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if multiprocessing else "0"
        from vllm import LLM
        from vllm.platforms import current_platform

        model_path = Path(model_path)
        config_file = model_path / "config.json"
        if not config_file.is_file():
            raise FileNotFoundError(f"{model_path}: no config.json (models are never downloaded)")
        config = json.loads(config_file.read_text())
        self._image_pad = int(config["image_token_id"])

        on_cpu = current_platform.is_cpu()
        args: dict[str, Any] = dict(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype,
            max_model_len=max_model_len,
            seed=seed,
            enforce_eager=on_cpu if enforce_eager is None else enforce_eager,
            logprobs_mode="processed_logprobs",
            # the model's generation_config would add eos ids (e.g. <|endoftext|>) as stops
            generation_config="vllm",
            limit_mm_per_prompt={"image": max_images_per_prompt, "video": 0},
            disable_log_stats=True,
        )
        if enable_lora:
            args.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras)
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        if kv_cache_memory_bytes is not None:
            args["kv_cache_memory_bytes"] = kv_cache_memory_bytes
        elif (
            on_cpu
            and gpu_memory_utilization is None
            and not os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        ):
            args["kv_cache_memory_bytes"] = DEFAULT_CPU_KV_CACHE_BYTES
        args.update(engine_args or {})

        self._llm = LLM(**args)
        self._tokenizer = self._llm.get_tokenizer()
        im_end = self._tokenizer.convert_tokens_to_ids(IM_END)
        if not isinstance(im_end, int) or im_end < 0:
            raise EngineError(f"{model_path}: tokenizer has no {IM_END} token")
        self._im_end = int(im_end)
        self._ban = {i: -1e9 for i in vision_token_ids(self._tokenizer)}
        self._enable_lora = enable_lora
        self._adapters: dict[str, Any] = {}  # name -> LoRARequest
        self._next_lora_id = 1
        self._lock = threading.RLock()
        self._closed = False
        self.engine_args = {k: v for k, v in args.items() if k not in ("model", "tokenizer")}

    # -- adapters --------------------------------------------------------------------

    @property
    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        p = Path(path)
        if not (p / "adapter_config.json").is_file():
            raise EngineError(f"{path}: not a LoRA adapter directory (no adapter_config.json)")
        with self._lock:
            self._check_open()
            if not self._enable_lora:
                raise EngineError("this engine was started with enable_lora=False")
            # vLLM keys its prefix (KV) cache by LoRA *name and path*, not id: a version
            # rewritten in place under the same name would reuse KV blocks computed with
            # the old weights. A name unique per load keeps those caches apart.
            lora_id = self._next_lora_id
            self._next_lora_id += 1
            request = LoRARequest(f"{name}#{lora_id}", lora_id, str(p.resolve()))
            # Load now, so a bad adapter fails here and the first generate is not slowed.
            try:
                ok = self._llm.llm_engine.add_lora(request)
            except Exception as e:  # vLLM raises ValueError/RuntimeError/KeyError/OSError
                raise EngineError(f"cannot load adapter {name!r} from {path}: {e}") from e
            if not ok:
                raise EngineError(f"cannot load adapter {name!r} from {path}")
            old = self._adapters.get(name)
            self._adapters[name] = request
            if old is not None:
                self._llm.llm_engine.remove_lora(old.lora_int_id)

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._adapters:
                raise EngineError(f"adapter {name!r} is not loaded")
            request = self._adapters.pop(name)
            if not self._closed:
                self._llm.llm_engine.remove_lora(request.lora_int_id)

    # -- generation ------------------------------------------------------------------

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingConfig,
        adapter: str | None = None,
    ) -> list[Generation]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        with self._lock:
            self._check_open()
            check_sampling(params)
            lora = None
            if adapter is not None:
                if adapter not in self._adapters:
                    raise EngineError(
                        f"adapter {adapter!r} is not loaded (loaded: {self.adapters})"
                    )
                lora = self._adapters[adapter]
            if not requests:
                return []
            prompts = []
            for i, r in enumerate(requests):
                if not r.prompt_ids:
                    raise EngineError(f"request {i}: empty prompt")
                runs = image_runs(r.prompt_ids, self._image_pad)
                if runs != len(r.images):
                    raise EngineError(
                        f"request {i}: {runs} image placeholder runs but {len(r.images)} images"
                    )
                prompt: dict[str, Any] = {
                    "prompt_token_ids": collapse_image_runs(r.prompt_ids, self._image_pad)
                }
                if r.images:
                    prompt["multi_modal_data"] = {"image": list(r.images)}
                prompts.append(TokensPrompt(**prompt))
            sampling = [
                SamplingParams(
                    temperature=params.temperature,
                    top_p=params.top_p,
                    top_k=params.top_k,
                    max_tokens=params.max_new_tokens,
                    seed=request_seed(params, i, requests[i]),
                    logprobs=0,
                    stop_token_ids=[self._im_end],
                    # outside the action space (see rlfleet.engines.base); vLLM applies the
                    # bias before recording processed logprobs, as the convention wants
                    logit_bias=self._ban,
                    ignore_eos=True,
                    detokenize=False,
                )
                for i in range(len(requests))
            ]
            try:
                outputs = self._llm.generate(prompts, sampling, lora_request=lora, use_tqdm=False)
            except (ValueError, TypeError, RuntimeError, KeyError) as e:
                raise EngineError(f"vllm rejected the batch: {e}") from e
            return [
                self._to_generation(i, r, o)
                for i, (r, o) in enumerate(zip(requests, outputs, strict=True))
            ]

    def _to_generation(self, i: int, request: GenerationRequest, output: Any) -> Generation:
        if list(output.prompt_token_ids) != list(request.prompt_ids):
            raise EngineError(
                f"request {i}: vLLM expanded the image placeholders to "
                f"{len(output.prompt_token_ids)} prompt tokens, the request has "
                f"{len(request.prompt_ids)}: the images were not sized as the processor "
                "that built the prompt expects"
            )
        completion = output.outputs[0]
        token_ids = [int(t) for t in completion.token_ids]
        if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
            raise EngineError(f"request {i}: vLLM returned no logprob for some tokens")
        logprobs = [
            float(lp[t].logprob) for lp, t in zip(completion.logprobs, token_ids, strict=True)
        ]
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            text=self._tokenizer.decode(token_ids, skip_special_tokens=True),
            finish_reason="stop" if token_ids and token_ids[-1] == self._im_end else "length",
        )

    # -- lifecycle -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("engine is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._adapters.clear()
            engine = getattr(self._llm, "llm_engine", None)
            core = getattr(engine, "engine_core", None)
            if core is not None and hasattr(core, "shutdown"):
                core.shutdown()
            self._llm = None


# -- the same engine in a child process (JSON lines over stdin/stdout) ------------------


def _encode_image(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")  # lossless: the child sees exactly these pixels
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _decode_image(data: str) -> Image.Image:
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    image.load()
    return image


def _params_to_dict(params: SamplingConfig) -> dict[str, Any]:
    return {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "max_new_tokens": params.max_new_tokens,
        "seed": params.seed,
    }


class VLLMProcessEngine(Engine):
    """A :class:`VLLMEngine` in a child process of ``python`` (default: the vllm venv).

    The child runs this checkout's code (its ``libs/`` goes first on ``PYTHONPATH``).
    Its log (vLLM's output) goes to ``log_path`` (default: a temporary file), whose tail is
    quoted in the ``EngineError`` raised when the child fails. Keyword arguments not named
    here are :class:`VLLMEngine`'s.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        *,
        python: str | Path | None = None,
        startup_timeout_s: float = 900.0,
        call_timeout_s: float = 1800.0,
        log_path: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        python = Path(python) if python is not None else default_venv_python()
        if not python.exists():
            raise EngineError(
                f"no vllm venv interpreter at {python}: build it with "
                "scripts/setup_vllm_venv.sh (or set RLFLEET_VLLM_VENV)"
            )
        libs = str(Path(__file__).resolve().parents[2])
        child_env = dict(os.environ)
        child_env.update(env or {})
        child_env["PYTHONPATH"] = os.pathsep.join(
            p for p in (libs, child_env.get("PYTHONPATH", "")) if p
        )
        child_env.setdefault("HF_HUB_OFFLINE", "1")
        child_env.setdefault("TRANSFORMERS_OFFLINE", "1")
        if log_path is None:
            fd, log_name = tempfile.mkstemp(prefix="rlfleet-vllm-", suffix=".log")
            os.close(fd)
            log_path = log_name
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the child
        argv = [
            str(python),
            "-m",
            "rlfleet.engines.vllm",
            "--model",
            str(model_path),
            "--engine-kwargs",
            json.dumps(engine_kwargs),
        ]
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=child_env,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()
        self._lock = threading.RLock()
        self._call_timeout_s = call_timeout_s
        self._closed = False
        self._adapters: list[str] = []
        try:
            self.info: dict[str, Any] = self._reply(startup_timeout_s, "start")
        except EngineError:
            self._kill()
            raise

    def _read_loop(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _reply(self, timeout_s: float, what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._kill()
                raise EngineError(
                    f"vllm worker: no answer to {what} in {timeout_s:.0f} s; log "
                    f"{self.log_path}:\n{self._log_tail()}"
                ) from None
            if line is None:
                code = self._proc.wait()
                raise EngineError(
                    f"vllm worker exited (code {code}) during {what}; log {self.log_path}:\n"
                    f"{self._log_tail()}"
                )
            try:
                msg = json.loads(line)
            except ValueError:
                continue  # stray output of a native library; answers are JSON objects
            if not isinstance(msg, dict) or "ok" not in msg:
                continue
            if not msg["ok"]:
                detail = f"\nlog {self.log_path}:\n{self._log_tail()}" if what == "start" else ""
                raise EngineError(f"vllm worker: {msg.get('error')}{detail}")
            return msg.get("result")

    def _call(self, op: str, **payload: Any) -> Any:
        with self._lock:
            if self._closed:
                raise EngineError("engine is closed")
            assert self._proc.stdin is not None
            try:
                self._proc.stdin.write(json.dumps({"op": op, **payload}) + "\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, OSError) as e:
                raise EngineError(f"vllm worker is gone: {e}; log:\n{self._log_tail()}") from e
            return self._reply(self._call_timeout_s, op)

    @property
    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def load_adapter(self, name: str, path: str) -> None:
        self._adapters = self._call("load_adapter", name=name, path=str(path))

    def unload_adapter(self, name: str) -> None:
        self._adapters = self._call("unload_adapter", name=name)

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingConfig,
        adapter: str | None = None,
    ) -> list[Generation]:
        result = self._call(
            "generate",
            requests=[
                {"prompt_ids": list(r.prompt_ids),
                 "images": [_encode_image(im) for im in r.images], "seed": r.seed}
                for r in requests
            ],
            params=_params_to_dict(params),
            adapter=adapter,
        )
        return [Generation(**g) for g in result]

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._log.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            try:
                if self._proc.poll() is None:
                    self._call("close")
            except EngineError:
                pass
            self._closed = True
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            self._kill()


def _handle(engine: VLLMEngine, msg: dict[str, Any]) -> Any:
    op = msg.get("op")
    if op == "generate":
        requests = [
            GenerationRequest(list(r["prompt_ids"]), [_decode_image(d) for d in r["images"]],
                              r.get("seed"))
            for r in msg["requests"]
        ]
        gens = engine.generate(requests, SamplingConfig(**msg["params"]), msg.get("adapter"))
        return [g.__dict__ for g in gens]
    if op == "load_adapter":
        engine.load_adapter(msg["name"], msg["path"])
        return engine.adapters
    if op == "unload_adapter":
        engine.unload_adapter(msg["name"])
        return engine.adapters
    if op == "close":
        return None
    raise EngineError(f"unknown op {op!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """The child of :class:`VLLMProcessEngine`: one JSON request per stdin line, one
    JSON answer (``{"ok": true, "result": ...}`` or ``{"ok": false, "error": ...}``) per
    stdout line; the first answer reports the engine ready."""
    parser = argparse.ArgumentParser(prog="python -m rlfleet.engines.vllm")
    parser.add_argument("--model", required=True)
    parser.add_argument("--engine-kwargs", default="{}", help="VLLMEngine kwargs as JSON")
    args = parser.parse_args(argv)

    # vLLM logs to stdout: keep the real stdout for answers, send everything else to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())

    def answer(obj: dict[str, Any]) -> None:
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    started = time.monotonic()
    try:
        import vllm

        engine = VLLMEngine(args.model, **json.loads(args.engine_kwargs))
    except Exception as e:  # report why, then exit non-zero
        answer({"ok": False, "error": f"{type(e).__name__}: {e}"})
        raise
    answer(
        {
            "ok": True,
            "result": {
                "vllm": vllm.__version__,
                "start_s": round(time.monotonic() - started, 2),
                "engine_args": engine.engine_args,
            },
        }
    )
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
                result = _handle(engine, msg)
                answer({"ok": True, "result": result})
            except (EngineError, ValueError, KeyError, TypeError) as e:
                answer({"ok": False, "error": f"{type(e).__name__}: {e}"})
                continue
            if msg.get("op") == "close":
                break
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
