"""Everything about agents learning: the grouping layer, networks, rollout, algorithms, trainer, CLI."""
