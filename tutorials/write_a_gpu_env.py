# %% [markdown]
# # Write a GPU env
#
# This tutorial writes a new environment from scratch, `rendezvous`: agents scattered over a square must
# meet (every agent close to the team's centre) without bumping into each other. It is one short class.
# Then it runs the conformance check on it, breaks the env on purpose four ways to show what the check
# catches and how to fix each, trains a team on it with MAPPO, and measures how fast it steps.
#
# What makes an env fast on an accelerator is that one call to `step` advances *every* env and *every*
# agent with a handful of tensor ops, and never waits for the device to report a value back. Everything
# below follows from that.
#
# Run it as a script (`python tutorials/write_a_gpu_env.py`) or cell by cell in an editor that knows
# `# %%` cells. `VECMARL_QUICK=1` shrinks the budgets to a smoke test (that is how CI runs it). A full
# run writes its figures to `tutorials/figures/`; a smoke test to `runs/tutorial-figures/`, leaving the
# fully trained figures alone (`VECMARL_TUTORIAL_OUT=DIR` picks another folder). On a
# CPU that other jobs share, also set `OMP_NUM_THREADS=1`: torch's threads otherwise wait on each
# other, and the many small ops of a training run get several times slower.

# %%
import dataclasses
import os
import shutil
import time
from pathlib import Path

import torch

import envs
from envs.render import Canvas, colour, play
from marl.algorithms.ppo import PPOConfig
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
# ## The env in one class
#
# An env author writes the physics only; the base class `envs.MultiAgentEnv` owns step counting,
# truncation at `max_steps`, auto-reset of finished envs, seeding and the argument checks. You write:
#
# - a frozen `Config` dataclass of options (a subclass of `envs.EnvConfig`, which holds `max_steps`);
# - `_make_groups`: the agents, grouped by type, with their observation and action specs;
# - `_init_state`: the state, as tensors shaped `[B, ...]` or `[B, n, ...]` (B = `num_envs`, n = agents);
#   all of it: a state tensor first created in `_reset` or `_step` is refused, since a compiled step
#   holds only these in place;
# - `_reset(mask)`: start new episodes in the envs where the bool `[B]` `mask` is true, and only there;
# - `_step(action)`: advance every env and agent at once; return the rewards `{group: [B, n]}` and the
#   termination flags `[B]`;
# - `_observe`: the observations `{group: [B, n, *obs_shape]}`; optionally `_render(index)`, and, for
#   other tasks, `_action_mask` (masked `Discrete` actions), `_state_spec` with `_state` (a global state)
#   and `_agent_terminated` (agents that leave early), with their shapes in the `envs.base` docstring.
#
# Three habits keep it on the device and correct:
#
# - **Draw random numbers for the whole batch, from `self.rng`.** The env's own random stream is what
#   `reset(seed=...)` seeds, so a seed reproduces a run; it is made of plain tensor ops, so the step
#   still compiles into one graph (`self.rng.rand`, `randn`, `randint`). Drawing `[B, n, 2]` numbers on
#   every reset, even when one env resets, keeps the amount of randomness independent of the data: no
#   shape depends on how many envs are done (which would need a host sync to know), and no env's start
#   depends on which *other* envs happened to reset at the same time.
# - **Select with `torch.where`, never with boolean indexing.** `pos[mask] = fresh[mask]` has a shape
#   that depends on the mask's values, so the host must wait for the device to count them.
# - **Reduce over the agent dim, never the batch dim.** Each env is a world of its own.


# %%
@dataclasses.dataclass(frozen=True)
class RendezvousConfig(envs.EnvConfig):
    max_steps: int = 25
    """Episode length: an env is truncated after this many steps."""
    n_agents: int = 4
    """Number of agents that must meet."""
    arena: float = 1.0
    """Agents spawn uniformly in [-arena, arena]^2."""
    agent_radius: float = 0.05
    """Two agents collide when their centres are closer than twice this."""
    meet_radius: float = 0.25
    """The team has met (and the episode ends) when every agent is this close to the team's centre."""
    speed: float = 1.0
    """Distance an agent covers in one time unit at full action."""
    dt: float = 0.1
    """Time step."""
    collision_penalty: float = 1.0
    """Reward subtracted from an agent for each agent it overlaps."""


