"""``RunHealthHook`` in real ``xtuner train`` runs of the tiny CPU policy.

A reward that pays for short answers (the test plugins' ``ShortAnswerReward``) with a high
learning rate collapses response length within 10 steps, and the hook raises
``length_collapse`` at the step the logged lengths meet its condition; the same run with a
reward that pays for length raises nothing. A GEPO band the batch cannot reach
(``beta_low=50``) raises ``gepo_silent`` on the low side, and with ``action='stop'`` the
run checkpoints that step, draws its figure and exits with status 3; ``--resume`` from
that checkpoint continues with the hook's state (the alarm is not raised again). A rollout
backend whose weights are never updated raises ``rollout_mismatch``; pushed weights do not.
Validation that pays for the opposite of what training pays for raises
``reward_without_val``; validation scored like training does not. A policy driven to
determinism raises ``entropy_collapse``; a tight clip with two epochs per batch raises
``clip_saturated``. Started from that deterministic policy with a KL penalty to the
untrained, nearly uniform initial model (an entropy bonus), entropy climbs and raises
``entropy_runaway``; when it jumps within a few steps, every group lies above GEPO's slowly
following band with most of its answers failing, and ``gepo_saturated`` is raised. The
brevity run raises neither. Every alarm is checked against fresh checks replayed over the
run's logged rows (``replay``).
"""

import json
import re
import sys

import pytest

from gepo_xtuner.analysis.health import build_checks, next_active

from .conftest import ROOT, train, write_config
from tests import preloaded

FAST_RL = ['train_cfg.max_steps=10', 'train_cfg.val.interval=5',
           'optim_wrapper.optimizer.lr=0.003', 'default_hooks.checkpoint.interval=100']


def config(tmp_path, extra: str = ''):
    return write_config(tmp_path, extra="""
        custom_imports = dict(imports=['gepo_xtuner', 'tests.test_engine.plugins',
                                       'tests.test_engine.health_plugins'],
                              allow_failed_imports=False)
    """ + extra)


def events(output: str) -> list[tuple[int, str, str, str]]:
    """``(step, alarm, domain, message)`` of each console alarm line."""
    return [(int(s), a, d, m) for s, a, d, m in
            re.findall(r'health: step (\d+): (\w+) \[([\w/]+)\]: (.*)', output)]


def replay(history: list[dict]) -> list[tuple[int, str, str]]:
    """The alarms fresh checks raise over the logged rows (health metrics left out)."""
    checks, active, out = build_checks({}), set(), []
    for row in history:
        row = {k: v for k, v in row.items() if not k.startswith('health/') and v is not None}
        step = int(row['step'])
        active, new = next_active(active, [f for c in checks.values()
                                           for f in c.observe(step, row)], row)
        out += [(step, f.alarm, f.domain) for f in new]
    return out


def first_entropy_alarm(raised, alarm: str, history: list[dict]) -> list[float]:
    """The logged values, up to its step, of the metric the first ``alarm`` line names."""
    hits = [(s, m) for s, a, _, m in raised if a == alarm]
    assert hits, raised
    step, message = hits[0]
    key = re.match(r'(entropy/\w+/\w+) ', message).group(1)
    return [r[key] for r in history if key in r and r['step'] <= step]


