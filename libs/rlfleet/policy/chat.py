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

Only the template writes structure. A message's text (an env's feedback that quotes the
model's last reply, a status line, an instruction) is tokenised with its special tokens
inert: ``<|im_start|>`` or ``<|image_pad|>`` inside it becomes the byte-level pieces of
those characters, never the special token, so a reply cannot open a turn or claim an
image in the next prompt. The codec renders the template with a slot in place of each
text, reads special tokens only in what the template wrote, and puts the texts back as
plain text; where no text holds a special token's characters the ids are exactly those
of tokenising the whole rendered string.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from rlfleet.data_urls import data_url_bytes
from rlfleet.limits import ImageBounds, InputTooLarge
from rlfleet.policy.loading import PolicyProcessor
from rlfleet.policy.tokenizer import IM_END, IM_START, IMAGE_PAD

Message = Mapping[str, Any]


class ChatFormatError(ValueError):
    """A message or content part the codec cannot encode."""


_DEFAULT_BOUNDS = ImageBounds()


def image_from_part(part: Mapping[str, Any], bounds: ImageBounds = _DEFAULT_BOUNDS
                    ) -> Image.Image:
    """The RGB image of a content part: ``image_url`` with a data URL, or ``image``.

    An encoded image is checked against ``bounds`` (its bytes, then its size from the
    header, which is all ``Image.open`` reads) before any pixel is decoded: InputTooLarge
    naming the size and the limit."""
    if part.get("type") == "image_url" or "image_url" in part:
        try:
            raw = data_url_bytes(part.get("image_url"))
        except ValueError as e:
            raise ChatFormatError(str(e)) from e
        bounds.check_image_bytes(len(raw))
        try:
            img = Image.open(io.BytesIO(raw))
        except Image.DecompressionBombError as e:  # Pillow's own bound, far above ours
            raise InputTooLarge(f"an image over the limit of {bounds.image_pixels} "
                                f"pixels per image (Pillow: {e})") from None
        except OSError as e:
            raise ChatFormatError(f"undecodable image data URL: {e}") from e
        bounds.check_image_size(*img.size)
        try:
            img.load()
        except (OSError, ValueError) as e:
            raise ChatFormatError(f"undecodable image data URL: {e}") from e
        return img.convert("RGB")
    img = part.get("image")
    if isinstance(img, Image.Image):
        bounds.check_image_size(*img.size)
        return img.convert("RGB")
    raise ChatFormatError(f"unsupported image part: keys {sorted(part)}")


