"""The losses a run keeps: only the last ``log_every``, whatever the run's length."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any


class LossWindow(deque):  # type: ignore[type-arg]
    """A deque of the last ``size`` losses that also answers ``window[-n:]`` with a list."""

    def __init__(self, size: int, values: Iterable[float] = ()):
        super().__init__(values, maxlen=max(1, int(size)))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return list(self)[index]
        return super().__getitem__(index)
