"""On a GPU, `marl train --compile` captures its rollout step and its update step as CUDA graphs, and says so.

A graph torch does not capture still runs, kernel by kernel, so only the GPU test here (and the line the
trainer prints) tells: it fails naming torch's reason (`envs.cudagraphs`). The reason seen most, a graph
that mutates an input not marked static, is checked on the CPU too, from what AOTAutograd records of
the compiled graphs."""

import warnings

import pytest
import torch

import envs.compile
from envs import cudagraphs
from marl.app.trainer import Trainer
from tests.conftest import mark_static_everywhere, static_mutations_backend
from tests.marl.app.test_training import small_config


@pytest.mark.gpu
@pytest.mark.parametrize("unroll", [1, 4], ids=lambda u: f"unroll{u}")
def test_compiled_rollout_and_update_steps_are_captured(tmp_path, capsys, unroll):
    # 3 iterations of 16 steps, 4 minibatch steps each: both steps are recorded in the first (the second
    # call of a compiled function records its CUDA graph, the first warms up).
    config = small_config(tmp_path, device="cuda", compile=True, compile_unroll=unroll)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(config).train()
    reports, printed = cudagraphs.reports(), capsys.readouterr().out
    for name in ("rollout step", "update step"):
        assert name in reports, f"{name} was never compiled for CUDA: {sorted(reports)}"
        assert reports[name].captured, reports[name].describe()
        assert f"CUDA graphs: {name}: captured" in printed, printed
    assert not [str(w.message) for w in caught if str(w.message).startswith("CUDA graphs:")]


def test_compiled_steps_mutate_only_static_inputs(tmp_path, monkeypatch):
    # On CUDA torch skips recording a graph that mutates an input not marked static ("mutated inputs"):
    # here PPO's compiled rollout and update steps are traced with what they mark on CUDA marked on the
    # CPU, and every graph input they write must be among the static ones. Every test that compiles
    # with the `without_inductor` fixture checks its graphs the same way (tests/conftest.py): the
    # off-policy updates (prioritized replay's writes its sum tree and largest priority), populations
    # (their stacked nets, Adam state, targets and every member's tree) and the envs' compiled steps.
    graphs = []
    monkeypatch.setattr(envs.compile, "_inductor_cpu", static_mutations_backend(graphs))
    mark_static_everywhere(monkeypatch)
    torch._dynamo.reset()
    try:
        trainer = Trainer(small_config(tmp_path, compile=True), run_dir=tmp_path / "run")
        trainer.train_iteration()
    finally:
        torch._dynamo.reset()  # the graphs compiled with this backend go
    assert len(graphs) >= 2 and all(mutated for _, mutated, _ in graphs), graphs  # the rollout and update steps
    assert [not_static for _, _, not_static in graphs] == [[]] * len(graphs), graphs
