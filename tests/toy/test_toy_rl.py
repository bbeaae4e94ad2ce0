"""RL teaches prompt following in the toy world: MR-GRPO (cps_sde, gdpo) raises held-out strict accuracy, prompt by
prompt, and the same run with negated advantages does not.

Statistics. Outcome of held-out prompt i at an eval = its claim accuracy: the fraction of the claims of its D = 2
eval images (fixed noise, ODE) that pass. Under "training does not change the prompts' outcomes" each prompt whose
outcome changed between the step-0 and the final eval is equally likely to have improved or worsened, so the
one-sided exact sign test (`deepgen_rl.toy.rl_run.paired_sign_test`) has a false-positive rate ≤ α = 0.01 for
"RL improved the prompts". Strict accuracy (all claims of an image pass) is asserted not to fall: the current toy
model starts at ~0–2% strict on held-out prompts, too few passes for a short run's strict changes to be significant.
The reward cannot be raised by a prompt-blind change: each prompt asks for its own colours, shapes, counts and
positions (and the images of one prompt fail the claims of another, see test_toy_model_draws_what_it_is_asked).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deepgen_rl.toy.rl_run import paired_sign_test, run_toy_rl

ALPHA = 0.01
HELDOUT_ONLY = str(Path(__file__).with_name("eval_toy_heldout.yaml"))
CI_STEPS = 20
CI_FLAGS = dict(rollout_n=8, rollout_micro_batch_size=64, atrain_micro_batch_size=64, num_inference_steps=8,
                learning_rate=3e-4, seed=0)


def test_paired_sign_test_matches_the_binomial_tail():
    up, down, p = paired_sign_test({0: 0.0, 1: 0.0, 2: 0.5, 3: 1.0, 4: 0.0}, {0: 1.0, 1: 0.5, 2: 1.0, 3: 0.5, 4: 0.0})
    assert (up, down) == (3, 1) and p == pytest.approx(5 / 16)  # P(X >= 3 | n = 4) = (4 + 1) / 16
    assert paired_sign_test({0: 1.0}, {0: 1.0}) == (0, 0, 1.0)


@pytest.mark.slow
def test_rl_raises_heldout_accuracy_and_negated_advantages_do_not(tmp_path, toy_model_paths):
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    runs = {}
    for name, negate in (("rl", False), ("negated", True)):
        res = run_toy_rl(tmp_path / name, steps=CI_STEPS, eval_every=CI_STEPS, model=build_model(TOY_MODEL_CONFIG),
                         eval_config=HELDOUT_ONLY, negate_advantages=negate, **CI_FLAGS)
        before, after = (res.per_prompt(s, "toy_heldout", "score") for s in (0, CI_STEPS))
        score = {s: e["toy_heldout"]["claim_score"] for s, e in res.evals.items()}
        strict = res.strict_acc("toy_heldout")
        runs[name] = (score[0], score[CI_STEPS], strict[0], strict[CI_STEPS], *paired_sign_test(before, after),
                      [round(m["reward/toy_compositional"], 3) for m in res.history])
        print(name, "held-out claim acc %.3f -> %.3f, strict %.3f -> %.3f, prompts up %d down %d, p=%.2g, "
                    "rewards %s" % runs[name])
    c0, c1, s0, s1, up, down, p, _ = runs["rl"]
    assert p < ALPHA and c1 >= c0 + 0.05 and s1 >= s0, runs["rl"]
    n0, n1, ns0, ns1, nup, ndown, _, _ = runs["negated"]
    assert n1 <= n0 and nup <= ndown and ns1 <= ns0 + 1e-9, runs["negated"]
