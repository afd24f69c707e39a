"""Retries with exponential backoff and jitter, for errors a sink calls transient."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a sink's transient errors are retried.

    :param retries: further attempts after the first (0: no retry).
    :param backoff_s: the wait before the first retry; doubled for each further one.
    :param max_backoff_s: the longest wait.
    :param jitter: the fraction of each wait drawn at random (0.2: wait 80-100%), so
        sinks that failed together do not retry in lockstep.
    """

    retries: int = 2
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("retries and backoff must not be negative")
        for key in ("backoff_s", "max_backoff_s"):  # nan passes every comparison above
            if not math.isfinite(getattr(self, key)):
                raise ValueError(f"{key} must be finite, not {getattr(self, key)}")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be between 0 and 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        return base * (1 - self.jitter * random.random())
