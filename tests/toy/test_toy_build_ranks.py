"""The data-parallel toy build (deepgen_rl/toy/build_ranks.py): two single-threaded ranks train the one-process
build's model up to float rounding, deterministically, and a failing rank fails the build loudly."""

from __future__ import annotations

import pytest
import torch

from deepgen_rl.toy.model import VARIANTS, make_toy_deepgen, read_meta, trained_weights

# slots_wide's shapes, shortened to 3 VAE steps on 4 images and 4 DiT steps on 4 pairs, in one process.
SHORT = dict(VARIANTS["slots_wide"], build_ranks=1, vae_steps=3, vae_batch=4, vae_pool=8, dit_steps=4, dit_batch=4,
             dit_pool=8)


def _diffs(a, b) -> dict[str, tuple[float, float]]:
    """Per part (the VAE's weights, the checkpoint's): the largest absolute difference of any weight, and the mean
    over tensors of their mean absolute difference."""
    assert a.keys() == b.keys()
    out = {}
    for part, keys in (("vae", [k for k in a if k.startswith("vae.")]), ("ckpt", [k for k in a if "vae." != k[:4]])):
        d = [(a[k].float() - b[k].float()).abs() for k in keys]
        out[part] = (max(float(x.max()) for x in d), sum(float(x.mean()) for x in d) / len(d))
    return out


def test_two_ranks_train_the_one_process_model(tmp_path):
    """Same batches, noise and dropout, gradients averaged over the two halves: after 3 VAE and 4 DiT steps every
    weight (VAE and checkpoint) is within 1e-4 of the one-process build's and their mean differences are below 1e-6
    (measured: 1.7e-5 / 2e-8 for the VAE, 8e-7 / 5e-10 for the checkpoint; Adam's first steps amplify rounding),
    while training on half a batch, what a rank would do without the all-reduce, misses both bounds (measured:
    1.1e-3 / 1.8e-4 and 2.2e-4 / 1.3e-5). Two 2-rank builds are identical."""
    one = make_toy_deepgen(str(tmp_path / "one"), progress=False, config=SHORT)
    two = make_toy_deepgen(str(tmp_path / "two"), progress=False, config=dict(SHORT, build_ranks=2))
    make_toy_deepgen(str(tmp_path / "again"), progress=False, config=dict(SHORT, build_ranks=2))
    make_toy_deepgen(str(tmp_path / "half"), progress=False, config=dict(SHORT, vae_batch=2, dit_batch=2))
    w_one, w_two, w_again, w_half = (trained_weights(tmp_path / n) for n in ("one", "two", "again", "half"))
    for part, (largest, mean) in _diffs(w_one, w_two).items():
        assert largest < 1e-4 and mean < 1e-6, part
    for part, (largest, mean) in _diffs(w_one, w_half).items():
        assert largest > 1e-4 and mean > 1e-6, part
    assert all(torch.equal(w_two[k], w_again[k]) for k in w_two)
    m_one, m_two = read_meta(one["root"]), read_meta(two["root"])
    # The logged losses are the full batch's (the ranks' halves averaged), not rank 0's half.
    assert m_two["dit_first_loss"] == pytest.approx(m_one["dit_first_loss"], rel=1e-5)
    assert m_two["vae_final_loss"] == pytest.approx(m_one["vae_final_loss"], rel=1e-5)
    assert (m_one["build_ranks"], m_two["build_ranks"]) == (1, 2)
    # The ranks' CPU time counts: each rank loads torch and the model, so two ranks use more than one process.
    assert m_two["build_cpu_s"] > m_one["build_cpu_s"]
    # Nothing of the launch is left in the model folder.
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == sorted(p.name for p in (tmp_path / "one").iterdir())
    assert str(two["checkpoint"]).endswith("deepgen_toy.pth")


def test_a_failing_rank_fails_the_build_and_stops_the_others(tmp_path):
    with pytest.raises(RuntimeError, match=r"rank \d of 2 failed with exit status"):
        make_toy_deepgen(str(tmp_path / "bad"), progress=False, config=dict(SHORT, build_ranks=2, vae_recipe="nope"))
    assert read_meta(str(tmp_path / "bad")) is None


@pytest.mark.parametrize("bad, match", [(dict(build_ranks=3), "vae_batch=4 is not divisible by build_ranks=3"),
                                        (dict(build_ranks=0), "build_ranks must be >= 1")])
def test_build_ranks_must_split_the_batches(tmp_path, bad, match):
    with pytest.raises(ValueError, match=match):
        make_toy_deepgen(str(tmp_path / "x"), progress=False, config=dict(SHORT, **bad))
