# %% [markdown]
# # Train a team
#
# This tutorial trains three agents to drive to their goals on `navigation`, vecmarl's GPU-native
# version of VMAS's navigation task, with MAPPO and with IPPO. It shows what an env hands you, how
# the trainer is configured, and ends with learning curves and a GIF of the trained team.
#
# Run it as a script (`python tutorials/train_a_team.py`) or cell by cell in an editor that knows
# `# %%` cells. `VECMARL_QUICK=1` shrinks the budgets to a smoke test (that is how CI runs it). A full
# run writes its figures to `tutorials/figures/`; a smoke test to `runs/tutorial-figures/`, leaving the
# fully trained figures alone (`VECMARL_TUTORIAL_OUT=DIR` picks another folder).

# %%
import os
import shutil
from pathlib import Path

import torch

import envs
from envs.native.navigation import scripted_action
from marl.algorithms.ppo import PPOConfig
from marl.app.evaluate import evaluate
from marl.app.trainer import Trainer
from marl.config import EnvSettings, ModelConfig, RunConfig, TrainConfig

QUICK = os.environ.get("VECMARL_QUICK") == "1"
# A full run writes the figures the README shows, to tutorials/figures; a smoke test writes its barely
# trained ones to runs/tutorial-figures (ignored by git) instead, so that it never overwrites them.
FIGURES = Path(__file__).resolve().parent / "figures"
QUICK_FIGURES = Path(__file__).resolve().parents[1] / "runs" / "tutorial-figures"
OUT = Path(os.environ.get("VECMARL_TUTORIAL_OUT", QUICK_FIGURES if QUICK else FIGURES))
OUT.mkdir(parents=True, exist_ok=True)
shutil.rmtree(OUT / "runs", ignore_errors=True)  # the tutorial trains from scratch: last time's runs go
device = "cuda" if torch.cuda.is_available() else "cpu"

# %% [markdown]
# ## The env: a batch of worlds on the device
#
# `envs.make` builds `num_envs` copies of a task, all stepped at once. Agents come in *groups*; here a
# single group `agent` of three agents that share one observation and one action spec.

# %%
env = envs.make("navigation", num_envs=1024, device=device, seed=0, n_agents=3)
print(env)
for name, spec in env.groups.items():
    print(name, spec.agents, "observation", spec.observation, "action", spec.action)

# %% [markdown]
# `reset` returns a `TensorDict` with `batch_size=[num_envs]`; each group's tensors are
# `[num_envs, n_agents, ...]`. `step` returns `(next, obs)`: `next` holds the transition (reward,
# flags and the *true* next observation), `obs` is what the policy acts on next, with finished envs
# already reset.

# %%
obs = env.reset()
print(obs)
next_td, obs = env.step({"agent": scripted_action(obs["agent", "observation"])})
print("reward", next_td["agent", "reward"].shape, "done", next_td["done"].shape)

# %% [markdown]
# ## Train with MAPPO and IPPO
#
# A run is configured by four small dataclasses (their fields are the options of `marl train`).
# MAPPO's critic sees every agent of the group; IPPO's sees only the agent's own observation.

# %%
frames = 32_768 if QUICK else 1_500_000


def config(algo: str) -> TrainConfig:
    return TrainConfig(
        env=EnvSettings(env="navigation", num_envs=256),
        algo=PPOConfig(algo=algo),
        model=ModelConfig(hidden=(64, 64)),
        run=RunConfig(
            total_frames=frames,
            device=device,
            log_dir=str(OUT / "runs"),
            run_name=f"navigation-{algo}",
            progress=not QUICK,
            tensorboard=False,
        ),
    )


trainers = {}
for algo in ("mappo", "ippo"):
    trainers[algo] = Trainer(config(algo))
    trainers[algo].train()
    print(algo, "done:", trainers[algo].frames, "frames")

# %% [markdown]
# ## Learning curves
#
# Every run writes `metrics.csv`; here both runs on one plot, next to what the scripted
# go-to-goal controller (which steers away from what its LIDAR sees) gets.

# %%
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from marl.app.plot import read_metrics  # noqa: E402

scripted_env = envs.make("navigation", num_envs=1000, device=device, seed=123)
obs = scripted_env.reset()
returns = torch.zeros(1000, device=device)
finished = torch.zeros(1000, dtype=torch.bool, device=device)
for _ in range(scripted_env.max_steps):
    next_td, obs = scripted_env.step({"agent": scripted_action(obs["agent", "observation"])})
    returns += torch.where(finished, 0.0, next_td["agent", "reward"][:, 0, 0])
    finished |= next_td["done"][:, 0]
scripted = returns.mean().item()

fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
for algo, trainer in trainers.items():
    rows = [r for r in read_metrics(trainer.run_dir) if r["agent/episode_return"] == r["agent/episode_return"]]
    ax.plot([r["frames"] for r in rows], [r["agent/episode_return"] for r in rows], label=algo.upper())
ax.axhline(scripted, color="grey", linestyle="--", label="scripted controller")
ax.set_xlabel("frames")
ax.set_ylabel("mean episode return")
ax.set_title("navigation, 3 agents")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "navigation_learning_curves.png")
print("scripted controller:", round(scripted, 3))

# %% [markdown]
# ## Watch the trained team
#
# `evaluate` runs the policy's mode on fresh envs and can render one episode to a GIF (the same as
# `marl eval --checkpoint ... --render team.gif`).

# %%
result = evaluate(str(trainers["mappo"].checkpoint_path), episodes=100, render=str(OUT / "navigation_mappo.gif"))
print("MAPPO, deterministic:", result["returns"])
print(f"figures written to {OUT}")