@envs.register("rendezvous")
class Rendezvous(envs.MultiAgentEnv):
    Config = RendezvousConfig
    config: RendezvousConfig

    def _make_groups(self):
        n = self.config.n_agents
        # Own position, then where every agent (itself included, a zero) is relative to it.
        observation = envs.Box((2 + 2 * n,))
        return {"agent": envs.GroupSpec([f"agent_{i}" for i in range(n)], observation, envs.Box((2,), -1.0, 1.0))}

    def _init_state(self):
        B, n = self.num_envs, self.config.n_agents
        self.pos = torch.zeros(B, n, 2, device=self.device)  # [B, n, 2]

    def _reset(self, mask):
        c, B, n = self.config, self.num_envs, self.config.n_agents
        fresh = (self.rng.rand(B, n, 2) * 2 - 1) * c.arena  # [B, n, 2]
        self.pos = torch.where(mask[:, None, None], fresh, self.pos)

    def centroid(self):
        return self.pos.mean(dim=1, keepdim=True)  # [B, 1, 2]: the mean over each env's own agents

    def _step(self, action):
        c, n = self.config, self.config.n_agents
        self.pos = self.pos + action["agent"] * (c.speed * c.dt)  # action [B, n, 2] in [-1, 1]
        to_centre = (self.pos - self.centroid()).norm(dim=-1)  # [B, n]
        gap = (self.pos.unsqueeze(1) - self.pos.unsqueeze(2)).norm(dim=-1)  # [B, n, n]
        others = ~torch.eye(n, dtype=torch.bool, device=self.device)  # [n, n]: an agent does not hit itself
        collisions = ((gap < 2 * c.agent_radius) & others).sum(-1)  # [B, n]
        # Every step apart costs the whole team the mean distance to the centre: meeting sooner pays.
        reward = -to_centre.mean(-1, keepdim=True) - c.collision_penalty * collisions  # [B, n]
        met = (to_centre < c.meet_radius).all(-1)  # [B]
        return {"agent": reward}, met

    def _observe(self):
        relative = self.pos.unsqueeze(1) - self.pos.unsqueeze(2)  # [B, n, n, 2]: [b, i, j] = pos_j - pos_i
        return {"agent": torch.cat([self.pos, relative.flatten(2)], -1)}  # [B, n, 2 + 2n]

    def _render(self, index):
        c = self.config
        canvas = Canvas(c.arena + 0.5)
        canvas.border(c.arena)
        canvas.disc(self.centroid()[index, 0].cpu().numpy(), c.meet_radius, (160, 160, 160), ring=0.01)
        for i, point in enumerate(self.pos[index].cpu().numpy()):
            canvas.disc(point, c.agent_radius, colour(i))
        return canvas.image


# %% [markdown]
# `@envs.register("rendezvous")` makes the class available by name, with its config fields as options,
# to `envs.make`, `envs.names()` and the trainer of this process. (Running the cell again after an edit
# replaces the registered class with the new one.)

# %%
env = envs.make("rendezvous", num_envs=4, device=device, seed=0, n_agents=3)
print(env)
obs = env.reset()
next_td, obs = env.step(env.sample_actions())
print("observation", tuple(obs["agent", "observation"].shape), "reward", tuple(next_td["agent", "reward"].shape))

# %% [markdown]
# ## Check it
#
# `envs.check_env` runs the env contract's properties on an env: shapes, dtypes and devices of every
# tensor, the flags, no host sync in `reset` or `step`, no Python loop over the envs or the agents,
# seeding, independence of the envs, truncation, auto-reset, masked reset and rendering. It raises `envs.CheckError` naming the first property that
# fails. Run it on every env you write, with a few envs and short episodes so that it is quick.

# %%
envs.check_env(envs.make("rendezvous", num_envs=6, device=device, seed=0, max_steps=12))
print("rendezvous passes check_env")


# %% [markdown]
# ## Mistake 1: skipping the work when nothing is done
#
# A reset is called after every step, usually with few envs (or none) done, so it is tempting to return
# early. But `if not mask.any()` turns a device tensor into a Python bool: the host stops and waits for
# the device to finish everything queued so far, on every step. On a GPU that wait costs more than the
# masked reset it saves. The `host_sync` property catches it (on the CPU too, so CI sees it).


