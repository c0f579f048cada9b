"""Wall time per phase of an iteration, without host syncs."""

from __future__ import annotations

import time

import torch


class PhaseTimer:
    """`mark(name)` ends a phase named `name`; `seconds()` gives each phase's seconds. On a GPU the marks
    are CUDA events, read at the iteration's logging sync, so marking never waits for the device."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def seconds(self) -> dict[str, float]:
        """Seconds between consecutive marks, keyed by the later mark's name and summed over the marks
        of one name (call after a sync)."""
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:]):
            out[name] = out.get(name, 0.0) + (a.elapsed_time(b) / 1000 if self.cuda else b - a)
        self.marks = []
        return out
