"""Work on a second thread for the length of a `with` block, each side on one intra-op thread: PPO's
critics' update while the next batch is collected (`PPOConfig.overlap_critic`).

On the CPU a rollout of VMAS or PettingZoo leaves a core idle (the simulator steps in Python, one small
op at a time), while the critics' update keeps a core busy with matmuls. torch's ops let Python's GIL
go while they run; Inductor's fused C++ kernels keep it, so a compiled step run here is built with
Inductor's C++ wrapper, which lets it go for the whole graph (`envs.compile.maybe_compile`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 for the block on this thread, then back to what they were."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class Background:
    """`with Background(work):` runs `work(stop)` on a thread while the block runs; both on one intra-op
    thread (torch's count is set per thread, and restored here on leaving).

    Leaving waits for `work` and raises its error if it failed. If the block raises (an error, Ctrl-C),
    `stop` is set and `work` must return soon (it checks `stop` between steps); the block's error is
    raised once it has.
    """

    def __init__(self, work: Callable[[threading.Event], None]) -> None:
        self.work = work
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="vecmarl-background", daemon=True)
        self.threads = one_thread()

    def _run(self) -> None:
        try:
            torch.set_num_threads(1)  # this thread's own count, which ends with it
            self.work(self.stop)
        except BaseException as error:  # noqa: BLE001  (handed to the waiting thread, raised there)
            self.error = error

    def __enter__(self) -> Background:
        self.threads.__enter__()
        self.thread.start()
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc_type is not None:
            self.stop.set()
        try:
            self.thread.join()
        except BaseException:  # Ctrl-C while waiting: stop the work, wait for it, then raise
            self.stop.set()
            self.thread.join()
            raise
        finally:
            self.threads.__exit__(None, None, None)
        if self.error is not None and exc_type is None:
            raise self.error
