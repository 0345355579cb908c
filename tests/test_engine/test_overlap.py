"""Generation one batch ahead of the update (``train_cfg.max_staleness=1``) in real
``xtuner train`` runs of the tiny CPU policy.

The rollout backend of these runs (``RecordingRolloutBackend``, the in-process backend
plus a log) records, for every generation, the thread it ran on and a fingerprint of the
weights it sampled with at its start and at its end; the checkpoints give the trainer's
weights of every version. So the tests see from outside the loop which weights produced
each batch: with ``max_staleness=1`` step ``t``'s batch comes from the weights after
step ``t - 2`` (one version old), generated on the worker thread while step ``t - 1``
trained, and no weights changed during any generation (one version per batch, so per
group); with ``max_staleness=0`` every batch comes from the current weights, on the main
thread. Resuming the overlapped run at every step (one and two ranks) gives the straight
run's metrics and final weights bit for bit.
"""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from .conftest import scalars, train, train_ranks, write_config
from .fingerprint import weights_fingerprint

STEPS = 4
OVERLAP = ['train_cfg.max_staleness=1', f'train_cfg.max_steps={STEPS}',
           'train_cfg.rollout.type=RecordingRolloutBackend',
           'train_cfg.rewards.default.type=DigitShareReward',  # signal in every group
           'default_hooks.checkpoint.interval=1', 'default_hooks.checkpoint.max_keep_ckpts=-1']


def generations(log, ranks: int = 1) -> list[list[dict]]:
    """Each rank's recorded generations of training batches (validation left out: it
    samples from the global RNG, training batches generated ahead from their own seed)."""
    return [[json.loads(line) for line in open(f'{log}.{r}')
             if json.loads(line)['seeded']] for r in range(ranks)]


def fingerprints(work, tiny_dir, steps: int) -> list[float]:
    """The fingerprint of the trainer's weights after 0..steps steps."""
    initial = AutoModelForCausalLM.from_pretrained(tiny_dir / 'model').state_dict()
    out = [weights_fingerprint(initial)]
    for k in range(1, steps + 1):
        state = torch.load(work / f'iter_{k}.pth', map_location='cpu',
                           weights_only=False)['state_dict']
        out.append(weights_fingerprint({n.removeprefix('llm.'): v for n, v in state.items()
                                        if n.startswith('llm.')}))
    return out


def learning(row: dict[str, float]) -> dict[str, float]:
    """A step's logged figures less the timings (NaN made comparable)."""
    return {k: ('nan' if isinstance(v, float) and math.isnan(v) else v)
            for k, v in row.items()
            if not k.startswith(('time/', 'perf/')) and k not in ('time', 'data_time')}


def weights(checkpoint) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, map_location='cpu', weights_only=False)['state_dict']


@pytest.fixture(scope='module')
def overlapped(tiny_dir, tmp_path_factory):
    """A straight 4-step run with max_staleness=1, a checkpoint after every step."""
    tmp = tmp_path_factory.mktemp('overlap')
    log = tmp / 'generate.log'
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv('GEPO_TEST_GENERATE_LOG', str(log))
        train(write_config(tmp), tmp / 'run', tiny_dir, *OVERLAP)
    return tmp / 'run', log


