"""Numerical kernels for reinforcement learning: each op has a Triton kernel, a fast torch path and a
plain reference loop, behind one public function taking time-major `[T, *batch]` tensors. Modules: gae,
returns (discounted and TD(lambda) returns), sum_tree (prioritized replay's sum tree); bench/ times them."""

from .gae import gae
from .returns import discounted_returns, td_lambda_returns
from .sum_tree import sum_tree_find, sum_tree_leaves, sum_tree_update_, sum_tree_write_, sum_tree_zeros

__all__ = [
    "discounted_returns",
    "gae",
    "sum_tree_find",
    "sum_tree_leaves",
    "sum_tree_update_",
    "sum_tree_write_",
    "sum_tree_zeros",
    "td_lambda_returns",
]