@pytest.fixture(scope='module')
def brevity_run(tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp('brevity')
    proc = train(config(tmp), tmp / 'run', tiny_dir, *FAST_RL)
    return tmp / 'run', proc.stdout + proc.stderr


def test_length_collapse_at_the_step_the_lengths_meet_the_condition(brevity_run):
    work, output = brevity_run
    history = json.loads((work / 'training_curves.json').read_text())
    raised = events(output)
    collapse = [e for e in raised if e[1] == 'length_collapse']
    assert collapse, output[-3000:]
    step, _, domain, message = collapse[0]
    lengths = [(int(r['step']), r[f'response/length/{domain}']) for r in history
               if f'response/length/{domain}' in r]
    assert dict(lengths)[step] < 0.5 * max(v for s, v in lengths if s < step)
    assert f'reward/mean/{domain}' in message and f'val/{domain}/acc' in message
    # the hook raised exactly what its checks say about the logged rows, at those steps
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    row = next(r for r in history if r['step'] == step)
    assert row['health/length_collapse'] >= 1 and row[f'health/length_collapse/{domain}'] == 1
    scalars = [json.loads(line) for line in
               next(work.glob('*/vis_data/scalars.json')).read_text().splitlines()]
    assert any(s.get('health/length_collapse') for s in scalars if s['step'] == step)
    assert 'Run health: ' in output and f'step {step}: length_collapse [{domain}]' in output


def test_summarize_run_lists_the_alarms(brevity_run):
    work, _ = brevity_run
    proc = preloaded.run([sys.executable, str(ROOT / 'tools' / 'summarize_run.py'), str(work)],
                         capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r'alarms:.*\n.*length_collapse', proc.stdout), proc.stdout


def test_the_same_run_with_a_reward_that_pays_for_length_raises_nothing(tiny_dir, tmp_path):
    proc = train(config(tmp_path), tmp_path / 'run', tiny_dir, *FAST_RL,
                 'train_cfg.rewards.default.type=LongAnswerReward')
    output = proc.stdout + proc.stderr
    assert events(output) == [] and 'Run health: no alarm' in output, output[-3000:]


def test_unreachable_band_stops_with_a_resumable_checkpoint(tiny_dir, tmp_path):
    cfg = config(tmp_path, """
        default_hooks = dict(health=dict(action='stop', checks=dict(gepo=dict(silent_steps=3))))
        train_cfg = dict(advantage=dict(beta_low=50.0))
    """)
    work = tmp_path / 'run'
    proc = train(cfg, work, tiny_dir, *FAST_RL, 'optim_wrapper.optimizer.lr=0.0001', check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output[-4000:]
    raised = events(output)
    assert [(s, a) for s, a, _, _ in raised] == [(3, 'gepo_silent')], output[-3000:]
    assert 'side low' in raised[0][3] and 'band [' in raised[0][3]
    assert (work / 'iter_3.pth').is_file() and not (work / 'iter_4.pth').exists()
    history = json.loads((work / 'training_curves.json').read_text())  # end hooks ran
    assert history[-1]['step'] == 3 and history[-1]['health/gepo_silent'] == 1

    resumed = train(cfg, work, tiny_dir, *FAST_RL, 'optim_wrapper.optimizer.lr=0.0001',
                    'train_cfg.max_steps=4', 'default_hooks.health.action=warn',
                    '--resume', str(work / 'iter_3.pth'))
    out2 = resumed.stdout + resumed.stderr
    assert events(out2) == [], out2[-3000:]  # still silent at step 4: the same alarm, held
    assert 'step 3: gepo_silent [all]' in out2  # the summary keeps the checkpointed alarm


def test_weights_that_never_reach_the_rollout_engine_raise_rollout_mismatch(
        tiny_dir, tmp_path, brevity_run):
    proc = train(config(tmp_path), tmp_path / 'run', tiny_dir, *FAST_RL, 'train_cfg.max_steps=6',
                 'train_cfg.val=None', 'train_cfg.rollout.type=StaleWeightsRolloutBackend')
    history = json.loads((tmp_path / 'run' / 'training_curves.json').read_text())
    raised = events(proc.stdout + proc.stderr)
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    diffs = [r['rollout/logprob_abs_diff'] for r in history if r['step'] >= 1]
    # step 1 generates with the current weights; the trainer moves away from step 2 on
    expected = next(i + 1 for i in range(2, len(diffs)) if min(diffs[i - 2:i + 1]) > 0.1)
    assert ('rollout_mismatch', expected) in [(a, s) for s, a, _, _ in raised]
    # without the cause (weights pushed after every step) the two agree to float precision
    work, output = brevity_run
    same = json.loads((work / 'training_curves.json').read_text())
    assert max(r.get('rollout/logprob_abs_diff', 0) for r in same) < 1e-5
    assert 'rollout_mismatch' not in [a for _, a, _, _ in events(output)]


def test_validation_scored_differently_from_training_raises_reward_without_val(
        tiny_dir, tmp_path, brevity_run):
    """Training pays for short answers, validation (domain ``long``) for long ones: a
    reward hack in miniature, training reward up while validation goes down."""
    rows = [json.loads(line) for line in (tiny_dir / 'data' / 'val.jsonl').read_text().splitlines()]
    val = tmp_path / 'val_long.jsonl'
    val.write_text(''.join(json.dumps({**r, 'domain': 'long'}) + '\n' for r in rows))
    cfg = config(tmp_path, f"""
        train_cfg = dict(rewards=dict(long=dict(type='LongAnswerReward')),
                         val=dict(_delete_=True, path='{val}', interval=2, n=2,
                                  temperature=1.0))
    """)
    proc = train(cfg, tmp_path / 'run', tiny_dir, *FAST_RL, 'train_cfg.max_steps=12',
                 'train_cfg.val.interval=2')
    history = json.loads((tmp_path / 'run' / 'training_curves.json').read_text())
    raised = events(proc.stdout + proc.stderr)
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    hit = [(s, d) for s, a, d, _ in raised if a == 'reward_without_val']
    assert hit and hit[0][1] == 'all', raised
    vals = [r['val/acc'] for r in history if 'val/acc' in r and r['step'] <= hit[0][0]]
    assert vals[-1] <= vals[-4] - 0.05 and vals[-1] < vals[-2] < vals[-3] < vals[-4]
    # without the cause (validation scored like training) validation rises with the reward
    work, output = brevity_run
    assert 'reward_without_val' not in [a for _, a, _, _ in events(output)]


@pytest.fixture(scope='module')
def collapse_run(tiny_dir, tmp_path_factory):
    """Learning rate 0.01 without KL: the brevity reward makes the policy deterministic.

    Its last checkpoint (``iter_10.pth``) is the sharpened starting point of the
    entropy-runaway and GEPO-saturation runs.
    """
    tmp = tmp_path_factory.mktemp('collapse')
    proc = train(config(tmp), tmp / 'run', tiny_dir, *FAST_RL, 'train_cfg.val=None',
                 'optim_wrapper.optimizer.lr=0.01', 'model.kl_coef=0.0')
    return tmp / 'run', proc.stdout + proc.stderr


def test_a_policy_driven_to_determinism_raises_entropy_collapse(collapse_run):
    """Group entropy from about 4 nats to below 0.02 in under 10 steps."""
    work, output = collapse_run
    history = json.loads((work / 'training_curves.json').read_text())
    raised = events(output)
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    values = first_entropy_alarm(raised, 'entropy_collapse', history)
    assert sum(values[-3:]) / 3 < 0.1 * sum(values[:5]) / 5
    assert 'entropy_runaway' not in [a for _, a, _, _ in raised]


def test_a_tight_clip_with_two_epochs_per_batch_raises_clip_saturated(
        tiny_dir, tmp_path, brevity_run):
    proc = train(config(tmp_path), tmp_path / 'run', tiny_dir, *FAST_RL, 'train_cfg.val=None',
                 'train_cfg.max_steps=4', 'train_cfg.ppo_epochs=2',
                 'model.policy_loss.eps_low=0.02', 'model.policy_loss.eps_high=0.02')
    history = json.loads((tmp_path / 'run' / 'training_curves.json').read_text())
    raised = events(proc.stdout + proc.stderr)
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    fracs = [r['loss/clipfrac'] for r in history if r['step'] >= 1]
    expected = next(i + 1 for i in range(2, len(fracs)) if min(fracs[i - 2:i + 1]) > 0.2)
    assert ('clip_saturated', expected) in [(a, s) for s, a, _, _ in raised]
    # without the cause (one epoch, the config's CISPO bounds 1 / 4) nothing is clipped
    work, output = brevity_run
    assert 'clip_saturated' not in [a for _, a, _, _ in events(output)]


#: The runaway and saturation runs (from ``collapse_run``'s weights): a strong KL penalty to
#: the untrained model, no validation
SHARP_START = ['train_cfg.val=None', 'model.kl_coef=1.0']


def test_a_kl_pull_towards_a_uniform_reference_raises_entropy_runaway(
        tiny_dir, tmp_path, collapse_run, brevity_run):
    """The policy starts from the collapsed run's weights (``load_from``), nearly
    deterministic, while the KL reference is still the untrained initial model
    (``model.pretrained``), whose next-token distribution is nearly uniform over the 55
    tokens (about 4.0 nats of ln 55 = 4.007). Against a uniform reference,
    ``KL(pi || ref) = ln V - H(pi)``: the penalty is an entropy bonus, weighted
    ``kl_coef=1.0``, and the brevity reward, which the collapsed policy always earns,
    gives no signal at first to hold it back. At learning rate 5e-4 the group entropy of
    ``add`` and ``copy`` climbs from start levels of about 0.2-0.4 nats to above 1, and
    ``entropy_runaway`` is raised once the mean of a domain's last 3 values exceeds 3x
    that of its first 5.
    """
    start = collapse_run[0] / 'iter_10.pth'
    proc = train(config(tmp_path), tmp_path / 'run', tiny_dir, *FAST_RL, *SHARP_START,
                 f'load_from={start}', 'optim_wrapper.optimizer.lr=0.0005')
    history = json.loads((tmp_path / 'run' / 'training_curves.json').read_text())
    raised = events(proc.stdout + proc.stderr)
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    values = first_entropy_alarm(raised, 'entropy_runaway', history)
    start_level, now = sum(values[:5]) / 5, sum(values[-3:]) / 3
    assert start_level < 0.5 and now > 3 * start_level and now - start_level >= 0.1
    assert 'entropy_collapse' not in [a for _, a, _, _ in raised]
    # without the cause neither the brevity run nor the run that collapsed the policy
    # raises it
    for _, output in (brevity_run, collapse_run):
        assert 'entropy_runaway' not in [a for _, a, _, _ in events(output)]


def test_entropy_far_above_a_lagging_band_raises_gepo_saturated(
        tiny_dir, tmp_path, collapse_run, brevity_run):
    """The KL pull of the runaway test at learning rate 3e-3 with K=8 responses per
    prompt: entropy jumps from about 0.2 to 3 nats within two steps while GEPO's band,
    an EMA at gamma=0.01 anchored at the collapsed policy's entropy, stays below 0.6, so
    every group is above the band and has its negative advantages damped. The brevity
    reward fails all but one of most groups' eight (now long and random) answers, so
    about 80-90 % of the responses with signal are damped, above the default 0.7 on
    5 steps in a row (K=8: a group holds both signs, so 7/8 is the most possible).
    """
    start = collapse_run[0] / 'iter_10.pth'
    proc = train(config(tmp_path), tmp_path / 'run', tiny_dir, *FAST_RL, *SHARP_START,
                 f'load_from={start}', 'optim_wrapper.optimizer.lr=0.003',
                 'train_cfg.num_responses=8', 'train_cfg.minibatch_responses_per_rank=16')
    history = json.loads((tmp_path / 'run' / 'training_curves.json').read_text())
    raised = events(proc.stdout + proc.stderr)
    assert [(s, a, d) for s, a, d, _ in raised] == replay(history)
    hits = [(s, m) for s, a, _, m in raised if a == 'gepo_saturated']
    assert len(hits) == 1, raised  # held through steps without signal, not raised again
    step, message = hits[0]
    check = build_checks({})['gepo']
    # the steps GEPOBandActivity judges: a band and some signal; the damped share of those
    judged = [(int(r['step']), (r['shaping/frac_damped_pos'] + r['shaping/frac_damped_neg'])
               / (1 - r['adv/frac_zero']), r) for r in history
              if 'gepo/h_low' in r and r['step'] >= 1 and r['adv/frac_zero'] < 1]
    n = check.saturated_steps
    expected = next(i for i in range(n - 1, len(judged)) if all(
        share >= check.saturated_share for _, share, _ in judged[i - n + 1:i + 1]))
    assert step == judged[expected][0]
    for _, _, row in judged[expected - n + 1:expected + 1]:  # all damped above the band
        assert row['shaping/frac_damped_pos'] == 0
        assert row['entropy/group_nll_mean'] > row['gepo/h_high']
    assert 'of the responses with signal damped' in message and 'band [' in message
    assert next(r for r in history if r['step'] == step)['health/gepo_saturated'] == 1
    # without the cause nothing saturates: the brevity run (entropy falling below the band,
    # about half of the responses with signal winners), nor the run that collapsed the policy
    for _, output in (brevity_run, collapse_run):
        assert 'gepo_saturated' not in [a for _, a, _, _ in events(output)]