def test_each_batch_comes_from_one_version_one_step_old(overlapped, tiny_dir):
    work, log = overlapped
    [rows] = generations(log)
    assert len(rows) == STEPS
    versions = fingerprints(work, tiny_dir, STEPS)
    assert len(set(versions)) == STEPS + 1  # every step moved the weights
    for t, row in enumerate(rows, start=1):
        assert row['before'] == row['after'], t  # no push during a generation
        assert row['before'] == versions[max(t - 2, 0)], t  # the weights after step t-2
        assert row['thread'] == ('MainThread' if t == 1 else f'rollout-ahead-{t - 1}')
    logged = scalars(work)
    assert [logged[t]['rollout/staleness'] for t in range(1, STEPS + 1)] == [0, 1, 1, 1]
    assert all(logged[t]['rollout/staleness_max'] <= 1 for t in range(1, STEPS + 1))
    assert all(logged[t]['time/rollout_generate'] > 0 for t in range(1, STEPS + 1))
    # the behaviour weight corrects the stale steps (truncated at 2 by default)
    assert all(0 < logged[t]['offpolicy/weight_mean'] for t in range(2, STEPS + 1))
    # the trainer's recomputed logprobs differ from the sampling policy's once stale
    assert logged[1]['rollout/logprob_abs_diff'] < 1e-5
    assert all(logged[t]['rollout/logprob_abs_diff'] > 1e-4 for t in range(2, STEPS + 1))
    # each checkpoint carries the batch generated ahead, with its version
    for k in range(1, STEPS):
        ahead = torch.load(work / f'iter_{k}.pth', map_location='cpu', weights_only=False)[
            'gepo_xtuner/rl_loop']['ranks'][0]['rollout_ahead']
        assert (ahead['step'], ahead['version']) == (k, k - 1)
        assert len(ahead['samples']) == 4 and all(len(g) == 4 for g in ahead['samples'])
    assert torch.load(work / f'iter_{STEPS}.pth', map_location='cpu', weights_only=False)[
        'gepo_xtuner/rl_loop']['ranks'][0]['rollout_ahead'] is None  # nothing left to make


def test_the_band_reads_the_logprobs_the_config_names(overlapped, tiny_dir, tmp_path,
                                                      monkeypatch):
    """GEPO's batch statistics (``gepo/group_nll_mu``) come from the recomputed old
    logprobs by default and, with ``entropy_logprobs='behaviour'``, from the rollout's.
    Both runs sample the same batches from the same weights (step 2's from the starting
    weights): at step 1 the two sources agree up to float noise; at step 2 the default
    reads the weights after step 1, the behaviour setting the weights that sampled."""
    work, _ = overlapped
    proximal = scalars(work)
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(tmp_path / 'generate.log'))
    train(write_config(tmp_path), tmp_path / 'run', tiny_dir, *OVERLAP, 'train_cfg.max_steps=3',
          'train_cfg.entropy_logprobs=behaviour')
    behaviour = scalars(tmp_path / 'run')
    gap = [abs(behaviour[t]['gepo/group_nll_mu'] - proximal[t]['gepo/group_nll_mu'])
           for t in (1, 2)]
    assert gap[0] < 1e-5 < 1e-4 < gap[1], gap
    # the rollout's logprobs of step 2's batch are those of the starting weights
    assert abs(behaviour[2]['rollout/logprob_abs_diff']
               - proximal[2]['rollout/logprob_abs_diff']) < 1e-5


def test_a_sequence_level_correction_with_a_veto_runs_from_the_config(tiny_dir, tmp_path,
                                                                      monkeypatch):
    """``behaviour_correction='geometric_mask'`` with ``behaviour_veto`` from the config's
    flat keys: every step logs the per-response figures; at step 1 (generated in turn, so
    ``mu = pi_prox`` up to float noise) the weight is 1 and nothing is dropped."""
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(tmp_path / 'generate.log'))
    train(write_config(tmp_path), tmp_path / 'run', tiny_dir, *OVERLAP, 'train_cfg.max_steps=2',
          'train_cfg.behaviour_correction=geometric_mask', 'train_cfg.behaviour_veto=0.0001')
    logged = scalars(tmp_path / 'run')
    for t in (1, 2):
        assert {'offpolicy/seq_weight_mean', 'offpolicy/seq_weight_max',
                'offpolicy/frac_seq_masked', 'offpolicy/frac_vetoed'} <= set(logged[t]), t
        assert 'offpolicy/frac_masked' not in logged[t]
        assert 0 <= logged[t]['offpolicy/frac_vetoed'] <= 1
    assert logged[1]['offpolicy/seq_weight_mean'] == pytest.approx(1.0, abs=1e-4)
    assert logged[1]['offpolicy/frac_seq_masked'] == 0 == logged[1]['offpolicy/frac_vetoed']
    assert logged[2]['offpolicy/seq_weight_max'] > 1.0


