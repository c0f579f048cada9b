"""Everything about agents learning: the grouping layer, networks, rollout, algorithms, trainer, CLI.

- `config`: EnvSettings, AlgorithmConfig, ModelConfig, RunConfig, TrainConfig (the options of `marl train`);
- `algorithms/`: base (the Algorithm interface, registry), ppo (MAPPO, IPPO), offpolicy (the replay update
  loop), ddpg, sac, qlearning (IQL, VDN, QMIX), mixed (an off-policy algorithm per group); many seeds in one
  process: seeded, ppo_seeds, offpolicy_seeds, qlearning_seeds;
- `core/`: groups (the grouping layer), networks (MLP, GRU), distributions, models, rollout, replay, timing,
  members and member_replay (seeds as a batch dim: stacked parameters under vmap);
- `optim/`: update_step (eager autograd + fused Adam, or one compiled graph per optimiser step), background
  (overlap-critic's thread), tanh (the CPU's faster tanh);
- `app/`: trainer (the run loop), build, cli, evaluate, plot, summary, logger, wandb_logging, checkpoint, paths,
  distributed (torchrun), seeds (a population's checks, memory, logs, checkpoints);
- `bench/`: the benchmarks (`marl bench`: suite; train, benchmarl, benchmarl_worker, replay, seeds, recurrent,
  gpu_report), which no library module imports.
"""
