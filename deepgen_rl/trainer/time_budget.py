"""``--max_train_minutes``: a wall-clock budget for the GRPO loop.

Training stops before a step that would end after the budget: after each step the loop asks whether
``elapsed + estimate > budget``, where ``elapsed`` runs from the start of training (an ``--eval_at_start`` eval
included) and ``estimate`` is the mean duration of the last ``window`` loop iterations (an eval or a save inside one
counts in it, so the estimate errs on the late side). The trainer then evaluates and saves the step it stopped at,
as at ``--max_steps``; those come after the budget and take their own time. With several ranks one rank out of time
stops them all (the trainer asks ``deepgen_rl.utils.dist.any_rank``), so no rank waits in a collective for a step the
others skip.
"""
from __future__ import annotations

import time
from typing import Callable


class TimeBudget:
    def __init__(self, minutes: float, clock: Callable[[], float] = time.perf_counter, window: int = 5):
        if not minutes >= 0:
            raise ValueError(f"the time budget must be >= 0 minutes (0 = none), got {minutes}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.budget_s = 60.0 * float(minutes)
        self.clock = clock
        self.window = window
        self.t0 = clock()
        self.durations: list[float] = []

    @property
    def active(self) -> bool:
        return self.budget_s > 0

    def elapsed_s(self) -> float:
        return self.clock() - self.t0

    def step_done(self, seconds: float) -> None:
        """Record one loop iteration's duration."""
        self.durations.append(float(seconds))

    def step_estimate_s(self) -> float:
        recent = self.durations[-self.window:]
        return sum(recent) / len(recent) if recent else 0.0

    def next_step_would_overrun(self) -> bool:
        """True when a budget is set, a step has been timed, and the next step is expected to end after the budget."""
        return self.active and bool(self.durations) and self.elapsed_s() + self.step_estimate_s() > self.budget_s