def test_resumed_at_every_step_equals_the_straight_run(overlapped, tiny_dir, tmp_path,
                                                       monkeypatch):
    work, _ = overlapped
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(tmp_path / 'generate.log'))
    expected, final = scalars(work), weights(work / f'iter_{STEPS}.pth')
    cfg = write_config(tmp_path)
    for k in range(1, STEPS):
        resumed = tmp_path / f'resumed_at_{k}'
        train(cfg, resumed, tiny_dir, *OVERLAP, '--resume', str(work / f'iter_{k}.pth'))
        got = scalars(resumed)
        assert sorted(got) == list(range(k + 1, STEPS + 1)), (k, sorted(got))
        for step in got:
            assert learning(got[step]) == learning(expected[step]), (k, step)
        last = weights(resumed / f'iter_{STEPS}.pth')
        assert all(torch.equal(last[n], final[n]) for n in final), k


def test_a_kill_during_an_overlapped_step_loses_only_the_steps_in_flight(
        overlapped, tiny_dir, tmp_path, monkeypatch):
    """SIGKILL while a step trains and the next batch is generated: the last checkpoint
    loads, and the run resumed from it equals the straight run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from .conftest import FAST, ROOT
    work, _ = overlapped
    expected = scalars(work)
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(tmp_path / 'generate.log'))
    cfg, killed = write_config(tmp_path), tmp_path / 'killed'
    env = dict(os.environ, GEPO_TINY_DIR=str(tiny_dir), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, '-m', 'xtuner.tools.train', str(cfg), '--work-dir',
                             str(killed), '--cfg-options', *FAST, *OVERLAP],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                            cwd=ROOT)
    deadline = time.monotonic() + 300
    while not (killed / 'iter_2.pth').exists():  # step 3 trains, step 4 is generated
        assert proc.poll() is None and time.monotonic() < deadline, 'no checkpoint of step 2'
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    last = max(int(p.stem.split('_')[1]) for p in killed.glob('iter_*.pth'))
    assert last < STEPS, 'the run ended before the kill: nothing was in flight'
    train(cfg, killed, tiny_dir, *OVERLAP, '--resume', str(killed / f'iter_{last}.pth'))
    got = scalars(killed)
    for step in range(last + 1, STEPS + 1):
        assert learning(got[step]) == learning(expected[step]), (last, step)
    final = weights(work / f'iter_{STEPS}.pth')
    resumed = weights(killed / f'iter_{STEPS}.pth')
    assert all(torch.equal(resumed[n], final[n]) for n in final)


def test_two_ranks_resumed_at_every_step_equal_the_straight_run(tiny_dir, tmp_path,
                                                                monkeypatch):
    """Each rank generates ahead with its own seed and checkpoints its own batch."""
    log = tmp_path / 'generate.log'
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(log))
    cfg = write_config(tmp_path)
    options = [*OVERLAP, 'train_cfg.val=None', 'randomness.diff_rank_seed=True']
    straight = tmp_path / 'straight'
    out = train_ranks(cfg, straight, tiny_dir, 2, *options)
    assert (straight / f'iter_{STEPS}.pth').exists(), out[-6000:]
    ranks = generations(log, 2)
    assert [len(rows) for rows in ranks] == [STEPS, STEPS]
    assert all(r['before'] == r['after'] for rows in ranks for r in rows)
    # both ranks sampled each step with the same weights, into different responses
    assert [r['before'] for r in ranks[0]] == [r['before'] for r in ranks[1]]
    expected, final = scalars(straight), weights(straight / f'iter_{STEPS}.pth')
    assert [expected[t]['rollout/staleness'] for t in range(1, STEPS + 1)] == [0, 1, 1, 1]
    for k in range(1, STEPS):
        resumed = tmp_path / f'resumed_at_{k}'
        # resumed at 1: a checkpoint every 2 steps, so the batches ahead travel to rank 0
        # at step 2 only (and the last), not at step 3
        every = ['default_hooks.checkpoint.interval=2'] if k == 1 else []
        out = train_ranks(cfg, resumed, tiny_dir, 2, *options, *every,
                          '--resume', str(straight / f'iter_{k}.pth'))
        assert (resumed / f'iter_{STEPS}.pth').exists(), out[-6000:]
        got = scalars(resumed)
        for step in range(k + 1, STEPS + 1):
            assert learning(got[step]) == learning(expected[step]), (k, step)
        last = weights(resumed / f'iter_{STEPS}.pth')
        assert all(torch.equal(last[n], final[n]) for n in final), k
    # the batches ahead in the step-2 checkpoint written on that schedule are those of the
    # straight run's (written when every step was a checkpoint step), rank for rank
    assert not (tmp_path / 'resumed_at_1' / 'iter_3.pth').exists()
    ahead = [[entry['rollout_ahead'] for entry in torch.load(
        run / 'iter_2.pth', map_location='cpu', weights_only=False)['gepo_xtuner/rl_loop']['ranks']]
        for run in (tmp_path / 'resumed_at_1', straight)]
    assert [a['step'] for a in ahead[0]] == [2, 2]
    for mine, theirs in zip(*ahead):
        assert mine['prompt_ids'] == theirs['prompt_ids'] and mine['version'] == theirs['version']
        for g_mine, g_theirs in zip(mine['samples'], theirs['samples']):
            for (ids, lps, fin), (ids2, lps2, fin2) in zip(g_mine, g_theirs):
                assert torch.equal(ids, ids2) and torch.equal(lps, lps2) and fin == fin2


def test_without_staleness_every_batch_is_generated_now_on_the_main_thread(
        tiny_dir, tmp_path, monkeypatch):
    log = tmp_path / 'generate.log'
    monkeypatch.setenv('GEPO_TEST_GENERATE_LOG', str(log))
    work = tmp_path / 'run'
    train(write_config(tmp_path), work, tiny_dir, 'train_cfg.max_steps=2', 'train_cfg.val=None',
          'train_cfg.rollout.type=RecordingRolloutBackend', 'default_hooks.checkpoint.interval=1',
          'train_cfg.rewards.default.type=DigitShareReward')
    rows = [json.loads(line) for line in open(f'{log}.0')]
    assert [(r['thread'], r['seeded']) for r in rows] == [('MainThread', False)] * 2
    versions = fingerprints(work, tiny_dir, 2)
    assert [r['before'] for r in rows] == versions[:2]  # the current weights
    logged = scalars(work)
    assert not any(k.startswith(('rollout/staleness', 'offpolicy/')) for k in logged[2])


def test_the_colocated_lmdeploy_mode_refuses_to_overlap(tiny_dir, tmp_path):
    """With sleep/wake the server sleeps on the trainer's GPU while it trains."""
    cfg = write_config(tmp_path, extra="""
        train_cfg = dict(max_staleness=1, rollout=dict(
            _delete_=True, type='LMDeployRolloutBackend', server_url='http://127.0.0.1:9',
            weight_sync=dict(mode='ipc'), sleep_wake=True))
    """)
    proc = train(cfg, tmp_path / 'run', tiny_dir, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert 'max_staleness >= 1 needs a rollout backend that can generate while the trainer ' \
           "updates: weight_sync mode 'ipc' with sleep_wake=True" in out, out[-3000:]


def test_a_correction_from_raw_server_logprobs_at_another_temperature_is_refused(
        tiny_dir, tmp_path):
    """LMDeploy's logprobs are raw (temperature 1); sampled at 0.7, the behaviour weight
    would compare two distributions, so the loop refuses before it starts (and says which
    settings avoid it)."""
    cfg = write_config(tmp_path, extra="""
        train_cfg = dict(max_staleness=1, sampling=dict(temperature=0.7), rollout=dict(
            _delete_=True, type='LMDeployRolloutBackend', server_url='http://127.0.0.1:9',
            weight_sync=dict(mode='none')))
    """)
    proc = train(cfg, tmp_path / 'run', tiny_dir, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("train_cfg.behaviour_correction='truncate' read(s) the rollout's logprobs as those "
            'of the sampling distribution softmax(logits / 0.7), but the rollout backend '
            'reports them at temperature 1') in out, out[-3000:]
    assert not (tmp_path / 'run' / 'iter_1.pth').exists()