# %%
def check(env_class: type) -> None:
    """Run `check_env` on a few envs of `env_class` and print what it finds."""
    try:
        envs.check_env(env_class(RendezvousConfig(max_steps=12), num_envs=6, device=device, seed=0))
        print(f"{env_class.__name__}: passes")
    except envs.CheckError as error:
        print(f"{env_class.__name__}: {error}")


class SkipsIdleReset(Rendezvous):
    def _reset(self, mask):
        if not mask.any():  # host sync: the device must report mask's values to the host
            return
        super()._reset(mask)


check(SkipsIdleReset)

# %% [markdown]
# The fix is to do nothing special: `torch.where` over the whole batch costs a few microseconds of
# device time and no wait (`Rendezvous._reset` above).
#
# ## Mistake 2: boolean indexing
#
# Writing fresh starts only into the reset envs with a boolean index reads naturally, and it is the
# same host sync in disguise: `fresh[mask]` has as many rows as `mask` has true values, a shape only the
# device knows.


# %%
class IndexedReset(Rendezvous):
    def _reset(self, mask):
        c, B, n = self.config, self.num_envs, self.config.n_agents
        fresh = (self.rng.rand(B, n, 2) * 2 - 1) * c.arena
        self.pos = self.pos.clone()
        self.pos[mask] = fresh[mask]  # data-dependent shape: [mask.sum(), n, 2]


check(IndexedReset)

# %% [markdown]
# The fix: `self.pos = torch.where(mask[:, None, None], fresh, self.pos)`; the mask broadcasts over the
# agent and coordinate dims and every shape stays fixed.
#
# ## Mistake 3: one env leaking into another
#
# Forget `dim=1` in the centre's mean, or write `dim=(0, 1)`, and the "centre" becomes the mean over
# every agent of every env. Broadcasting makes the shapes work, every tensor passes the `data` check,
# and training even runs; but the agents of env 0 are now pulled towards the agents of env 1. The
# `independence` property catches it: it steps the batch twice, changing only env 0's actions the
# second time, and requires every other env to come out the same.


# %%
class LeakyCentroid(Rendezvous):
    def centroid(self):
        return self.pos.mean(dim=(0, 1))  # [2]: the mean over the whole batch


check(LeakyCentroid)

# %% [markdown]
# The fix is the `dim=1, keepdim=True` of `Rendezvous.centroid`: reductions run over agents (dim 1),
# never over envs (dim 0).
#
# ## Mistake 4: a Python loop over the agents
#
# Building each agent's view of the others one agent at a time gives the right numbers, so every other
# property passes; but each agent costs a few more small ops on every step, and with many agents the
# launches, not the arithmetic, set the speed. The `vectorised` property builds the env again with one and
# two agents more (the config's `n_agents`) and counts the ops each line of `reset` and `step` runs: a line
# whose count grows with every agent is a loop.


# %%
class LoopsOverAgents(Rendezvous):
    def _observe(self):
        # [B, n, n, 2], [b, i, j] = pos_j - pos_i, as Rendezvous's, but one agent i at a time
        relative = torch.stack([self.pos - self.pos[:, i : i + 1] for i in range(self.config.n_agents)], 1)
        return {"agent": torch.cat([self.pos, relative.flatten(2)], -1)}


check(LoopsOverAgents)

# %% [markdown]
# The fix is `Rendezvous._observe`'s broadcasting: `pos.unsqueeze(1) - pos.unsqueeze(2)` gives every
# pair `[B, n, n, 2]` at once. And the correct env, for comparison:

# %%
check(Rendezvous)

# %% [markdown]
# ## Yardsticks
#
# Before training, two policies to read a learning curve against: random actions, and a scripted one
# that drives each agent to the team's centre (which it reads from its observation: the mean of the
# relative positions) and ignores collisions. `play` runs a policy and returns the mean episode return
# per agent.

# %%
yardstick_env = envs.make("rendezvous", num_envs=512, device=device, seed=123)
n = yardstick_env.config.n_agents


def to_centre(obs):
    relative = obs["agent", "observation"][..., 2:].unflatten(-1, (n, 2))  # [B, n, n, 2]
    return {"agent": (5.0 * relative.mean(-2)).clamp(-1.0, 1.0)}  # [B, n, 2]


