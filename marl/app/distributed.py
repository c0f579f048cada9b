"""Data-parallel training over `torch.distributed`, launched by `torchrun`.

    torchrun --nproc-per-node 4 -m marl train --num-envs 1024 ...

Each rank steps its own `num_envs` envs (seeded per rank), computes the gradient of its own
minibatches, and every minibatch step averages the gradients of all ranks (one all-reduce of all
groups' flattened gradients, before each group's gradient clipping), so every rank applies the same
update and the networks stay identical. Logging, checkpoints and the summary happen on rank 0.

The trainer talks to a `World`: the single-process `World` does nothing (no cost without torchrun);
`DistributedWorld` is chosen when torchrun's `WORLD_SIZE` is above 1. The backend is NCCL on CUDA
(rank `r` of a node uses `cuda:LOCAL_RANK`) and gloo on the CPU.

Seeds: the networks are seeded with `seed` on every rank (and rank 0's are broadcast at start-up, so
they start identical); rank `r`'s envs and sampling are seeded like a single-process run with
`seed + 1000 * r`.

Checkpoints: rank 0 writes one file: its own checkpoint plus `world_size` and `ranks`, each rank's
sampling generator, env state, current observations, running episode statistics, recurrent nets' states
and replay buffer (`RANK_KEYS`, gathered from every rank; rank 0's repeated). On `--resume` every rank
reads that file and takes its own entry, so the file must be readable at the same path on every node (a
shared file system).

A rank that dies or hangs: torchrun stops the other ranks when one exits with an error; a rank left
waiting on a collective (a hung rank, a lost node) raises after `MARL_DIST_TIMEOUT` seconds (default
600), which ends the job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import Any

import torch

TIMEOUT_VARIABLE = "MARL_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 600.0
SEED_STRIDE = 1000
# The checkpoint entries that differ between ranks: the rest (networks, optimisers, counters) is shared.
RANK_KEYS = ("generator", "env", "obs", "stats", "hidden", "algorithm_envs", "buffer")


def launcher(size: int, local_size: int) -> str:
    """The command that starts `marl` on `size` ranks, `local_size` per node (what a resume needs)."""
    if size <= 1:
        return "marl"
    if local_size >= size:
        return f"torchrun --nproc-per-node {size} -m marl"
    return f"torchrun --nnodes {size // local_size} --nproc-per-node {local_size} (and your rendezvous options) -m marl"


def checkpoint_launcher(state: dict) -> str:
    """`launcher` for the ranks that wrote the checkpoint `state` (one node where it does not say)."""
    size = state.get("world_size", 1)
    return launcher(size, state.get("local_world_size", size))


class World:
    """One process: every hook is a no-op."""

    rank = 0
    size = 1
    local_size = 1  # ranks per node
    is_main = True

    def seed(self, seed: int) -> int:
        """The seed of this rank's envs and sampling."""
        return seed

    def check_same(self, value: Any, what: str) -> None:
        """Raise on every rank when `value` (JSON-able) differs between ranks."""

    def check_on_main(self, check: Callable[[], None], errors: tuple[type[Exception], ...] = (ValueError,)) -> None:
        """Run `check` on rank 0 only (e.g. of its run folder); if it raises one of `errors`, every rank
        raises that error, with its message, instead of the others failing later in a collective that rank 0
        never joins."""
        check()

    def broadcast_parameters(self, parameters: Iterable[torch.Tensor]) -> None:
        """Copy rank 0's `parameters` to every rank."""

    def average_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        """Replace each gradient by its mean over the ranks."""

    def reduce_metrics(self, values: dict[str, torch.Tensor], stats) -> dict[str, torch.Tensor]:
        """An iteration's metrics over all ranks; `stats` the batch's `marl.core.rollout.FinishedEpisodes`."""
        return values

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the ranks (a new tensor)."""
        return tensor

    def gather_checkpoint(self, state: dict) -> dict | None:
        """The checkpoint to write on rank 0 (None on the others)."""
        return state

    def own_checkpoint(self, state: dict) -> dict:
        """This rank's view of a loaded checkpoint."""
        saved = state.get("world_size", 1)
        if saved != 1:
            raise ValueError(
                f"this checkpoint was written by {saved} ranks; resume it with torchrun on {saved} ranks "
                f"(e.g. {checkpoint_launcher(state)} train --resume ...), not in one process"
            )
        return state

    def close(self) -> None:
        """Leave the process group."""


