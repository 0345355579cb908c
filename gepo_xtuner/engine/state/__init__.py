"""The run state of the RL loop between steps and across a resume: per-rank random
streams and settings, the hook that moves the loop's state into checkpoints, and the
atomic file backend that writes them."""
