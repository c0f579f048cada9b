"""Numerical kernels for reinforcement learning: each op has a Triton kernel, a fast torch path and a
plain reference loop, behind one public function."""
