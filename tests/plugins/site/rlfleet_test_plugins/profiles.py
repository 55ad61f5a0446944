"""A policy profile and an action format that plug in through the
``rlfleet.serving_profiles`` and ``rlfleet.format_profiles`` entry-point groups: what a
package for a new model declares instead of editing rlfleet's tables."""

from __future__ import annotations

from rlfleet.maze.actions import ActionFormat, Feedback, FormatProfile
from rlfleet.policy.profiles import ServingProfile

# a small VLM served with a short context: 10 turns of 112 px frames
TEST_VLM = ServingProfile(max_model_len=8192, max_lora_rank=16, max_turns=10, frame_px=112,
                          max_new_tokens=32, dtype="bfloat16")

# the tags syntax answered with VisGym's feedback sentences
TAGS_VISGYM = FormatProfile(ActionFormat.TAGS, Feedback.VISGYM)
