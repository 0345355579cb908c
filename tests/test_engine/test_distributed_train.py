"""Two CPU processes through XTuner's own launcher (``NPROC_PER_NODE=2 xtuner train``)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import FAST, ROOT, free_port, scalars, write_config


def test_two_process_gloo_run_has_identical_thresholds_on_both_ranks(tmp_path, tiny_dir):
    bin_dir = Path(sys.executable).parent
    xtuner = shutil.which('xtuner', path=str(bin_dir)) or shutil.which('xtuner')
    assert xtuner, 'the xtuner console script is not installed'
    cfg = write_config(tmp_path, extra="""
        custom_hooks = [dict(type='TrainingCurvesHook'), dict(type='DumpAdvantageStateHook')]
    """)
    work = tmp_path / 'run'
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny_dir), PYTHONPATH=str(ROOT),
               NPROC_PER_NODE='2', PORT=str(free_port()), OMP_NUM_THREADS='1',
               PATH=f'{bin_dir}{os.pathsep}{os.environ.get("PATH", "")}')
    proc = subprocess.run([xtuner, 'train', str(cfg), '--work-dir', str(work), '--cfg-options',
                           *FAST, 'train_cfg.max_steps=3'], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=900)
    out = proc.stdout + proc.stderr
    # `xtuner train` exits 0 even when training fails: judge by what the run left behind
    assert (work / 'iter_2.pth').exists(), out[-6000:]
    rows = {r: [json.loads(x) for x in (work / f'state_rank{r}.jsonl').read_text().splitlines()]
            for r in (0, 1)}
    assert [x['step'] for x in rows[0]] == [1, 2, 3] == [x['step'] for x in rows[1]], out[-4000:]
    for a, b in zip(rows[0], rows[1]):
        assert a['world'] == b['world'] == 2
        assert a['state'] == b['state']  # bit-identical band on both ranks
        assert a['state']['num_updates'] == a['step']
    assert rows[0][0]['num_prompts'] == 4  # each rank drew its own batch of B prompts
    assert 'Iter(train) [3/3]' in out


def test_two_ranks_with_every_response_removed_take_no_step_and_agree(tmp_path, tiny_dir):
    """AEPO's gate removes all rows on both ranks: no optimizer step, on both ranks.

    ``entropy_low=0`` keeps the gate on and a reward that is always 0 leaves no
    response with positive advantage, so nothing is trained on: as with AEPO's
    authors (an empty kept batch gives no minibatch) neither rank steps (an AdamW
    step on a zero gradient would still move the weights by its momentum), the ranks
    agree on that without a hang, and the weights stay put.
    """
    bin_dir = Path(sys.executable).parent
    xtuner = shutil.which('xtuner', path=str(bin_dir)) or shutil.which('xtuner')
    cfg = write_config(tmp_path, extra="""
        train_cfg = dict(advantage=dict(_delete_=True, type='AEPOAdvantage', entropy_low=0.0))
    """)
    work = tmp_path / 'run'
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny_dir), PYTHONPATH=str(ROOT),
               NPROC_PER_NODE='2', PORT=str(free_port()), OMP_NUM_THREADS='1',
               PATH=f'{bin_dir}{os.pathsep}{os.environ.get("PATH", "")}')
    proc = subprocess.run([xtuner, 'train', str(cfg), '--work-dir', str(work), '--cfg-options',
                           *FAST, 'train_cfg.max_steps=2', 'train_cfg.rewards.default.max_len=-1'],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    out = proc.stdout + proc.stderr
    assert (work / 'iter_2.pth').exists(), out[-6000:]
    logged = scalars(work)
    for step in (1, 2):
        assert logged[step]['aepo/positive_only'] == 1.0
        assert logged[step]['optim/rows_trained'] == 0.0 and logged[step]['optim/steps'] == 0
    from safetensors.torch import load_file
    import torch
    before = load_file(tiny_dir / 'model' / 'model.safetensors')
    after = torch.load(work / 'iter_2.pth', map_location='cpu', weights_only=False)['state_dict']
    assert all(torch.equal(v, after['llm.' + k]) for k, v in before.items())