def image_to_data_url(image: Image.Image) -> str:
    """PNG data URL of an image (the form observations travel in)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _is_image_part(part: Mapping[str, Any]) -> bool:
    return part.get("type") in ("image", "image_url") or "image" in part or "image_url" in part


# A message's text while the template renders (private-use characters, which no template
# writes): the rendered string is cut at these slots into what the template wrote and
# what the messages brought.
_TEXT_SLOT = "\ue000{}\ue001"
_TEXT_SLOT_RE = re.compile("\ue000(\\d+)\ue001")


@dataclass
class _Rendered:
    """The template's output as pieces ``(text, from_message)``, and its images."""

    pieces: list[tuple[str, bool]]
    images: list[Image.Image]

    @property
    def text(self) -> str:
        return "".join(text for text, _ in self.pieces)


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

    def __init__(self, processor: PolicyProcessor, image_bounds: ImageBounds | None = None
                 ) -> None:
        self.processor = processor
        self.image_bounds = image_bounds or ImageBounds()
        self.tokenizer = processor.tokenizer
        ids = self.tokenizer.convert_tokens_to_ids([IM_START, IM_END, IMAGE_PAD])
        self.im_start_id, self.im_end_id, self.image_pad_id = (int(i) for i in ids)
        self.stop_token_ids = [self.im_end_id]
        # the special tokens as the template writes them, longest first
        self._special_ids = {tok.content: int(i) for i, tok in
                             self.tokenizer.added_tokens_decoder.items() if tok.special}
        self._special_re = re.compile("(" + "|".join(
            re.escape(t) for t in sorted(self._special_ids, key=len, reverse=True)) + ")")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ChatFormatError("the checkpoint has no chat template (chat_template.jinja or "
                                  "chat_template in tokenizer_config.json)")
        self._after_turn = self._after_turn_text()

    # -- rendering -------------------------------------------------------------------

    def _template_message(self, message: Message, images: list[Image.Image],
                          texts: list[str]) -> dict:
        """``message`` as the template sees it: image parts become ``{"type": "image"}``
        (the template writes the vision tokens), their images go to ``images`` in order;
        each text becomes a slot, the text going to ``texts``."""
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise ChatFormatError("message without a role")
        if "content" not in message:
            raise ChatFormatError("message without content")
        content = message["content"]
        if isinstance(content, str):
            return {"role": role, "content": self._slot(content, texts)}
        parts: list[dict] = []
        for part in content:
            if not isinstance(part, Mapping):
                raise ChatFormatError(f"content part must be a dict, got {type(part).__name__}")
            if _is_image_part(part):
                images.append(image_from_part(part, self.image_bounds))
                parts.append({"type": "image"})
            elif part.get("type") == "text":
                if not isinstance(part.get("text"), str):
                    raise ChatFormatError("text part without a string 'text'")
                parts.append({"type": "text", "text": self._slot(part["text"], texts)})
            else:
                raise ChatFormatError(f"unsupported content part type {part.get('type')!r}")
        return {"role": role, "content": parts}

    @staticmethod
    def _slot(text: str, texts: list[str]) -> str:
        texts.append(text)
        return _TEXT_SLOT.format(len(texts) - 1)

    def _render(self, messages: Iterable[Message], add_generation_prompt: bool) -> _Rendered:
        images: list[Image.Image] = []
        texts: list[str] = []
        converted = [self._template_message(m, images, texts) for m in messages]
        skeleton = self.tokenizer.apply_chat_template(
            converted, tokenize=False, add_generation_prompt=add_generation_prompt)
        cut = _TEXT_SLOT_RE.split(skeleton)  # template, slot index, template, ...
        slots = [int(i) for i in cut[1::2]]
        if sorted(slots) != list(range(len(texts))):
            raise ChatFormatError("the chat template does not write each message's text "
                                  "once, verbatim")
        pieces: list[tuple[str, bool]] = []
        for k, piece in enumerate(cut):
            if k % 2:
                pieces.append((texts[int(piece)], True))
            elif piece:
                pieces.append((piece, False))
        return _Rendered(pieces, images)

    def _after_turn_text(self) -> str:
        """What the template writes between an assistant turn's content and the next
        message (ChatML: ``<|im_end|>\n``); it must start with ``<|im_end|>``, the stop
        token the model generates."""
        probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _TURN_MARK}]
        text = self._render(probe, add_generation_prompt=False).text
        if text.count(_TURN_MARK) != 1:
            raise ChatFormatError("the chat template does not write an assistant turn's content "
                                  "verbatim")
        after = text[text.index(_TURN_MARK) + len(_TURN_MARK):]
        if not after.startswith(IM_END):
            raise ChatFormatError(f"the chat template ends an assistant turn with {after!r}, "
                                  f"not {IM_END} (the stop token the policy generates)")
        return after

    def _tokenize(self, pieces: Sequence[tuple[str, bool]], images: Sequence[Image.Image]
                  ) -> list[int]:
        """The pieces' ids: special tokens read only where the template wrote them, each
        ``<|image_pad|>`` expanded to its image's count; the text between two special
        tokens is tokenised as one string with special tokens inert (the messages' texts
        in it included). A tokenizer splits at special tokens before anything else, so
        normal text gets the ids of tokenising the whole string."""
        items: list[tuple[str, bool]] = []  # (text, is a special token)
        for text, from_message in pieces:
            if from_message:
                items.append((text, False))
                continue
            for k, part in enumerate(self._special_re.split(text)):
                if k % 2:
                    items.append((part, True))
                elif part:
                    items.append((part, False))
        pads = sum(1 for text, special in items if special and text == IMAGE_PAD)
        if pads != len(images):
            raise ChatFormatError(f"the chat template wrote {pads} image placeholders for "
                                  f"{len(images)} images")
        ids: list[int] = []
        run: list[str] = []
        frames = iter(images)

        def flush() -> None:
            if run:
                ids.extend(self.tokenizer("".join(run), add_special_tokens=False,
                                          split_special_tokens=True)["input_ids"])
                run.clear()

        for text, special in items:
            if not special:
                run.append(text)
                continue
            flush()
            if text == IMAGE_PAD:
                ids.extend([self.image_pad_id] * self.processor.image_token_count(next(frames)))
            else:
                ids.append(self._special_ids[text])
        flush()
        return ids

    # -- public ----------------------------------------------------------------------

    def encode_conversation(
        self, messages: Iterable[Message], add_generation_prompt: bool = True
    ) -> Encoded:
        """The whole conversation through the template (assistant turns as text),
        placeholders expanded."""
        rendered = self._render(messages, add_generation_prompt)
        return Encoded(self._tokenize(rendered.pieces, rendered.images), rendered.images)

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
        rendered = self._render(probe, add_generation_prompt=True)
        mark = rendered.pieces.index((_TURN_MARK, True))
        delta = rendered.pieces[mark + 1:]
        closed = len(previous_turn) > 0 and int(previous_turn[-1]) == self.im_end_id
        if closed:  # the template's own <|im_end|> after the turn (_after_turn_text)
            delta = [(delta[0][0].removeprefix(IM_END), False), *delta[1:]]
        return Encoded(self._tokenize(delta, rendered.images), rendered.images)

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
