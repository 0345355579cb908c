"""Generation one batch ahead of the update (``train_cfg.max_staleness=1``) with rollouts from
a real ``vllm serve`` (the session's, ``tests/conftest.py``), in a real ``xtuner train`` run
of the tiny policy: the same properties ``test_overlap.py`` shows for the in-process
backend, seen from outside the loop.

The run's backend (``RecordingVLLMRolloutBackend``) asks the server for its logprobs of a
fixed probe sequence at the start and at the end of every generation; the checkpoints give
the trainer's weights of every version, and the trainer's logprobs of the same probe name
the version the server held. So: step ``t``'s batch comes from the weights after step
``t - 2``, generated on the worker thread while step ``t - 1`` trained, and no push reached
the server during a generation (one version per batch, so per group).
"""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from .conftest import scalars, train, train_ranks, write_config
from .plugins import VLLM_PROBE

STEPS = 4


def probe(model) -> torch.Tensor:
    ids = torch.tensor([VLLM_PROBE])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]


@pytest.fixture(scope='module')
def overlapped(vllm_server, tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp('overlap_vllm')
    start = AutoModelForCausalLM.from_pretrained(tiny_dir / 'model', torch_dtype=torch.float32)
    # the session's server may hold other weights: the run's attach pushes its own first
    log = tmp / 'generate.log'
    cfg = write_config(tmp, extra=f"""
        train_cfg = dict(rollout=dict(_delete_=True, type='RecordingVLLMRolloutBackend',
                                      server_url='{vllm_server.url}',
                                      weight_sync=dict(mode='disk', probe_tolerance=1e-3)))
    """)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('GEPO_TEST_GENERATE_LOG', str(log))
        train(cfg, tmp / 'run', tiny_dir, 'train_cfg.max_staleness=1',
              f'train_cfg.max_steps={STEPS}', 'train_cfg.rewards.default.type=DigitShareReward',
              'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=-1')
    return tmp / 'run', log, start


def test_each_batch_comes_from_one_version_one_step_old(overlapped):
    work, log, model = overlapped
    rows = [json.loads(line) for line in open(f'{log}.0') if json.loads(line)['seeded']]
    assert len(rows) == STEPS
    versions = [probe(model)]
    for k in range(1, STEPS + 1):
        state = torch.load(work / f'iter_{k}.pth', map_location='cpu',
                           weights_only=False)['state_dict']
        model.load_state_dict({n.removeprefix('llm.'): v for n, v in state.items()
                               if n.startswith('llm.')})
        versions.append(probe(model))
    for t, row in enumerate(rows, start=1):
        before, after = torch.tensor(row['before']), torch.tensor(row['after'])
        assert torch.equal(before, after), t  # no push reached the server mid-generation
        gaps = [(before - v).abs().max().item() for v in versions]
        held = max(t - 2, 0)
        assert gaps[held] < 1e-4, (t, gaps)  # the server held the weights after step t-2 ...
        assert all(g > 1e-3 for k, g in enumerate(gaps) if k != held), (t, gaps)  # only those
        assert row['thread'] == ('MainThread' if t == 1 else f'rollout-ahead-{t - 1}')
    logged = scalars(work)
    assert [logged[t]['rollout/staleness'] for t in range(1, STEPS + 1)] == [0, 1, 1, 1]
    assert all(logged[t]['rollout/probe_abs_diff'] < 1e-4 for t in range(1, STEPS + 1))
    # the engine's logprobs are the trainer's up to float32 rounding when fresh (step 1) and
    # those of the older weights once stale
    assert logged[1]['rollout/logprob_abs_diff'] < 1e-5
    assert all(logged[t]['rollout/logprob_abs_diff'] > 1e-4 for t in range(2, STEPS + 1))


def test_two_ranks_never_meet_a_push_mid_generation(vllm_server, tiny_dir, tmp_path,
                                                    monkeypatch):
    """Two gloo ranks generating ahead against one server, rank 1 a second slower per batch
    than rank 0: rank 0 pushes only once every rank has finished generating (the backend
    waits for all ranks before a push), so on both ranks every batch comes from one weight
    version, and no batch is more than one old. (Without that wait rank 0 pushed into rank
    1's generations.)"""
    log = tmp_path / 'generate.log'
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(log))
    monkeypatch.setenv('GEPO_TEST_SLOW_RANK', '1')
    cfg = write_config(tmp_path, extra=f"""
        train_cfg = dict(rollout=dict(_delete_=True, type='RecordingVLLMRolloutBackend',
                                      server_url='{vllm_server.url}',
                                      weight_sync=dict(mode='disk')))
    """)
    train_ranks(cfg, tmp_path / 'run', tiny_dir, 2, 'train_cfg.max_staleness=1',
                f'train_cfg.max_steps={STEPS}')
    for rank in (0, 1):
        rows = [json.loads(line) for line in open(f'{log}.{rank}')
                if json.loads(line)['seeded']]
        assert len(rows) == STEPS, rank
        assert all(row['before'] == row['after'] for row in rows), rank
    logged = scalars(tmp_path / 'run')
    assert all(logged[t]['rollout/staleness_max'] <= 1 for t in range(1, STEPS + 1))
