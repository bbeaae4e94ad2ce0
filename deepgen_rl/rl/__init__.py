"""Flow-matching RL math: samplers (one step + schedules), advantages, losses. Pure functions, fp32 math."""

from deepgen_rl.rl.advantages import ADV_TYPES, GROUP_BASELINE_ADV_TYPES, AdvantageOutput, compute_advantages
from deepgen_rl.rl.losses import (
    KL_TYPES,
    advantages_to_nft_reward,
    clipped_policy_loss,
    diffusionnft_loss,
    grpo_guard_log_ratio,
    grpo_guard_step_weight,
    kl_penalty,
    sft_flow_matching_loss,
)
from deepgen_rl.rl.samplers import (
    LOG_PROB_FORMS,
    SAMPLERS,
    SDE_SAMPLERS,
    SDEStepOutput,
    default_log_prob_form,
    make_sigmas,
    sde_step,
    sde_window,
    stochastic_step_mask,
    trained_step_indices,
)

__all__ = [
    "ADV_TYPES",
    "AdvantageOutput",
    "GROUP_BASELINE_ADV_TYPES",
    "KL_TYPES",
    "LOG_PROB_FORMS",
    "SAMPLERS",
    "SDE_SAMPLERS",
    "SDEStepOutput",
    "advantages_to_nft_reward",
    "clipped_policy_loss",
    "compute_advantages",
    "default_log_prob_form",
    "diffusionnft_loss",
    "grpo_guard_log_ratio",
    "grpo_guard_step_weight",
    "kl_penalty",
    "make_sigmas",
    "sde_step",
    "sde_window",
    "sft_flow_matching_loss",
    "stochastic_step_mask",
    "trained_step_indices",
]