class DistributedWorld(World):
    """Rank `rank` of `size` ranks in the default process group."""

    def __init__(self, rank: int, size: int, device: torch.device) -> None:
        self.rank, self.size, self.device = rank, size, device
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", size))  # set by torchrun
        self.is_main = rank == 0

    def seed(self, seed: int) -> int:
        return seed + SEED_STRIDE * self.rank

    def check_same(self, value: Any, what: str) -> None:
        text = json.dumps(value, sort_keys=True, default=repr)
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little", signed=True)
        digests = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.size)]
        with self._collective(f"the {what} check"):
            torch.distributed.all_gather(digests, torch.tensor([digest], device=self.device))
        digests = torch.cat(digests).tolist()
        if all(d == digests[0] for d in digests):
            return
        # Rare path: gather the values themselves to name what differs.
        values: list[Any] = [None] * self.size
        with self._collective(f"the {what} check"):
            torch.distributed.all_gather_object(values, json.loads(text))
        lines = [
            f"rank {r} has {describe_difference(values[0], values[r])}"
            for r in range(1, self.size)
            if digests[r] != digests[0]
        ]
        raise ValueError(
            f"the ranks disagree on the {what}: {'; '.join(lines)}. Launch every rank with the same options"
        )

    def check_on_main(self, check: Callable[[], None], errors: tuple[type[Exception], ...] = (ValueError,)) -> None:
        failed: list[tuple[int, str] | None] = [None]  # which of `errors`, and its message
        if self.is_main:
            try:
                check()
            except errors as error:
                failed[0] = (next(i for i, kind in enumerate(errors) if isinstance(error, kind)), str(error))
        with self._collective("rank 0's check"):
            torch.distributed.broadcast_object_list(failed, src=0)
        if failed[0] is not None:
            kind, message = failed[0]
            raise errors[kind](message)

    def broadcast_parameters(self, parameters: Iterable[torch.Tensor]) -> None:
        tensors = [p.data for p in parameters]
        if not tensors:  # an algorithm without parameters (the same on every rank: no rank waits)
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        with self._collective("the parameter broadcast"):
            torch.distributed.broadcast(flat, src=0)
        _copy_back(flat, tensors)

    def average_gradients(self, parameters: Iterable[torch.Tensor]) -> None:
        # A parameter without a gradient has none on every rank (same networks, same loss terms).
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        with self._collective("the gradient all-reduce"):
            torch.distributed.all_reduce(flat)
        flat /= self.size
        _copy_back(flat, grads)

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        with self._collective("a sum over the ranks"):
            torch.distributed.all_reduce(total)
        return total

    def reduce_metrics(self, values: dict[str, torch.Tensor], stats) -> dict[str, torch.Tensor]:
        """Loss terms and diagnostics: the mean over the ranks (each rank's is a mean over equally many
        frames). Episode statistics: pooled, i.e. all ranks' finished episodes summed, then divided by
        their count; `episodes` is the total. One all-reduce of one tensor."""
        groups = list(stats.return_sum)
        pooled = torch.stack([stats.episodes, stats.length_sum, *(stats.return_sum[g] for g in groups)]).float()
        means = torch.stack([v.float().reshape(()) for v in values.values()])
        both = torch.cat([pooled, means])
        with self._collective("the metrics all-reduce"):
            torch.distributed.all_reduce(both)
        pooled, means = both.split([len(pooled), len(means)])
        reduced = dict(zip(values, means / self.size))
        episodes = pooled[0]
        reduced["episodes"] = episodes
        reduced["episode_length"] = pooled[1] / episodes
        for i, g in enumerate(groups):
            reduced[f"{g}/episode_return"] = pooled[2 + i] / episodes
        return reduced

    def gather_checkpoint(self, state: dict) -> dict | None:
        own = {key: _to_cpu(state[key]) for key in RANK_KEYS}
        gathered: list[Any] | None = [None] * self.size if self.is_main else None
        with self._collective("the checkpoint gather"):
            torch.distributed.gather_object(own, gathered, dst=0)
        if not self.is_main:
            return None
        return {**state, "world_size": self.size, "local_world_size": self.local_size, "ranks": gathered}

    def own_checkpoint(self, state: dict) -> dict:
        saved = state.get("world_size", 1)
        if saved == 1:
            raise ValueError(
                f"this checkpoint was written by one process, but this job has {self.size} ranks: resume it in one "
                "process: marl train --resume ... (without torchrun)"
            )
        if saved != self.size:
            raise ValueError(
                f"this checkpoint was written by {saved} rank(s), but this job has {self.size}; resume it on "
                f"{saved} rank(s) (e.g. {checkpoint_launcher(state)} train --resume ...) so every rank's envs continue"
            )
        self.check_same({"iteration": state["iteration"], "frames": state["frames"]}, "checkpoint to resume")
        return {**state, **state["ranks"][self.rank]}

    def close(self) -> None:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()

    @contextlib.contextmanager
    def _collective(self, what: str) -> Iterator[None]:
        """Name the step and the likely cause when a collective fails (a peer died, or hangs)."""
        try:
            yield
        except RuntimeError as error:
            raise RuntimeError(
                f"rank {self.rank} of {self.size}: {what} failed, most likely because another rank died or "
                f"stopped responding (waited up to {timeout_seconds():g} s, set by {TIMEOUT_VARIABLE}): {error}"
            ) from error


