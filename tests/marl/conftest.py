"""Shared by the training tests: the kernels' torch paths for CPU tensors, and an eager rollout step."""

import importlib

import pytest

from kernels._common import resolve_backend
from marl.core import rollout

# The modules (`kernels.gae` the attribute is the function of that name).
KERNEL_MODULES = [importlib.import_module(f"kernels.{name}") for name in ("gae", "returns", "sum_tree")]


@pytest.fixture(autouse=True)
def kernels_torch_path_on_the_cpu(request, monkeypatch):
    """GAE, the returns and the replay's sum tree run their torch paths on CPU tensors, as a CPU user's do:
    `"auto"` picks Triton's interpreter under the suite's TRITON_INTERPRET=1, which took 60% of the
    off-policy population tests' time (the sum tree) and a quarter of the PPO tests' (GAE). The Triton
    kernels are held to their reference loops interpreted (tests/kernels), inside the replay buffer
    (tests/marl/core, left as it is: its `auto` cases run them) and on a GPU (the `gpu` tests)."""
    if request.path.parent.name == "core":
        return

    def torch_for_auto(backend, device, kernel):
        return resolve_backend("torch" if backend == "auto" and device.type == "cpu" else backend, device, kernel)

    for module in KERNEL_MODULES:
        monkeypatch.setattr(module, "resolve_backend", torch_for_auto)


@pytest.fixture
def eager_rollout(monkeypatch):
    """With `--compile`, the rollout step runs eagerly and only the update step compiles: for the tests of a
    compiled update, whose rollout step other tests compile (PPO's with Inductor, the CUDA-graph checks)."""
    monkeypatch.setattr(rollout, "maybe_compile", lambda fn, *args, **kwargs: fn)


@pytest.fixture
def speaker_listener_unsaved(monkeypatch):
    """`speaker_listener` as an env that cannot save its state (as VMAS and PettingZoo): a resumed run starts
    new episodes."""
    from envs.native.speaker_listener import SpeakerListener

    def cannot_save(self):
        raise NotImplementedError("speaker_listener (in this test): its state lives in a simulator")

    monkeypatch.setattr(SpeakerListener, "state_dict", cannot_save)
