"""Model directories and the report of the GPU checks (``make test-gpu``).

The models are Qwen2s built from a config with the character tokenizer: random weights
drawn with an ``initializer_range`` of about ``2.4 / sqrt(hidden)`` (not the usual 0.02),
so the logits have a spread of a few nats and depend on the context: a token that sees the
wrong context, or a wrong position, moves its logprob by far more than bf16 rounding does
(``tests/test_testbed/test_gpu.py`` shows it on CPU).
"""

from pathlib import Path

import pytest
import torch

from gepo_xtuner.testbed.gpu import device_summary, record
from gepo_xtuner.testbed.rl_step import QWEN2_0_5B, build_qwen2
from gepo_xtuner.testbed.tiny import build_char_tokenizer
from tests.test_engine.conftest import tiny_dir  # noqa: F401 - the task data of the RL runs

# name -> build_qwen2 arguments (vocab None: the character tokenizer's)
MODELS = {
    # head_dim 64: a size every attention kernel (LMDeploy's included) supports
    'tiny': dict(vocab=None, hidden=256, layers=2, heads=4, initializer_range=0.15),
    # Qwen2.5-0.5B's shapes and vocabulary: 494M parameters
    'qwen2-0.5b': dict(vocab=QWEN2_0_5B['vocab_size'], hidden=QWEN2_0_5B['hidden_size'],
                       layers=QWEN2_0_5B['num_hidden_layers'],
                       heads=QWEN2_0_5B['num_attention_heads'],
                       kv_heads=QWEN2_0_5B['num_key_value_heads'],
                       intermediate=QWEN2_0_5B['intermediate_size'], initializer_range=0.08),
}
# the same 24 layers over the character vocabulary, for RL steps on the character tasks: with
# Qwen's 151936 ids a random policy samples almost only ids the tokenizer cannot spell, every
# response of a group scores alike and a step has nothing to learn (seen on an H100)
MODELS['qwen2-0.5b-layers'] = dict(MODELS['qwen2-0.5b'], vocab=None)


class ModelDirs(dict):
    """``{name: model directory}`` of :data:`MODELS`, each written on first use, in bf16
    (the dtype every check trains and serves in; fp32 references load the same values)."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __missing__(self, name: str) -> Path:
        kw = dict(MODELS[name])
        kw['vocab'] = kw['vocab'] or len(build_char_tokenizer())
        build_qwen2(self.root / name, **kw, dtype=torch.bfloat16)
        self[name] = self.root / name
        return self[name]


@pytest.fixture(scope='session')
def model_dirs(tmp_path_factory) -> ModelDirs:
    return ModelDirs(tmp_path_factory.mktemp('gpu_models'))


@pytest.fixture(scope='session')
def device() -> torch.device:
    torch.cuda.init()
    record('device', device_summary('cuda'))
    return torch.device('cuda')
