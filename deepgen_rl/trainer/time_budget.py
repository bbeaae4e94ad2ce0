"""``--max_train_minutes``: a wall-clock budget for the GRPO loop.

Training stops before a step that, with the eval after it, would end after the budget: after each step the loop asks
whether ``elapsed + estimate + eval reserve > budget``.
- ``elapsed`` runs from the start of training in this process (an ``--eval_at_start`` eval included), or from an
  earlier moment given as a Unix time (``--max_train_minutes_from``: e.g. a launch script's start, so that the budget
  covers start-up too).
- ``estimate`` is the mean duration of the last ``window`` loop iterations, their evals left out (a save inside one
  counts in it).
- ``eval reserve`` is the longest eval timed so far (0 before one is timed, and when the trainer times none: no
  ``--eval_freq``). An eval_freq step's eval lies inside the next iteration, and the step the budget stops at is
  evaluated after the stop; either way one eval follows the next step, so the budget keeps room for it.
The trainer then evaluates (unless the step was an eval_freq step) and saves the step it stopped at, as at
``--max_steps``; the save comes after the budget. With several ranks one rank out of time stops them all (the trainer
asks ``deepgen_rl.utils.dist.any_rank``), so no rank waits in a collective for a step the others skip.
"""
from __future__ import annotations

import math
import time
from typing import Callable


class TimeBudget:
    def __init__(self, minutes: float, clock: Callable[[], float] = time.perf_counter, window: int = 5,
                 start_unix: float = 0.0, wall: Callable[[], float] = time.time):
        if not minutes >= 0:
            raise ValueError(f"the time budget must be >= 0 minutes (0 = none), got {minutes}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if not (math.isfinite(start_unix) and start_unix >= 0):
            raise ValueError(f"the budget's start must be a Unix time >= 0 (0 = now), got {start_unix}")
        self.budget_s = 60.0 * float(minutes)
        self.clock = clock
        self.window = window
        already = 0.0
        if start_unix:
            already = wall() - float(start_unix)
            if already < -1.0:  # a second of clock disagreement is tolerated
                raise ValueError(f"the budget's start (Unix time {start_unix:.0f}) lies {-already:.0f} s in the future")
        self.t0 = clock() - max(0.0, already)
        self.durations: list[float] = []
        self.eval_reserve_s = 0.0

    @property
    def active(self) -> bool:
        return self.budget_s > 0

    def elapsed_s(self) -> float:
        return self.clock() - self.t0

    def step_done(self, seconds: float) -> None:
        """Record one loop iteration's duration, its eval left out."""
        self.durations.append(float(seconds))

    def eval_done(self, seconds: float) -> None:
        """Record an eval's duration: the longest one is kept free for the eval after the next step."""
        self.eval_reserve_s = max(self.eval_reserve_s, float(seconds))

    def step_estimate_s(self) -> float:
        recent = self.durations[-self.window:]
        return sum(recent) / len(recent) if recent else 0.0

    def next_step_would_overrun(self) -> bool:
        """True when a budget is set, a step has been timed, and the next step and an eval after it are expected to
        end after the budget."""
        return self.active and bool(self.durations) and (
            self.elapsed_s() + self.step_estimate_s() + self.eval_reserve_s > self.budget_s)
