# %% [markdown]
# # Off-policy learning, replay and many seeds
#
# MAPPO learns from the batch it has just collected and throws it away; the off-policy algorithms keep
# every transition in a replay buffer on the device and learn from it many times. This tutorial shows
#
# 1. the replay buffer: what it stores, how it is sampled, prioritized by TD error;
# 2. MASAC against MAPPO on `navigation`: fewer frames to learn, more arithmetic per frame;
# 3. value-based learning on `spread` (discrete moves): IQL, VDN and QMIX against the scripted team;
# 4. many seeds in one process: a population of seeds crossed with learning rates, with confidence
#    intervals over the seeds, and one member evaluated on its own.
#
# `VECMARL_QUICK=1` shrinks every budget to a smoke test. A full run writes its figures to
# `tutorials/figures/`; a smoke test to `runs/tutorial-figures/`, leaving the fully trained figures
# alone (`VECMARL_TUTORIAL_OUT=DIR` picks another folder).

# %%
import dataclasses
import os
import shutil
from pathlib import Path

import torch

import envs
from envs.native import navigation, spread
from envs.render import play
from marl.algorithms.ppo import PPOConfig
from marl.algorithms.qlearning import QConfig, QMIXConfig
from marl.algorithms.sac import SACConfig
from marl.app import seeds
from marl.app.evaluate import evaluate
from marl.app.plot import read_metrics
from marl.app.trainer import Trainer
from marl.config import EnvSettings, RunConfig, TrainConfig
from marl.core.replay import Prioritized, ReplayBuffer
from marl.core.rollout import Collector

QUICK = os.environ.get("VECMARL_QUICK") == "1"
# A full run writes the figures the README shows, to tutorials/figures; a smoke test writes its barely
# trained ones to runs/tutorial-figures (ignored by git) instead, so that it never overwrites them.
FIGURES = Path(__file__).resolve().parent / "figures"
QUICK_FIGURES = Path(__file__).resolve().parents[1] / "runs" / "tutorial-figures"
OUT = Path(os.environ.get("VECMARL_TUTORIAL_OUT", QUICK_FIGURES if QUICK else FIGURES))
OUT.mkdir(parents=True, exist_ok=True)
shutil.rmtree(OUT / "runs", ignore_errors=True)  # the tutorial trains from scratch: last time's runs go
device = "cuda" if torch.cuda.is_available() else "cpu"


NUM_ENVS = 64 if QUICK else 256  # a full run's 256; fewer for the smoke test
ITERATION = NUM_ENVS * 64  # frames per iteration: NUM_ENVS envs x 64 steps, every run's here


def config(env: str, algo, frames: int, name: str, **run) -> TrainConfig:
    """A run of `frames` frames on `NUM_ENVS` envs of `env` with the algorithm config `algo`."""
    if QUICK and hasattr(algo, "updates_per_iteration"):  # the smoke test: a few optimiser steps an iteration
        algo = dataclasses.replace(algo, updates_per_iteration=8)
    return TrainConfig(
        env=EnvSettings(env=env, num_envs=NUM_ENVS),
        algo=algo,
        run=RunConfig(
            total_frames=frames,
            device=device,
            log_dir=str(OUT / "runs"),
            run_name=name,
            progress=not QUICK,
            tensorboard=False,
            **run,
        ),
    )


# %% [markdown]
# ## The replay buffer
#
# Collection fills a time-major `[T, B]` batch, as for PPO. The buffer takes it whole: `T * B` env steps
# written into preallocated ring storage, `[capacity, n_agents, ...]` per key, with no host sync. Every
# group of an env shares one index, so a sampled slot is the same env step for all of them (what a
# centralised critic needs). Here one rollout of 64 steps of 64 envs, acted by an untrained MASAC policy.

# %%
# A replay buffer as large as the run (the default holds 1M env steps: 452 MiB for navigation).
frames = (2 if QUICK else 16) * ITERATION
masac = Trainer(config("navigation", SACConfig(algo="masac", buffer_size=frames), frames, "navigation-masac"))
env = envs.make("navigation", num_envs=64, device=device, seed=1)
generator = torch.Generator(device).manual_seed(0)
batch = Collector(env, masac.algorithm.acting, 64, generator, seed=1).collect()
print("collected:", batch.batch_size, "with keys", sorted(batch["agent"].keys()))

