"""`step(action, auto_reset=False)` held to the auto-reset step, for the native envs' and the adapters' tests."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def steps_without_auto_reset(auto, manual, actions: Iterable) -> Iterator:
    """Step `auto` as usual and `manual`, its twin (same env, options and seed), with `auto_reset=False`,
    and yield each step's `next` of `manual` while its done envs are still as the step left them; then reset
    them as a caller does, `manual.reset(mask=next["done"][:, 0])`. At every step both give the same `next`,
    `manual`'s `obs` is its `next`'s observation, and its reset gives the `obs` that `auto`'s step gave."""
    for action in actions:
        next_auto, obs_auto = auto.step(action)
        next_manual, obs_manual = manual.step(action, auto_reset=False)
        assert (next_manual == next_auto).all()
        assert (obs_manual == next_manual.select(*obs_manual.keys(True, True))).all()
        yield next_manual
        assert (manual.reset(mask=next_manual["done"][:, 0]) == obs_auto).all()
