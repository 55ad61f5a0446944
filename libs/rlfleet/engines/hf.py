"""The transformers engine: Qwen3-VL + PEFT LoRA adapters, CPU or GPU.

Batched generation is a plain decode loop with a KV cache over left-padded prompts.
Positions are computed explicitly with :func:`rlfleet.policy.logprobs.collate` (M-RoPE for
images, then +1 per generated token), the same rule the learner's one-pass
``sequence_logprobs`` uses, so recorded logprobs match a fresh forward pass.
Sampling draws each request from its own ``torch.Generator`` seeded ``seed + i``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from peft import PeftModel

from rlfleet.engines.base import (
    Engine,
    EngineError,
    Generation,
    GenerationRequest,
    SamplingConfig,
)
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.loading import PolicyProcessor, load_policy, vision_token_ids
from rlfleet.policy.logprobs import collate, forward, token_logprobs, unwrap


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k / nucleus (top-p) set to -inf (rows independent)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class HFEngine(Engine):
    """Hosts a Qwen3-VL policy with transformers; LoRA adapters via PEFT, by name."""

    name = "hf"

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str | None = None,
        model: torch.nn.Module | None = None,
        processor: PolicyProcessor | None = None,
        max_batch_size: int = 64,
        num_threads: int | None = None,
    ) -> None:
        # CPU: on a busy machine one intra-op thread is far faster than several
        # contending ones (process-wide setting, so only when asked).
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if model is None or processor is None:
            if model_path is None:
                raise ValueError("give model_path, or both model and processor")
            model, processor = load_policy(model_path, device=device, dtype=dtype)
        self._base = model.eval()
        self._peft: PeftModel | None = None
        self.processor = processor
        self.codec = ChatCodec(processor)
        self.banned_token_ids = vision_token_ids(processor)
        self.device = next(model.parameters()).device
        self.max_batch_size = max_batch_size
        # public name -> (PEFT-internal name, path). PEFT adapter names must be valid
        # module keys and must not be substrings of "lora_" (it then mangles weights on
        # load), so the engine never hands it the caller's name.
        self._adapters: dict[str, tuple[str, str]] = {}
        self._next_internal = 0
        self._lock = threading.RLock()
        self._closed = False

    # -- adapters --------------------------------------------------------------------

    @property
    def adapters(self) -> list[str]:
        return sorted(self._adapters)

    def load_adapter(self, name: str, path: str) -> None:
        p = Path(path)
        if not (p / "adapter_config.json").is_file():
            raise EngineError(f"{path}: not a LoRA adapter directory (no adapter_config.json)")
        with self._lock:
            self._check_open()
            # Load the new weights under a fresh internal name first, so a failed
            # reload leaves the old version of ``name`` serving.
            internal = f"rlfleet{self._next_internal}"
            self._next_internal += 1
            try:
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(
                        self._base, str(p), adapter_name=internal, is_trainable=False
                    )
                    self._peft.eval()
                else:
                    self._peft.load_adapter(str(p), adapter_name=internal, is_trainable=False)
            except Exception as e:  # peft raises a mix of ValueError/KeyError/OSError
                if self._peft is not None and internal in self._peft.peft_config:
                    with contextlib.suppress(Exception):  # best effort: drop the half-load
                        self._peft.delete_adapter(internal)
                raise EngineError(f"cannot load adapter {name!r} from {path}: {e}") from e
            old = self._adapters.get(name)
            self._adapters[name] = (internal, str(p))
            if old is not None:
                if old[0] in self._peft.active_adapters:
                    self._peft.set_adapter(internal)
                self._peft.delete_adapter(old[0])

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            if name not in self._adapters:
                raise EngineError(f"adapter {name!r} is not loaded")
            assert self._peft is not None
            internal, _ = self._adapters.pop(name)
            if self._adapters:
                if internal in self._peft.active_adapters:
                    # switch first, so PEFT does not warn about deleting the active one
                    self._peft.set_adapter(next(iter(self._adapters.values()))[0])
                self._peft.delete_adapter(internal)
            else:
                # last one: strip the LoRA layers and go back to the plain model
                self._base = self._peft.unload()
                self._peft = None

    @contextlib.contextmanager
    def using(self, adapter: str | None) -> Iterator[torch.nn.Module]:
        """The model with ``adapter`` active (``None``: all adapters disabled), e.g. to
        score sequences with :func:`rlfleet.policy.sequence_logprobs`. Holds the lock."""
        with self._lock:
            self._check_open()
            with self._use_adapter(adapter) as model:
                yield model

    @contextlib.contextmanager
    def _use_adapter(self, adapter: str | None) -> Iterator[torch.nn.Module]:
        if adapter is None:
            if self._peft is None:
                yield self._base
            else:
                with self._peft.disable_adapter():
                    yield self._peft
            return
        if adapter not in self._adapters or self._peft is None:
            raise EngineError(f"adapter {adapter!r} is not loaded (loaded: {self.adapters})")
        self._peft.set_adapter(self._adapters[adapter][0])
        yield self._peft

    # -- generation ------------------------------------------------------------------

    def generate(
        self,
        requests: list[GenerationRequest],
        params: SamplingConfig,
        adapter: str | None = None,
    ) -> list[Generation]:
        with self._lock:
            self._check_open()
            if not requests:
                return []
            for i, r in enumerate(requests):
                if not r.prompt_ids:
                    raise EngineError(f"request {i}: empty prompt")
            out: list[Generation] = []
            with self._use_adapter(adapter) as model, torch.inference_mode():
                for start in range(0, len(requests), self.max_batch_size):
                    chunk = requests[start : start + self.max_batch_size]
                    out.extend(self._generate_batch(model, chunk, params, first_index=start))
            return out

    def _generators(self, n: int, seed: int | None, first_index: int) -> list:
        if seed is None:
            return [None] * n
        gens = []
        for i in range(n):
            g = torch.Generator(device=self.device)
            g.manual_seed(int(seed) + first_index + i)
            gens.append(g)
        return gens

    def _generate_batch(
        self,
        model: torch.nn.Module,
        requests: list[GenerationRequest],
        params: SamplingConfig,
        first_index: int,
    ) -> list[Generation]:
        inner = unwrap(model)
        pad = int(self.processor.tokenizer.pad_token_id or 0)
        try:
            batch = collate(
                self.processor,
                [r.prompt_ids for r in requests],
                [r.images for r in requests],
                padding_side="left",
                pad_token_id=pad,
            ).to(self.device)
        except ValueError as e:
            raise EngineError(f"bad request: {e}") from e
        B = len(requests)
        gens = self._generators(B, params.seed, first_index)
        stop = torch.tensor(self.codec.stop_token_ids, device=self.device)

        out = forward(inner, batch, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1].float()
        attention_mask = batch.attention_mask
        text_pos = torch.tensor(batch.lengths, device=self.device)
        mrope_pos = batch.next_position

        tokens: list[list[int]] = [[] for _ in range(B)]
        logprobs: list[list[float]] = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        banned = torch.tensor(self.banned_token_ids, device=self.device)
        for step in range(params.max_new_tokens):
            allowed = logits.index_fill(-1, banned, float("-inf"))
            if params.greedy:
                nxt = allowed.argmax(-1)
            else:
                probs = torch.softmax(
                    filter_logits(allowed / params.temperature, params.top_k, params.top_p), -1
                )
                nxt = torch.stack(
                    [torch.multinomial(probs[i], 1, generator=gens[i])[0] for i in range(B)]
                )
            lp = token_logprobs(logits, nxt, params.temperature, banned)
            for i in range(B):
                if not done[i]:
                    tokens[i].append(int(nxt[i]))
                    logprobs[i].append(float(lp[i]))
            done |= torch.isin(nxt, stop)
            if bool(done.all()) or step == params.max_new_tokens - 1:
                break
            nxt = nxt.masked_fill(done, pad)  # finished rows idle on padding
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(B, 1)], dim=1)
            position_ids = torch.stack([text_pos, mrope_pos, mrope_pos, mrope_pos]).unsqueeze(-1)
            out = inner(
                input_ids=nxt.unsqueeze(-1),
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1].float()
            text_pos = text_pos + 1
            mrope_pos = mrope_pos + 1

        stop_ids = set(self.codec.stop_token_ids)
        return [
            Generation(
                token_ids=t,
                logprobs=lp,
                text=self.codec.decode(t),
                finish_reason="stop" if t and t[-1] in stop_ids else "length",
            )
            for t, lp in zip(tokens, logprobs, strict=True)
        ]

    # -- lifecycle -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("engine is closed")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._peft = None
            self._base = None  # type: ignore[assignment]
            self._adapters.clear()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