buffer = ReplayBuffer.for_env(env, capacity=100_000, prioritized=Prioritized(alpha=0.6, beta=0.4))
buffer.extend(batch)
print(buffer)
for key, tensor in buffer.storage.items():
    print(f"  {'/'.join(key) if isinstance(key, tuple) else key:<26} {tuple(tensor.shape)} {tensor.dtype}")

# %% [markdown]
# A sample is a `TensorDict` of `k` env steps with their slots (`index`) and, prioritized, their
# importance weights. New steps enter at the largest priority so far; a learner then sets each drawn
# step's priority to its TD error (per agent `[k, n]`, reduced over the agents by their max). Here every
# stored step gets an error of 0.01 but slot 0, whose agents erred by 10: with `alpha` 0.6 it is drawn
# `(10 / 0.01) ** 0.6`, about 63 times as often as any other, and its importance weight (`beta` 0.4)
# shrinks its share of the loss to make up for it.

# %%
sample = buffer.sample(256, generator)
print("sample:", sample.batch_size, "index", sample["index"][:4].tolist(), "weight", sample["weight"][:4].tolist())
slots = torch.arange(len(buffer), device=device)
errors = torch.full((len(buffer), 3), 0.01, device=device)
errors[0] = 10.0
buffer.update_priority(slots, {"agent": errors})
again = buffer.sample(len(buffer), generator)
hot = again["index"] == 0
ratio = hot.sum().item() / ((~hot).sum().item() / (len(buffer) - 1))
print(f"slot 0: drawn {ratio:.0f}x as often as the others' mean, importance weight {again['weight'][hot][0]:.3f}")

# %% [markdown]
# ## MASAC against MAPPO
#
# MASAC (soft actor-critic with a centralised critic over every agent's observations and actions) takes
# 256 optimiser steps per iteration of 16,384 frames, each on 256 env steps drawn from the buffer;
# MAPPO takes 4 epochs of minibatches of 4,096 over its batch, once. MASAC needs fewer frames to learn;
# each frame costs it more arithmetic. Which one wins in seconds depends on how fast the env is: on the
# device a native env's frames are cheap, a slow simulator's are not.

# %%
mappo = Trainer(config("navigation", PPOConfig(algo="mappo"), 2 * frames, "navigation-mappo"))
runs = {"MASAC": masac, "MAPPO": mappo}
for name, trainer in runs.items():
    trainer.train()
    print(f"{name}: {trainer.frames:,} frames in {trainer.elapsed:.1f} s")

scripted_env = envs.make("navigation", num_envs=1000, device=device, seed=123)
scripted = play(scripted_env, lambda obs: {"agent": navigation.scripted_action(obs["agent", "observation"])}, 200)

# %%
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def curve(run_dir, key: str, x: str = "frames") -> tuple[list, list]:
    """A run's `key` against `x` over the iterations in which an episode ended."""
    rows = [r for r in read_metrics(run_dir) if r[key] == r[key]]
    return [r[x] for r in rows], [r[key] for r in rows]


fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=120, sharey=True)
for ax, x, label in zip(axes, ("frames", "time_s"), ("frames", "training time (s)")):
    for name, trainer in runs.items():
        ax.plot(*curve(trainer.run_dir, "agent/episode_return", x), marker=".", label=name)
    ax.axhline(scripted["agent"], color="grey", linestyle="--", label="scripted controller")
    ax.set_xlabel(label)
    ax.grid(alpha=0.3)
axes[0].set_ylabel("mean episode return")
axes[0].legend()
fig.suptitle(f"navigation, 3 agents, on {device}")
fig.tight_layout()
fig.savefig(OUT / "navigation_masac_mappo.png")

# %% [markdown]
# ## Value-based methods on spread
#
# `spread` asks three agents to cover three landmarks with 5 discrete moves each. IQL learns each agent's
# Q alone; VDN learns the team's Q as the sum of the agents'; QMIX mixes them with a monotonic network
# conditioned on every agent's observation. All three act ε-greedily (ε annealed from 0.8 to 0.01 over
# the first third of the run) and `marl eval` acts greedily. The yardsticks: random moves, and the
# scripted greedy assignment of agents to landmarks.

