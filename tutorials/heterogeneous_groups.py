# %% [markdown]
# # Heterogeneous groups
#
# Agents of different kinds see different things and act differently. vecmarl keeps each kind in its
# own *group*: one stacked tensor `[num_envs, n, ...]` per group, one policy, critic, optimiser and
# loss term per group, and every group collected and updated in the same iteration, batched over the
# envs. This tutorial shows
#
# 1. group maps side by side on `tag` (predators and prey see 16 and 14 numbers),
# 2. per-group configs on `speaker_listener` (a `Discrete` speaker and a continuous listener),
# 3. critic scopes: what each group's critic sees, and how that changes learning.
#
# `VECMARL_QUICK=1` shrinks every budget to a smoke test. A full run writes its figures to
# `tutorials/figures/`; a smoke test to `runs/tutorial-figures/`, leaving the fully trained figures
# alone (`VECMARL_TUTORIAL_OUT=DIR` picks another folder).

# %%
import os
import shutil
from pathlib import Path

import torch

import envs
from envs.native.speaker_listener import scripted_actions
from marl.algorithms.ppo import PPOConfig
from marl.app.plot import read_metrics
from marl.app.trainer import Trainer
from marl.config import EnvSettings, RunConfig, TrainConfig
from marl.core.groups import GroupedEnv

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
# ## Group maps
#
# By default agents are grouped by type, as the env declares them. Stacking predators and prey into
# one group fails, because their observations differ; the error names both specs. With `pad=True`
# the observations are zero-padded to the largest size and tagged with a one-hot of the agent's type,
# which works here because both kinds take the same 2-D force action.

# %%
tag = envs.make("tag", num_envs=4, device=device, seed=0)
for name, group_map, pad in [
    ("by type", "by_type", False),
    ("one per agent", "per_agent", False),
    ("all in one, padded", "all_in_one", True),
]:
    grouped = GroupedEnv(tag, group_map, pad=pad)
    print(f"{name:>20}:", {g: (s.n_agents, s.observation.shape) for g, s in grouped.groups.items()})
try:
    GroupedEnv(tag, "all_in_one")
except ValueError as error:
    print("all in one, unpadded:", error)

# %% [markdown]
# ## A discrete and a continuous group, each with its own config
#
# In `speaker_listener` the speaker sees the colour of the target and says one of three words; the
# listener hears the word, sees the landmarks and moves. The reward is shared. Each group gets its own
# policy head (categorical for the speaker, tanh-Gaussian for the listener) and, here, its own
# hidden sizes (the speaker's task is simpler: 32x32): `group_overrides` (`--group speaker.hidden=[32,32]`
# on the command line) changes any algorithm or network field for one group, except the run-wide ones
# that every group shares (`marl train --help` lists them under `--group`).

# %%
frames = 20_000 if QUICK else 2_000_000


def speaker_listener(scope: str, name: str) -> Trainer:
    config = TrainConfig(
        env=EnvSettings(env="speaker_listener", num_envs=256),
        algo=PPOConfig(algo="mappo", critic_scope=scope),
        run=RunConfig(
            total_frames=frames,
            device=device,
            log_dir=str(OUT / "runs"),
            run_name=name,
            progress=not QUICK,
            tensorboard=False,
        ),
        group_overrides={"speaker": {"hidden": (32, 32)}},
    )
    return Trainer(config)


trainer = speaker_listener("global", "speaker_listener-global")
for group, learner in trainer.algorithm.learners.items():
    print(group, type(learner.policy.spec.action).__name__, "critic sees", learner.critic_input.size, "numbers")

# %% [markdown]
# ## Critic scopes
#
# - `agent` (IPPO): each agent's own observation;
# - `group` (MAPPO within the group): every agent of the group;
# - `global`: every group's observations (or the env's `state` when it has one).
#
# The listener cannot know the target without the speaker; a `group` critic for the listener sees
# only the listener, while a `global` critic also sees the speaker's target, so it can tell a good
# step from a lucky one. Train both and compare: at the defaults and 2M frames each, the global critic's
# team ended near −11 and the group critic's near −14 (random actions −36, the scripted pair −7).

# %%
trainers = {"global": trainer, "group": speaker_listener("group", "speaker_listener-group")}
for t in trainers.values():
    t.train()

env = envs.make("speaker_listener", num_envs=1000, device=device, seed=5)


def mean_return(act) -> float:
    obs = env.reset()
    total = torch.zeros(1000, device=device)
    for _ in range(env.max_steps):
        next_td, obs = env.step(act(obs))
        total += next_td["listener", "reward"][:, 0, 0]
    return total.mean().item()


def trained(t: Trainer):
    def act(obs):
        with torch.no_grad():
            return {
                g: (d := lr.policy(obs[g, "observation"])).env_action(d.mode())
                for g, lr in t.algorithm.learners.items()
            }

    return act


generator = torch.Generator(device).manual_seed(0)
baselines = {
    "random": mean_return(lambda obs: env.sample_actions(generator)),
    "scripted pair": mean_return(scripted_actions),
}
results = {f"MAPPO, {scope} critic": mean_return(trained(t)) for scope, t in trainers.items()}
for name, value in {**results, **baselines}.items():
    print(f"{name:>24}: mean episode return {value:.2f}")

# %%
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
for scope, t in trainers.items():
    rows = [r for r in read_metrics(t.run_dir) if r["listener/episode_return"] == r["listener/episode_return"]]
    ax.plot([r["frames"] for r in rows], [r["listener/episode_return"] for r in rows], label=f"{scope} critic")
for name, value in baselines.items():
    ax.axhline(value, linestyle="--", color="grey" if name == "random" else "black", label=name)
ax.set_xlabel("frames")
ax.set_ylabel("mean episode return")
ax.set_title("speaker_listener, MAPPO")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "speaker_listener_critic_scopes.png")

# %% [markdown]
# ## Competitive groups: predators against scripted prey
#
# In `tag` each group has its own reward. With `scripted_prey=True` the prey flee by a heuristic
# (`envs.native.tag.scripted_prey_action`) and only the predators learn; count how often they touch the
# prey, against random predators. Without it both groups learn, each against the other.

# %%
tag_trainer = Trainer(
    TrainConfig(
        env=EnvSettings(env="tag", num_envs=256, env_options={"scripted_prey": True}),
        run=RunConfig(
            total_frames=20_000 if QUICK else 1_500_000,
            device=device,
            log_dir=str(OUT / "runs"),
            run_name="tag-predators",
            progress=not QUICK,
            tensorboard=False,
        ),
    )
)
tag_trainer.train()
tag_env = envs.make("tag", num_envs=1000, device=device, seed=9, scripted_prey=True)


def catches(act) -> float:
    obs = tag_env.reset()
    total = torch.zeros(1000, device=device)
    for _ in range(tag_env.max_steps):
        next_td, obs = tag_env.step(act(obs))
        total += next_td["predator", "reward"][:, 0, 0] / tag_env.config.catch_reward
    return total.mean().item()


print("catches per episode, trained predators:", round(catches(trained(tag_trainer)), 2))
print("catches per episode, random predators: ", round(catches(lambda obs: tag_env.sample_actions(generator)), 2))
print(f"figures written to {OUT}")
