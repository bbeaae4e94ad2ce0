"""Toy-world fixtures: the pre-trained toy DeepGen that the suite tests, the `slots_wide` variant (the model of the
quickstart and of scripts/toy_prompt_following.sh, where RL teaches prompt following), built once into its cache
(deepgen_rl.toy.model.toy_dir("slots_wide"), i.e. deepgen_toy_slots_wide next to $DEEPGEN_TINY_DIR; $DEEPGEN_TOY_DIR,
if set, must hold that variant) and reused by every later test and session.

Building it takes ~8.5 minutes on an idle 2-core machine (two single-threaded ranks, ~16 CPU-minutes in all), so a
clean clone's suite builds it once: the tests that need it are moved to the front of the run (below), so that under
pytest-xdist one worker builds (its two ranks sharing the cores with the other worker) while the other runs the rest.
DEEPGEN_TOY_TESTS=0 skips them (a quick local run); the world, checker, reward and toy metrics are always tested.
The default variant (toy-v3) is no longer built by the suite: its tests build shortened configs.
"""

import os

import pytest

TOY_TESTS = os.environ.get("DEEPGEN_TOY_TESTS", "1") != "0"


# The longest tests that use the model (~280 s; ~120, ~70 and ~35 s with the model cached). pytest-xdist's worksteal
# gives each worker a contiguous half of the list, and an idle worker steals the tail half of a busy one's queue
# (which always keeps its next 2 tests): with FIRST at the head and LAST behind the short model tests, a worker that
# runs FIRST leaves LAST to the other one. Listed side by side, the two RL tests ran one after the other on one
# worker: `DEEPGEN_TEST_WORKERS=2 bash scripts/test.sh tests/toy` took 8.5 min with the model cached (now 5.5), for
# ~600 worker-s of tests.
FIRST = ("test_rl_teaches_prompt_following",)
LAST = ("test_negated_advantages_do_not_raise_it", "test_toy_quickstart_short", "test_toy_sample_efficiency_smoke")


def pytest_collection_modifyitems(config, items):
    """Tests that use the pre-trained toy model first (stable order otherwise): the build is the longest single
    task of a clean clone's suite, and started last it would run alone at the end. Among them FIRST leads and LAST
    follows the others (above)."""
    def key(item) -> tuple[bool, int]:
        name = getattr(item, "originalname", item.name)
        return ("toy_model_paths" not in getattr(item, "fixturenames", ()),
                0 if name in FIRST else 2 if name in LAST else 1)

    items.sort(key=key)


@pytest.fixture(scope="session")
def toy_model_paths():
    if not TOY_TESTS:
        pytest.skip("DEEPGEN_TOY_TESTS=0: the tests that need the pre-trained toy DeepGen are skipped")
    from deepgen_rl.toy.model import ensure_toy_deepgen
    from deepgen_rl.toy.rl_run import PROMPT_FOLLOWING_VARIANT

    return ensure_toy_deepgen(progress=False, variant=PROMPT_FOLLOWING_VARIANT)


@pytest.fixture(scope="session")
def toy_model(toy_model_paths):
    """The toy DeepGen loaded through build_model. Read-only: do not modify it in a test."""
    from deepgen_rl.models import build_model
    from deepgen_rl.toy.model import model_dir_overrides
    from deepgen_rl.toy.rl_run import TOY_MODEL_CONFIG

    return build_model(TOY_MODEL_CONFIG, **model_dir_overrides(toy_model_paths["root"]))