actions = torch.Generator(device).manual_seed(0)  # a seeded generator: the figure reproduces
random_return = play(yardstick_env, lambda obs: yardstick_env.sample_actions(actions), 200)["agent"]
scripted_return = play(yardstick_env, to_centre, 200)["agent"]
print(f"random: {random_return:.2f}, scripted to-centre: {scripted_return:.2f}")

# %% [markdown]
# ## Train a team on it
#
# A registered env trains like any other: name it in `EnvSettings`. MAPPO's critic sees every agent of
# the group, the policy only its own observation, and all agents share one network. The task is easy,
# so a larger learning rate and one minibatch per epoch (256 envs x 32 steps = 8192 frames) learn fast.

# %%
frames = 98_304 if QUICK else 300_000
config = TrainConfig(
    env=EnvSettings(env="rendezvous", num_envs=256),
    algo=PPOConfig(algo="mappo", lr=2e-3, minibatch_size=8192),
    model=ModelConfig(hidden=(64, 64)),
    run=RunConfig(
        total_frames=frames,
        rollout_length=32,
        device=device,
        log_dir=str(OUT / "runs"),
        run_name="rendezvous-mappo",
        progress=not QUICK,
        tensorboard=False,
    ),
)
trainer = Trainer(config)
rows = trainer.train()
returns = [row["agent/episode_return"] for row in rows]
print(f"episode return: first iteration {returns[0]:.2f}, last {returns[-1]:.2f} ({trainer.frames} frames)")

# %%
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
ax.plot([row["frames"] for row in rows], returns, label="MAPPO")
ax.axhline(scripted_return, color="grey", linestyle="--", label="scripted to-centre")
ax.axhline(random_return, color="grey", linestyle=":", label="random")
ax.set_xlabel("frames")
ax.set_ylabel("mean episode return per agent")
ax.set_title("rendezvous, 4 agents")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "rendezvous_learning_curve.png")

# %% [markdown]
# ## How fast does it step?
#
# Throughput is env-steps per second: one step of one env, all of its agents. It grows with `num_envs`
# until the device is busy, because the cost of a step is mostly the fixed cost of launching each op.
# `compile=True` runs the whole step through `torch.compile` as one graph (your `_step`, then the base
# class's step counting, auto-reset and `_observe`), which fuses its dozens of small ops into a few
# kernels (its first steps spend a while compiling, once per batch size). Whether it pays off
# depends on the device and the batch size: for a small batch the compiled call's own overhead can cost
# more than the fusion saves. So measure.
#
# The timing syncs with the device once, at the end; the actions are drawn once beforehand so that only
# the env is timed.


# %%
def steps_per_second(num_envs: int, compile: bool, steps: int) -> float:
    env = envs.make("rendezvous", num_envs=num_envs, device=device, seed=0, compile=compile)
    action = env.sample_actions(torch.Generator(device).manual_seed(0))
    for _ in range(3):  # warm-up (and compilation)
        env.step(action)
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        env.step(action)
    if device == "cuda":
        torch.cuda.synchronize()
    return num_envs * steps / (time.perf_counter() - start)


sizes = (64,) if QUICK else (64, 1024, 16384) if device == "cpu" else (1024, 16384, 262144)
steps = 20 if QUICK else 200
print(f"env-steps/s on {device}, 4 agents, {steps} steps")
print(f"{'num_envs':>9}{'eager':>12}{'compiled':>12}")
for num_envs in sizes:
    eager, compiled = (steps_per_second(num_envs, compile, steps) for compile in (False, True))
    print(f"{num_envs:>9}{eager:>12,.0f}{compiled:>12,.0f}")
print(f"figures written to {OUT}")


# %% [markdown]
# ## Where to go from here
#
# - To train it from the command line, put the class in a module of your own (`my_envs.py`, in the
#   folder you run `marl` from or on `PYTHONPATH`): `marl train --imports my_envs --env rendezvous`;
#   `marl eval` finds the module again from the checkpoint.
# - To ship the env with vecmarl, put the class in its own module under `envs/native/` (one file, like
#   `envs/native/navigation.py`), import that module in `envs/__init__.py`, and add a test that runs
#   `check_env` on it over a few sizes (like `tests/envs/native/test_spread.py`). It is then also available
#   to the command line: `marl train --env rendezvous --env-option n_agents=6`.
# - `python -m envs.bench.steps` measures the package's envs, side by side with VMAS when it is installed.
