"""The transformers engine: Qwen3-VL + PEFT LoRA adapters, CPU or GPU.

Batched generation is a plain decode loop with a KV cache over left-padded prompts.
Positions are computed explicitly with :func:`rlfleet.policy.logprobs.collate` (M-RoPE for
images, then +1 per generated token), the same rule the learner's one-pass
``sequence_logprobs`` uses, so recorded logprobs match a fresh forward pass.
Sampling draws each request from its own ``torch.Generator`` (``request_seed``).

Work done once: the vision tower runs once per distinct frame (adapters touch only the
language model, see :mod:`rlfleet.policy.vision`), and requests of a batch that are the
same prompt (the G episodes of a group on their first turn, or passing through the same
state later) share one prefill whose KV cache is then copied to each of them; each is
still sampled from its own generator.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch
from peft import PeftModel

from rlfleet.engines.base import (
    EngineError,
    Generation,
    GenerationRequest,
    SamplingConfig,
    request_seed,
)
from rlfleet.engines.loaded import AdapterEngine, LoadedAdapters, check_adapter_dir
from rlfleet.policy.chat import ChatCodec
from rlfleet.policy.loading import PolicyProcessor, load_policy, vision_token_ids
from rlfleet.policy.logprobs import collate, forward, token_logprobs, unwrap
from rlfleet.policy.vision import VisionEncoder, image_key
from rlfleet.storage.adapter_versions import ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE


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


class HFEngine(AdapterEngine):
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
        vision_cache_bytes: int | None = None,
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
        self.vision = VisionEncoder(model, processor, **(
            {} if vision_cache_bytes is None else {"max_bytes": vision_cache_bytes}))
        self.prefill_rows = 0  # prompts prefilled, after merging duplicates
        self.requests_served = 0
        self.max_batch_size = max_batch_size
        # public name -> (PEFT-internal name, path). PEFT adapter names must be valid
        # module keys and must not be substrings of "lora_" (it then mangles weights on
        # load), so the engine never hands it the caller's name.
        self._adapters: LoadedAdapters[tuple[str, str]] = LoadedAdapters()
        self._lock = threading.RLock()
        self._closed = False

    # -- adapters --------------------------------------------------------------------

    def load_adapter(self, name: str, path: str) -> None:
        p = check_adapter_dir(path)
        with self._lock:
            self._check_open()
            # Load the new weights under a fresh internal name first, so a failed
            # reload leaves the old version of ``name`` serving.
            internal = f"rlfleet{self._adapters.next_id()}"
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
            self._install_adapter(name, internal, str(p))

    def load_adapter_files(
        self,
        name: str,
        files: Mapping[str, bytes | bytearray | memoryview],
        *,
        source: str = "<memory>",
        timings: dict[str, float] | None = None,
    ) -> None:
        """Load (or replace) adapter ``name`` from a PEFT LoRA directory's files already in
        memory (``adapter_config.json`` and ``adapter_model.safetensors`` bytes, e.g. read
        and verified against a manifest), touching no filesystem: what is loaded is
        exactly those bytes. The weights become tensors over the given buffers without a
        copy when they are writable (the tensors keep them alive; the caller must not
        change them afterwards) and are assigned to adapter layers created without
        initialising them. Same contract as ``load_adapter``: a failure raises
        EngineError and leaves the old version of ``name`` serving. ``timings``, when
        given, receives seconds per stage (parse, peft)."""
        clock = time.perf_counter()
        if getattr(self._base, "_checkpoint_conversion_mapping", None):
            # PEFT renames saved keys for such (older transformers) models on a first load
            # from a dir; this path does not, so it refuses rather than load it differently
            raise EngineError(f"cannot load adapter {name!r} from {source}: this model "
                              "remaps checkpoint keys; load the adapter from a directory")
        try:
            config = _peft_config_from_json(files[ADAPTER_CONFIG_FILE])
            state = safetensors_views(files[ADAPTER_WEIGHTS_FILE])
        except KeyError as e:
            raise EngineError(f"cannot load adapter {name!r} from {source}: no {e}") from e
        except Exception as e:  # noqa: BLE001 - malformed config/weights: a clear error
            raise EngineError(f"cannot load adapter {name!r} from {source}: {e}") from e
        if timings is not None:
            timings["parse_s"] = time.perf_counter() - clock
            clock = time.perf_counter()
        with self._lock:
            self._check_open()
            internal = f"rlfleet{self._adapters.next_id()}"
            created: PeftModel | None = None
            try:
                if self._peft is None:
                    from peft.auto import MODEL_TYPE_TO_PEFT_MODEL_MAPPING

                    cls = MODEL_TYPE_TO_PEFT_MODEL_MAPPING.get(config.task_type, PeftModel)
                    created = cls(self._base, config, internal, low_cpu_mem_usage=True)
                    peft = created
                else:
                    peft = self._peft
                    peft.add_adapter(internal, config, low_cpu_mem_usage=True)
                _assign_adapter_weights(peft, internal, state)
                peft.eval()
            except Exception as e:  # peft raises a mix of ValueError/KeyError/RuntimeError
                with contextlib.suppress(Exception):  # best effort: drop the half-load
                    if created is not None:
                        self._base = created.unload()  # back to the plain model
                    elif self._peft is not None and internal in self._peft.peft_config:
                        self._peft.delete_adapter(internal)
                raise EngineError(f"cannot load adapter {name!r} from {source}: {e}") from e
            if created is not None:
                self._peft = created
            self._install_adapter(name, internal, source)
        if timings is not None:
            timings["peft_s"] = time.perf_counter() - clock

    def _install_adapter(self, name: str, internal: str, source: str) -> None:
        # Under self._lock, with ``internal`` loaded: it becomes ``name``; the version it
        # replaces (if any) is dropped.
        assert self._peft is not None
        old = self._adapters.install(name, (internal, source))
        if old is not None:
            if old[0] in self._peft.active_adapters:
                self._peft.set_adapter(internal)
            self._peft.delete_adapter(old[0])

    def unload_adapter(self, name: str) -> None:
        with self._lock:
            internal, _ = self._adapters.pop(name)
            assert self._peft is not None
            if self._adapters:
                if internal in self._peft.active_adapters:
                    # switch first, so PEFT does not warn about deleting the active one
                    self._peft.set_adapter(self._adapters.handles()[0][0])
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
        internal, _ = self._adapters.handle(adapter)
        assert self._peft is not None  # an adapter is loaded
        self._peft.set_adapter(internal)
        yield self._peft

    # -- generation ------------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest], params: SamplingConfig,
                 adapter: str | None = None) -> list[Generation]:
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

    def _generators(self, requests: list[GenerationRequest], params: SamplingConfig,
                    first_index: int) -> list:
        gens = []
        for i, r in enumerate(requests):
            seed = request_seed(params, first_index + i, r)
            g = None
            if seed is not None:
                g = torch.Generator(device=self.device)
                g.manual_seed(seed)
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
        # one prefill per distinct prompt (tokens and frames), in order of first appearance
        image_keys = [[image_key(im) for im in r.images] for r in requests]
        distinct: dict[tuple, int] = {}
        inverse = [distinct.setdefault((tuple(r.prompt_ids), tuple(k)), len(distinct))
                   for r, k in zip(requests, image_keys, strict=True)]
        firsts = [inverse.index(u) for u in range(len(distinct))]
        try:
            batch = collate(
                self.processor,
                [requests[i].prompt_ids for i in firsts],
                [requests[i].images for i in firsts],
                padding_side="left",
                pad_token_id=pad,
                vision=self.vision,
                image_keys=[k for i in firsts for k in image_keys[i]],
            ).to(self.device)
        except ValueError as e:
            raise EngineError(f"bad request: {e}") from e
        B = len(requests)
        self.prefill_rows += len(firsts)
        self.requests_served += B
        gens = self._generators(requests, params, first_index)
        stop = torch.tensor(self.codec.stop_token_ids, device=self.device)

        out = forward(inner, batch, use_cache=True, logits_to_keep=1)
        expand = torch.tensor(inverse, device=self.device)
        cache = out.past_key_values
        if len(firsts) < B:
            cache.reorder_cache(expand)  # every request gets its own copy of its prompt's KV
        logits = out.logits[:, -1].float()[expand]
        attention_mask = batch.attention_mask[expand]
        text_pos = torch.tensor(batch.lengths, device=self.device)[expand]
        mrope_pos = batch.next_position[expand]

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

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._peft = None
            self._base = None  # type: ignore[assignment]
            self._adapters.clear()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


# -- adapters from memory ----------------------------------------------------------------

_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024  # the limit safetensors itself applies


def safetensors_views(data: bytes | bytearray | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in memory, as views over its bytes (no copy)
    when the buffer is writable (a read-only one is copied once first). Validates what
    the format requires (header size and JSON, known dtypes, shapes matching byte ranges,
    ranges inside the data, contiguous and non-overlapping); ValueError otherwise."""
    import json
    import math
    import struct
    import sys

    view = memoryview(data).cast("B")
    if sys.byteorder != "little":  # pragma: no cover - the format is little-endian
        from safetensors.torch import load

        return load(bytes(view))
    if len(view) < 8:
        raise ValueError("adapter_model.safetensors is too short to be safetensors")
    (n,) = struct.unpack("<Q", view[:8])
    if n > _MAX_SAFETENSORS_HEADER or 8 + n > len(view):
        raise ValueError("adapter_model.safetensors has an invalid header length")
    try:
        header = json.loads(bytes(view[8:8 + n]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError("adapter_model.safetensors header is not valid JSON") from e
    if not isinstance(header, dict):
        raise ValueError("adapter_model.safetensors header is not a JSON object")
    if view.readonly:
        view = memoryview(bytearray(view))
    raw = (torch.frombuffer(view, dtype=torch.uint8) if len(view)
           else torch.empty(0, dtype=torch.uint8))
    start, body = 8 + n, len(view) - 8 - n
    spans: list[tuple[int, int]] = []
    tensors: dict[str, torch.Tensor] = {}
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ValueError(f"safetensors entry {key!r} is not an object")
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))  # type: ignore[arg-type]
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if dtype is None:
            raise ValueError(f"safetensors entry {key!r}: unsupported dtype {info.get('dtype')!r}")
        if (not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                           for x in [*shape, *offsets])):
            raise ValueError(f"safetensors entry {key!r}: bad shape or data_offsets")
        begin, end = offsets
        if not begin <= end <= body or end - begin != math.prod(shape) * dtype.itemsize:
            raise ValueError(f"safetensors entry {key!r}: data_offsets {offsets} do not "
                             f"match shape {shape} ({body} data bytes)")
        spans.append((begin, end))
        chunk = raw[start + begin:start + end]
        if (start + begin) % dtype.itemsize:  # misaligned for a view: copy this one
            chunk = chunk.clone()
        tensors[key] = chunk.view(dtype).reshape(shape)
    covered = 0
    for begin, end in sorted(spans):
        if begin != covered:
            raise ValueError("safetensors data ranges overlap or leave holes")
        covered = end
    if covered != body:
        raise ValueError("safetensors data ranges do not cover the data")
    return tensors


