"""Load shapes for loadtests/locustfile.py, picked with `XG2_LT_SHAPE` (run.py's `--shape`). Both
read locust's own options (`-u`, `-r`, `-t`) and stop by themselves at the run time.

- `StepShape`: `XG2_LT_STEP_USERS` more users every `XG2_LT_STEP_S` seconds, up to `-u`, then held
  to the end: throughput against users, to find the knee (where more users stop giving more
  requests per second and only add latency).
- `SoakShape`: `-u` users for the whole run (a long one: memory should stay flat after warm-up).
"""

from __future__ import annotations

import os

from locust import LoadTestShape

#: The bound when locust is given no -t: a shape never runs unbounded.
DEFAULT_RUN_TIME_S = 300


def _options(shape: LoadTestShape) -> tuple[int, float, float]:
    opts = shape.runner.environment.parsed_options if shape.runner is not None else None
    users = int(getattr(opts, "num_users", None) or 8)
    rate = float(getattr(opts, "spawn_rate", None) or 1)
    run_time = float(getattr(opts, "run_time", None) or DEFAULT_RUN_TIME_S)
    return users, rate, run_time


class StepShape(LoadTestShape):
    use_common_options = True

    def __init__(self) -> None:
        super().__init__()
        self.step_users = int(os.environ.get("XG2_LT_STEP_USERS", "2"))
        self.step_s = float(os.environ.get("XG2_LT_STEP_S", "30"))

    def tick(self) -> tuple[int, float] | None:
        users, rate, run_time = _options(self)
        t = self.get_run_time()
        if t >= run_time:
            return None
        return min(users, self.step_users * (int(t // self.step_s) + 1)), max(rate, float(self.step_users))


class SoakShape(LoadTestShape):
    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        users, rate, run_time = _options(self)
        if self.get_run_time() >= run_time:
            return None
        return users, rate
