"""On a GPU, `marl train --compile` captures its rollout step and its update step as CUDA graphs, and says so.

A graph torch does not capture still runs, kernel by kernel, so only the GPU test here (and the line the
trainer prints) tells: it fails naming torch's reason (`envs.cudagraphs`). The reason seen most, a graph
that mutates an input not marked static, is checked on the CPU too, from what AOTAutograd records of
the compiled graphs."""

import dataclasses
import warnings

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

import envs.compile
from envs import cudagraphs
from marl.app.trainer import Trainer
from tests.marl.algorithms.test_offpolicy import small_config as offpolicy_config
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


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "masac-prioritized", "masac-prioritized-seeds"])
def test_compiled_steps_mutate_only_static_inputs(tmp_path, monkeypatch, algo):
    # On CUDA torch skips recording a graph that mutates an input not marked static ("mutated inputs"):
    # here the compiled rollout and update steps are traced with what they mark on CUDA marked on the CPU,
    # and every graph input they write must be among the static ones (prioritized replay's update step
    # writes the buffer's sum tree and largest priority; a population's (`-seeds`), its stacked nets, Adam
    # state, targets and every member's tree). The population runs on navigation: its one group halves the
    # graphs to trace, and what is marked static does not depend on a group's kind of action.
    if algo == "ppo":
        config = small_config(tmp_path, compile=True)
    else:
        env = "navigation" if algo.endswith("-seeds") else "speaker_listener"
        config = offpolicy_config(tmp_path, "masac", env, compile=True, prioritized=True)
    if algo.endswith("-seeds"):
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, seeds=(3, 8)))
    graphs = []

    def record_mutations(graph, example_inputs, cpp_wrapper=False):
        def forward_compiler(module, inputs):
            meta = torch._guards.TracingContext.try_get().fw_metadata
            mutated = {i for i, info in enumerate(meta.input_info) if info.mutates_data or info.mutates_metadata}
            graphs.append((len(inputs), sorted(mutated), sorted(mutated - set(meta.static_input_indices))))
            return module

        return aot_autograd(fw_compiler=forward_compiler, keep_inference_input_mutations=True)(graph, example_inputs)

    def mark_everywhere(tensors, device):
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)

    monkeypatch.setattr(envs.compile, "_inductor_cpu", record_mutations)
    monkeypatch.setattr(cudagraphs, "mark_static", mark_everywhere)
    torch._dynamo.reset()
    try:
        trainer = Trainer(config, run_dir=tmp_path / "run")
        trainer.train_iteration()
    finally:
        torch._dynamo.reset()  # the graphs compiled with this backend go
    assert len(graphs) >= 2 and all(mutated for _, mutated, _ in graphs), graphs  # the rollout and update steps
    assert [not_static for _, _, not_static in graphs] == [[]] * len(graphs), graphs
