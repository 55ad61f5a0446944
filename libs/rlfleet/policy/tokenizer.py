"""A small Qwen-style tokenizer trained locally (no downloads) for the ``tiny`` profile.

Byte-level BPE (so any text round-trips) trained on a small, fixed corpus that covers the
maze instructions, feedback and both action formats, with Qwen's special tokens and a
ChatML chat template. Every complete action string (``('move', 0)`` ...,
``<action>up</action>`` ...) is an added, non-special token: one action is one token,
which makes the tiny policy far easier to train (see REFERENCE.md); the text decodes to
the same string either way, so nothing downstream depends on it.
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Qwen's special tokens, in Qwen's relative order. <|video_pad|> is only there because
# the Qwen3-VL processor looks it up.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

DIRECTIONS = ["right", "up", "left", "down"]
TUPLE_ACTIONS = [f"('move', {k})" for k in range(4)] + ["('stop', 'stop')"]
TAG_ACTIONS = [f"<action>{w}</action>" for w in [*DIRECTIONS, "stop"]]
ACTION_TOKENS = TUPLE_ACTIONS + TAG_ACTIONS

# ChatML as Qwen writes it. Content may be a string or an OpenAI-style list of parts;
# any image part ("image", "image_url", or a dict with an "image" key) becomes one
# <|vision_start|><|image_pad|><|vision_end|> (the processor expands the pad).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' or part['type'] == 'image_url' or 'image' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}"
    "{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)


def training_corpus() -> list[str]:
    """The fixed corpus the tiny BPE is trained on (deterministic, a few KB)."""
    lines = [
        # The maze instruction (VisGym maze_2d wording, as rlfleet.maze.prompt writes it).
        "You are navigating a 7x7 maze. The maze consists of walls (gray) and paths (white). "
        "You are represented by a blue circle, and your goal is to reach the red target "
        "square, then stop there.\n\nAvailable actions:\n",
        "1. 'move': Move in one of four directions. Format: `('move', direction)` where "
        "direction is an integer:\n   - 0=right, 1=up, 2=left, 3=down\n"
        "2. 'stop': End the navigation session. Format: `('stop', 'stop')`\n\n",
        "Success: you succeed if you stop on the red target square.\n\n"
        "Please respond with exactly one action in the specified format. For example:\n"
        "- To move right: `('move', 0)`\n- To move up: `('move', 1)`\n"
        "- To move left: `('move', 2)`\n- To move down: `('move', 3)`\n"
        "- To stop: `('stop', 'stop')`",
        "1. Move one cell: right, up, left or down.\n2. stop: End the navigation session.\n",
        "Please respond with exactly one action wrapped in action tags. For example:\n"
        "- To move right: <action>right</action>\n- To move up: <action>up</action>\n"
        "- To move left: <action>left</action>\n- To move down: <action>down</action>\n"
        "- To stop: <action>stop</action>",
        # Per-turn status and feedback.
        "Feedback: Moved right. Moved up. Moved left. Moved down.\nTurns left: 14 of 15.",
        "Feedback: Cannot move into a wall. Invalid action: could not parse the answer.",
        "You stopped on the target. Solved! You stopped before reaching the target. "
        "The episode is over. Turn limit reached; the episode is over.",
        "You are a helpful assistant. system user assistant",
        "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 30 64 9x9 11x11",
        "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,:;!?'\"()[]{}<>/\\-_=+*#%&`",
    ]
    actions = " ".join(ACTION_TOKENS)
    # Repetition weights the merges toward the task vocabulary; order is fixed.
    return lines * 20 + [actions] * 20


def build_tokenizer(vocab_size: int = 768) -> PreTrainedTokenizerFast:
    """Train the tiny byte-level BPE and wrap it as a Qwen-style fast tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer)
    tok.add_tokens([AddedToken(a, normalized=False, special=False) for a in ACTION_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD],
        chat_template=CHAT_TEMPLATE,
        model_max_length=32768,
        clean_up_tokenization_spaces=False,
        padding_side="left",
    )
