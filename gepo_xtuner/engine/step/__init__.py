"""The stages of one RL step, as the loop (``engine/loop.py``) calls them: the rollout
stage (in turn or one batch ahead) and the prompts it encodes, the response tensors,
scoring, the update with its optimizer steps and batch arithmetic, and validation."""