# %%
frames = (2 if QUICK else 61) * ITERATION  # about 1M
value_based = {}
# IQL and VDN take many small optimiser steps (256 of 256 env steps per iteration); QMIX's own config keeps
# 32 of 2048 (`marl train --help` says why).
for algo, Config in (("iql", QConfig), ("vdn", QConfig), ("qmix", QMIXConfig)):
    value_based[algo] = Trainer(config("spread", Config(algo=algo, buffer_size=frames), frames, f"spread-{algo}"))
    value_based[algo].train()

spread_env = envs.make("spread", num_envs=1000, device=device, seed=7)
baselines = {
    "random": play(spread_env, lambda obs: spread_env.sample_actions(generator, obs=obs), 100)["agent"],
    "scripted": play(spread_env, lambda obs: {"agent": spread.scripted_action(obs["agent", "observation"])}, 100)[
        "agent"
    ],
}
for algo, trainer in value_based.items():
    greedy = evaluate(str(trainer.checkpoint_path), episodes=1000)["returns"]["agent"]["mean"]
    print(f"{algo.upper():>5}: greedy return {greedy:.2f} per agent")
print({name: round(value, 2) for name, value in baselines.items()})

fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
for algo, trainer in value_based.items():
    ax.plot(*curve(trainer.run_dir, "agent/episode_return"), label=algo.upper())
for name, value in baselines.items():
    ax.axhline(value, linestyle="--", color="grey" if name == "random" else "black", label=name)
ax.set_xlabel("frames")
ax.set_ylabel("mean episode return per agent (ε-greedy)")
ax.set_title("spread, 3 agents")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "spread_value_based.png")

# %% [markdown]
# ## Many seeds in one process
#
# One seed says little: RL curves differ from seed to seed. `seeds` trains several runs at once, each a
# *member* that learns exactly as the single run with its seed would, with the members' parameters
# stacked along a seed dimension (one matmul for all of them) and their envs one batch. `sweep` crosses
# the seeds with option values. The command line's way: `marl train --seeds 0 1 2 --sweep
# lr=3e-4,1e-3`. Here MAPPO, 3 seeds x 2 learning rates: 6 members.

# %%
population = Trainer(
    config(
        "navigation",
        PPOConfig(algo="mappo"),
        (2 if QUICK else 25) * ITERATION,
        "navigation-mappo-lr",
        seeds=(0, 1, 2),
        sweep=("lr=3e-4,1e-3",),
    )
)
rows = population.train()
seeds.print_summary(population, rows)  # what `marl train` prints at the end: the settings ranked

# %% [markdown]
# Each member logs its own `metrics.csv` under the run folder. Per learning rate, the mean over the
# seeds and its 95% bootstrap confidence interval, iteration by iteration:

# %%
by_lr: dict[float, list] = {}
for member in population.members:
    lr = dict(member.values)["lr"]
    by_lr.setdefault(lr, []).append(read_metrics(seeds.member_dir(population.run_dir, member)))

fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
for lr, logs in by_lr.items():
    points = []
    for rows_at in zip(*logs):  # the members' rows of one iteration
        returns = [r["agent/episode_return"] for r in rows_at]
        if all(v == v for v in returns):
            mean, _, low, high = seeds.bootstrap_ci(returns)
            points.append((rows_at[0]["frames"], mean, low, high))
    frames_at, means, lows, highs = zip(*points) if points else ((), (), (), ())
    line = ax.plot(frames_at, means, label=f"lr {lr:g}, {len(logs)} seeds")
    ax.fill_between(frames_at, lows, highs, color=line[0].get_color(), alpha=0.2)
ax.axhline(scripted["agent"], color="grey", linestyle="--", label="scripted controller")
ax.set_xlabel("frames")
ax.set_ylabel("mean episode return")
ax.set_title("navigation, MAPPO: mean and 95% CI over seeds")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "navigation_lr_sweep.png")

# %% [markdown]
# Every member also has its own checkpoint: evaluate one (`marl eval --checkpoint RUN/checkpoint.pt
# --member seed_1-lr_0.001`), or resume it alone as an ordinary single run (`marl train --resume
# RUN/seed_1-lr_0.001/checkpoint.pt`).

# %%
member = population.members[-1]
result = evaluate(str(population.checkpoint_path), episodes=200, member=member.name)
print(f"member {member.name}: greedy return {result['returns']['agent']['mean']:.3f}")
print(f"figures written to {OUT}")
