"""Chat encoding: OpenAI-style messages with images -> one growing token sequence.

The text is the checkpoint's own chat template (``tokenizer.chat_template``, saved as
``chat_template.jinja`` or in ``tokenizer_config.json``), applied by transformers'
``apply_chat_template``; the codec only expands each ``<|image_pad|>`` the template
writes to the image's token count, and cuts the template's output into a prompt and
per-turn deltas. With Qwen's template (ChatML) a multi-turn episode is ONE token
sequence, never re-tokenised::

    prompt      <|im_start|>user\\n<|vision_start|><|image_pad|>*N<|vision_end|>TEXT<|im_end|>\\n
                <|im_start|>assistant\\n                                   (mask 0)
    turn 1      ACTION <|im_end|>                                          (mask 1, sampled)
    delta 1     \\n<|im_start|>user\\n<|vision_start|><|image_pad|>*N<|vision_end|>TEXT<|im_end|>\\n
                <|im_start|>assistant\\n                                   (mask 0)
    turn 2      ACTION <|im_end|>                                          (mask 1)
    ...

The model's turn ENDS WITH ``<|im_end|>`` (it is the stop token; it is generated, masked
1 and carries a logprob, so the policy learns to stop). The ``\\n`` that ChatML puts after
``<|im_end|>`` belongs to the next observation delta. If a turn was cut by the token
limit (no ``<|im_end|>``), the delta starts with an ``<|im_end|>`` of its own (mask 0) so
the conversation stays well-formed.

A delta is what the template writes after an assistant turn's content up to the next
assistant header; the codec finds it by rendering a probe conversation and refuses a
template that does not end an assistant turn with ``<|im_end|>``. Delta encoding equals
encoding the whole conversation again (assistant turns as text) whenever the generated
tokens are the tokenizer's own tokenisation of their text and end with ``<|im_end|>``:
special tokens split the text before BPE, so every piece between them tokenises the same
either way. A sampled turn may be a non-canonical
split of its text; the sequence keeps the sampled tokens (the ones whose logprobs were
recorded), which is why nothing is ever re-tokenised.

Images: each image part becomes ``<|vision_start|>`` + N x ``<|image_pad|>`` +
``<|vision_end|>`` with N from the processor's grid (one per 16x16 px on the tiny model).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from rlfleet.data_urls import data_url_bytes
from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.tokenizer import IM_END, IM_START, IMAGE_PAD

Message = Mapping[str, Any]


class ChatFormatError(ValueError):
    """A message or content part the codec cannot encode."""


def image_from_part(part: Mapping[str, Any]) -> Image.Image:
    """The RGB image of a content part: ``image_url`` with a data URL, or ``image``."""
    if part.get("type") == "image_url" or "image_url" in part:
        try:
            raw = data_url_bytes(part.get("image_url"))
            img = Image.open(io.BytesIO(raw))
            img.load()
        except OSError as e:
            raise ChatFormatError(f"undecodable image data URL: {e}") from e
        except ValueError as e:
            raise ChatFormatError(str(e)) from e
        return img.convert("RGB")
    img = part.get("image")
    if isinstance(img, Image.Image):
        return img.convert("RGB")
    raise ChatFormatError(f"unsupported image part: keys {sorted(part)}")


def image_to_data_url(image: Image.Image) -> str:
    """PNG data URL of an image (the form observations travel in)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _is_image_part(part: Mapping[str, Any]) -> bool:
    return part.get("type") in ("image", "image_url") or "image" in part or "image_url" in part


@dataclass
class Encoded:
    """Token ids (image placeholders expanded) and the images they refer to, in order."""

    token_ids: list[int]
    images: list[Image.Image] = field(default_factory=list)


# Stands for an assistant turn's content in the probe conversation that shows where the
# template puts the text between two turns (plain letters: no template escapes them).
_TURN_MARK = "RLFLEETTURNMARK"


