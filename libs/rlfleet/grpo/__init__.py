"""GRPO as pure, typed functions: config, advantages, losses, filtering, batching, step.

Extension points are registries: a new advantage estimator, policy loss or KL estimator is
one function plus ``@register_advantage_estimator`` / ``@register_policy_loss`` /
``@register_kl_estimator``, selected by name in ``GRPOConfig`` (`rlfleet.registries`; a
package adds one through an entry point, which every process, Ray workers included, finds).
"""

from rlfleet.grpo.advantages import (
    AdvantageResult,
    NonFiniteRewards,
    get_advantage_estimator,
    group_normalized_advantages,
    register_advantage_estimator,
)
from rlfleet.grpo.batching import MicroBatch, collate, make_micro_batches
from rlfleet.grpo.config import GRPOConfig, check_registered_names
from rlfleet.grpo.filtering import BatchStats, prepare_batch, staleness_keep_mask
from rlfleet.grpo.losses import (
    aggregate,
    get_kl_estimator,
    get_policy_loss,
    register_kl_estimator,
    register_policy_loss,
)
from rlfleet.grpo.sample import TrainSample
from rlfleet.grpo.step import grpo_loss

__all__ = [
    "AdvantageResult",
    "BatchStats",
    "GRPOConfig",
    "MicroBatch",
    "NonFiniteRewards",
    "TrainSample",
    "aggregate",
    "check_registered_names",
    "collate",
    "get_advantage_estimator",
    "get_kl_estimator",
    "get_policy_loss",
    "grpo_loss",
    "group_normalized_advantages",
    "make_micro_batches",
    "prepare_batch",
    "register_advantage_estimator",
    "register_kl_estimator",
    "register_policy_loss",
    "staleness_keep_mask",
]
