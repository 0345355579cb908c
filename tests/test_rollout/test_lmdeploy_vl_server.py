"""RL steps with images through LMDeploy's own API server: the Intern-S1-shaped VLM.

``xtuner train`` (a process of its own, transformers 5 from the overlay of ``make
tf5-deps``) launches LMDeploy 0.18's ``api_server`` as shipped
(``tests/test_rollout/lmdeploy_cpu_engine.py``: ``serve()``, its ``/generate`` handler,
``VLAsyncEngine`` with LMDeploy's ``ImageEncoder`` and ``InternVL3VisionModel``
preprocessing) with a CPU stand-in for the PyTorch engine only (LMDeploy's needs CUDA).
The stand-in generates with the Hugging Face model from the ids and pixel tensors
LMDeploy's preprocessing built, after checking each image's tokens sit at the offset
LMDeploy gave it, and takes weight pushes over LMDeploy's weight-update-group endpoints
(gloo in place of NCCL) by the names the checkpoint files use, the names every engine's
loader reads from disk (LMDeploy 0.18's InternVL module also maps module names to them;
the stand-in takes only the checkpoint's).

So ``rollout/logprob_abs_diff`` (server logprobs against the trainer's on the prompt it
encoded itself) is at numerical noise only if the images reached the engine as the
trainer sees them, and stays there after the push of a step's update (vision tower
included). The negative control sends the old payload (the bare placeholder) and
measures the jump.
"""

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests import preloaded

from ..test_engine.conftest import scalars

ROOT = Path(__file__).resolve().parents[2]
SERVER_COMMAND = [sys.executable, '-m', 'tests.test_rollout.lmdeploy_cpu_engine', '{model_path}',
                  '--server-name', '{host}', '--server-port', '{port}',
                  '--logprobs-mode', 'raw_logprobs', '--enable-abort-handling']


@pytest.fixture(scope='module')
def vlm(tf5_deps, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The tiny Intern-S1-shaped VLM, its picture tasks and the overlay's environment."""
    root = tmp_path_factory.mktemp('interns1')
    env = {k: v for k, v in os.environ.items() if k != 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD'}
    env.update(PYTHONPATH=os.pathsep.join([str(tf5_deps), str(ROOT)]), OMP_NUM_THREADS='1',
               GEPO_TINY_DIR=str(root / 'unused'))
    code = ('import sys; from gepo_xtuner.testbed.tiny_interns1 import *; '
            'save_tiny_interns1(sys.argv[1] + "/model", seed=0); '
            'build_interns1_picture_tasks(sys.argv[1] + "/data", 12, seed=0)')
    proc = preloaded.run([sys.executable, '-c', code, str(root)], env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, env


def _train(vlm, work: Path, backend: str, steps: int) -> dict:
    root, env = vlm
    cfg = work.with_suffix('.py')
    cfg.write_text(textwrap.dedent(f"""
        _base_ = ['{ROOT / 'configs' / 'gepo_tiny_cpu.py'}']
        custom_imports = dict(imports=['gepo_xtuner', 'tests.test_engine.plugins'],
                              allow_failed_imports=False)
        model = dict(_delete_=True, type='RLPolicy', pretrained='{root / 'model'}',
                     model_class='AutoModelForImageTextToText',
                     policy_loss=dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0))
        train_dataloader = dict(batch_size=4, dataset=dict(path='{root / 'data' / 'train.jsonl'}'))
        optim_wrapper = dict(optimizer=dict(lr=1e-2))  # updates the logprobs would show
        train_cfg = dict(
            max_steps={steps}, num_responses=4, minibatch_responses_per_rank=8,
            max_tokens_per_micro_batch=400, val=None, sampling=dict(max_new_tokens=6),
            rewards=dict(default=dict(_delete_=True, type='ShortAnswerReward', max_len=5)),
            rollout=dict(_delete_=True, type='{backend}', max_retries=0, timeout_s=120,
                         launch=dict(model_path='{root / 'model'}', port=0,
                                     command={SERVER_COMMAND!r}, env=dict(OMP_NUM_THREADS='1'),
                                     log_file='{work}.server.log', startup_timeout_s=180),
                         weight_sync=dict(mode='nccl', backend='gloo', timeout_s=120)))
        default_hooks = dict(checkpoint=dict(interval={steps}))
    """))
    proc = preloaded.run([sys.executable, '-m', 'xtuner.tools.train', str(cfg),
                          '--work-dir', str(work)], env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    log = Path(f'{work}.server.log').read_text()
    assert 'CPU stand-in engine' in log and 'Traceback' not in log, log[-3000:]
    return scalars(work)


def test_image_steps_through_lmdeploys_api_server_score_at_noise(vlm, tmp_path):
    """Two RL steps (the second after a weight push of every tensor, vision tower and
    projector included, at a learning rate that moves the logprobs): the server's
    logprobs equal the trainer's to float32 noise."""
    logged = _train(vlm, tmp_path / 'run', 'LMDeployRolloutBackend', steps=2)
    for step in (1, 2):
        assert logged[step]['rollout/logprob_abs_diff'] < 1e-5, (step, logged[step])
    assert logged[1]['rollout/server/0/requests'] == 4 * 4
    assert logged[2]['ratio/max'] > 1.001 or logged[2]['ratio/min'] < 0.999  # weights moved


def test_the_old_payload_gives_the_engine_another_context(vlm, tmp_path):
    """The negative control: the bare ``<IMG_CONTEXT>`` form (what was sent before) makes
    LMDeploy's context lack ``<img>`` / ``</img>``, and the logprobs part."""
    logged = _train(vlm, tmp_path / 'run', 'BareImageIdsLMDeployBackend', steps=1)
    assert logged[1]['rollout/logprob_abs_diff'] > 1e-3, logged[1]
