"""Tensor operations shared by processors and losses: segment reductions, token
log-probabilities and entropies, and data-parallel sums."""