class ChatCodec:
    """Encodes prompts and observation deltas with the checkpoint's chat template."""

    def __init__(self, processor: PolicyProcessor) -> None:
        self.processor = processor
        self.tokenizer = processor.tokenizer
        ids = self.tokenizer.convert_tokens_to_ids([IM_START, IM_END, IMAGE_PAD])
        self.im_start_id, self.im_end_id, self.image_pad_id = (int(i) for i in ids)
        self.stop_token_ids = [self.im_end_id]
        if not getattr(self.tokenizer, "chat_template", None):
            raise ChatFormatError("the checkpoint has no chat template (chat_template.jinja or "
                                  "chat_template in tokenizer_config.json)")
        self._after_turn = self._after_turn_text()

    # -- rendering -------------------------------------------------------------------

    def _template_message(self, message: Message, images: list[Image.Image]) -> dict:
        """``message`` as the template sees it: image parts become ``{"type": "image"}``
        (the template writes the vision tokens), their images go to ``images`` in order."""
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatFormatError("message without a role")
        if "content" not in message:
            raise ChatFormatError("message without content")
        content = message["content"]
        if isinstance(content, str):
            return {"role": role, "content": content}
        parts: list[dict] = []
        for part in content:
            if not isinstance(part, Mapping):
                raise ChatFormatError(f"content part must be a dict, got {type(part).__name__}")
            if _is_image_part(part):
                images.append(image_from_part(part))
                parts.append({"type": "image"})
            elif part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise ChatFormatError("text part without a string 'text'")
                parts.append({"type": "text", "text": part["text"]})
            else:
                raise ChatFormatError(f"unsupported content part type {part.get('type')!r}")
        return {"role": role, "content": parts}

    def _render(self, messages: Iterable[Message], add_generation_prompt: bool
                ) -> tuple[str, list[Image.Image]]:
        images: list[Image.Image] = []
        converted = [self._template_message(m, images) for m in messages]
        text = self.tokenizer.apply_chat_template(
            converted, tokenize=False, add_generation_prompt=add_generation_prompt)
        return text, images

    def _after_turn_text(self) -> str:
        """What the template writes between an assistant turn's content and the next
        message (ChatML: ``<|im_end|>\n``); it must start with ``<|im_end|>``, the stop
        token the model generates."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _TURN_MARK}]
        text, _ = self._render(probe, add_generation_prompt=False)
        if text.count(_TURN_MARK) != 1:
            raise ChatFormatError("the chat template does not write an assistant turn's content "
                                  "verbatim")
        after = text[text.index(_TURN_MARK) + len(_TURN_MARK):]
        if not after.startswith(IM_END):
            raise ChatFormatError(f"the chat template ends an assistant turn with {after!r}, "
                                  f"not {IM_END} (the stop token the policy generates)")
        return after

    def _tokenize(self, text: str, images: Sequence[Image.Image]) -> list[int]:
        """``text`` tokenised with each ``<|image_pad|>`` expanded to its image's count."""
        pieces = text.split(IMAGE_PAD)
        if len(pieces) != len(images) + 1:
            raise ChatFormatError(f"the chat template wrote {len(pieces) - 1} image "
                                  f"placeholders for {len(images)} images")
        out = [pieces[0]]
        for image, piece in zip(images, pieces[1:], strict=True):
            out.append(IMAGE_PAD * self.processor.image_token_count(image) + piece)
        return list(self.tokenizer("".join(out), add_special_tokens=False)["input_ids"])

    # -- public ----------------------------------------------------------------------

    def encode_conversation(
        self, messages: Iterable[Message], add_generation_prompt: bool = True
    ) -> Encoded:
        """The whole conversation through the template (assistant turns as text),
        placeholders expanded."""
        text, images = self._render(messages, add_generation_prompt)
        return Encoded(self._tokenize(text, images), images)

    def encode_prompt(self, messages: Iterable[Message]) -> Encoded:
        """The initial prompt (system/user messages) followed by the assistant header."""
        return self.encode_conversation(messages, add_generation_prompt=True)

    def encode_observation(self, message: Message, previous_turn: Sequence[int]) -> Encoded:
        """The delta appended after the model's turn ``previous_turn`` (its generated ids).

        ``message`` is the next observation, e.g. ``{"role": "user", "content": [...]}``; a
        bare content (string or part list) is taken as a user message. The delta is what
        the template writes after a turn's content, through the next assistant header,
        less the ``<|im_end|>`` the turn already ends with.
        """
        if not isinstance(message, Mapping):
            message = {"role": "user", "content": message}
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _TURN_MARK},
                 message]
        text, images = self._render(probe, add_generation_prompt=True)
        delta = text[text.index(_TURN_MARK) + len(_TURN_MARK):]
        closed = len(previous_turn) > 0 and int(previous_turn[-1]) == self.im_end_id
        if closed:
            delta = delta.removeprefix(IM_END)
        return Encoded(self._tokenize(delta, images), images)

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of a generated turn, without special tokens (``<|im_end|>``)."""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)


@dataclass
class Transcript:
    """One multi-turn trajectory as a single token sequence.

    ``loss_mask`` is 1 on generated tokens only; ``logprobs`` holds the sampling policy's
    logprob on generated tokens and 0.0 elsewhere; ``turns`` lists the ``[start, end)``
    token spans of the generated turns.
    """

    codec: ChatCodec
    token_ids: list[int] = field(default_factory=list)
    images: list[Image.Image] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)

    @classmethod
    def start(cls, codec: ChatCodec, messages: Iterable[Message]) -> Transcript:
        t = cls(codec)
        t._append_context(codec.encode_prompt(messages))
        return t

    def _append_context(self, enc: Encoded) -> None:
        self.token_ids.extend(enc.token_ids)
        self.images.extend(enc.images)
        self.loss_mask.extend([0] * len(enc.token_ids))
        self.logprobs.extend([0.0] * len(enc.token_ids))

    def add_turn(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> None:
        """Append the model's generated turn (ids + their sampling logprobs)."""
        if len(token_ids) != len(logprobs):
            raise ValueError("token_ids and logprobs differ in length")
        if self.turns and self.turns[-1][1] == len(self.token_ids):
            raise ValueError("two model turns in a row: add an observation between them")
        start = len(self.token_ids)
        self.token_ids.extend(int(t) for t in token_ids)
        self.loss_mask.extend([1] * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.turns.append((start, len(self.token_ids)))

    def add_observation(self, message: Message) -> None:
        """Append the next observation as a delta after the last model turn."""
        if not self.turns or self.turns[-1][1] != len(self.token_ids):
            raise ValueError("an observation must follow a model turn")
        start, end = self.turns[-1]
        self._append_context(self.codec.encode_observation(message, self.token_ids[start:end]))