def _peft_config_from_json(data: bytes | bytearray | memoryview):  # noqa: ANN202
    """The PeftConfig of an adapter_config.json held in memory, built the way PEFT's
    ``PeftConfig.from_pretrained`` builds it from the file (for inference)."""
    import json

    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    doc = json.loads(bytes(data).decode("utf-8"))
    if not isinstance(doc, dict):
        raise ValueError("adapter_config.json is not a JSON object")
    doc.pop("runtime_config", None)  # what PeftConfig.from_json_file drops too
    config_cls = PEFT_TYPE_TO_CONFIG_MAPPING.get(doc.get("peft_type"))
    if config_cls is None:
        raise ValueError(f"adapter_config.json: unknown peft_type {doc.get('peft_type')!r}")
    config = config_cls.from_peft_type(**config_cls.check_kwargs(**doc))
    config.inference_mode = True
    return config


def _assign_adapter_weights(peft: PeftModel, internal: str,
                            state: dict[str, torch.Tensor]) -> None:
    """Puts `state` (a saved PEFT state dict) into adapter `internal`, whose layers were
    created on the meta device: assigned, not copied. Every weight of the adapter must be
    in `state` (a missing one would stay without storage)."""
    from peft.utils import set_peft_model_state_dict

    set_peft_model_state_dict(peft, state, adapter_name=internal, low_cpu_mem_usage=True)
    missing = [n for n, t in [*peft.named_parameters(), *peft.named_buffers()] if t.is_meta]
    if missing:
        raise ValueError(f"adapter_model.safetensors lacks {len(missing)} of the adapter's "
                         f"weights, e.g. {missing[:3]}")
    if hasattr(peft.base_model, "_cast_adapter_dtype"):  # what PEFT's own load does last
        peft.base_model._cast_adapter_dtype(adapter_name=internal, autocast_adapter_dtype=True)