def setup(device: torch.device, config: Mapping[str, Any]) -> tuple[World, torch.device]:
    """The world this process trains in, and its device. Under torchrun (`WORLD_SIZE` > 1) this joins
    the default process group (once per process) and checks that every rank has the same `config`."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World(), device
    try:
        rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    except KeyError as missing:
        raise ValueError(
            f"WORLD_SIZE={size} is set but {missing} is not; launch distributed training with torchrun"
        ) from None
    if device.type == "cuda":
        if device.index is not None and device.index != local_rank:
            raise ValueError(
                f"under torchrun each rank uses cuda:LOCAL_RANK; got --device {device}, use --device cuda or auto"
            )
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise ValueError(
                f"rank {rank} has LOCAL_RANK={local_rank}, but this node has {count} CUDA device(s) and each rank "
                f"uses cuda:LOCAL_RANK: launch at most {count} process(es) per node (--nproc-per-node {count}), "
                "or train on the CPU with --device cpu"
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group(
            backend="nccl" if device.type == "cuda" else "gloo",
            timeout=timedelta(seconds=timeout_seconds()),
            device_id=device if device.type == "cuda" else None,
        )
    world = DistributedWorld(rank, size, device)
    world.check_same(config, "training config")
    return world, device


def timeout_seconds() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_VARIABLE} must be a number of seconds > 0, got {text!r}")
    return seconds


def describe_difference(expected: Any, got: Any, path: str = "") -> str:
    """The first few dotted fields where `got` differs from rank 0's `expected`, with both values."""
    if isinstance(expected, dict) and isinstance(got, dict):
        parts = [
            describe_difference(expected.get(k), got.get(k), f"{path}.{k}" if path else str(k))
            for k in sorted(set(expected) | set(got), key=str)
            if expected.get(k) != got.get(k)
        ]
        return ", ".join(parts[:5]) + (f" and {len(parts) - 5} more" if len(parts) > 5 else "")
    return f"{path or 'the value'}={got!r} (rank 0: {expected!r})"


def _copy_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    for tensor, part in zip(tensors, flat.split([t.numel() for t in tensors])):
        tensor.copy_(part.view_as(tensor))


def _to_cpu(value: Any) -> Any:
    """`value` with its tensors on the CPU: gathered objects are unpickled on rank 0's device otherwise."""
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value
