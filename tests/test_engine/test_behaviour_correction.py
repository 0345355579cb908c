"""Behaviour correction through ``ppo_update`` on a real tiny Qwen2 policy.

``'none'`` must leave the update bit for bit as it was: it is compared with the update
composed from the step's public pieces exactly as ``ppo_update`` composed them before the
correction existed. ``'truncate'`` must change the update when the rollout's logprobs
differ from the recomputed ones, and only then; ``'mask'`` must take dropped tokens out
of the loss and the minibatch's denominators (a response with no kept token leaves the
sequence count, as rows an advantage processor removed do).
"""

import math

import pytest
import torch

from mmengine.optim import OptimWrapper

from gepo_xtuner.engine.step.batching import loss_inputs, micro_batches, minibatches
from gepo_xtuner.engine.step.optim_step import optimizer_step
from gepo_xtuner.engine.step.update import UpdateSettings, ppo_update
from gepo_xtuner.model.inputs import LossInputs
from gepo_xtuner.model.policy import RLPolicy
from tests.test_engine.test_accumulation import LOSSES, SAMPLING, make_batch, params

pytestmark = pytest.mark.usefixtures('one_thread')

SETTINGS = dict(minibatch_responses_per_rank=6, ppo_epochs=2, max_tokens_per_micro_batch=60,
                temperature=SAMPLING.temperature, norm_length=SAMPLING.max_new_tokens)


def build(model_dir, loss: dict):
    """The policy with plain SGD: no gradient clipping, which would hide a wrong
    denominator (a gradient scaled by a constant clips to the same step)."""
    torch.manual_seed(0)
    policy = RLPolicy(pretrained=str(model_dir), policy_loss=loss)
    return policy, OptimWrapper(torch.optim.SGD(policy.parameters(), lr=0.1))


def uncorrected_update(model, wrapper, batch, old, adv, settings: UpdateSettings) -> None:
    """``ppo_update`` (one rank, every row kept) as it ran before behaviour correction."""
    rows = torch.arange(len(batch))
    prompt_len, response_len = batch.lengths()
    for _ in range(settings.ppo_epochs):
        for minibatch in minibatches(rows, math.ceil(len(batch) /
                                                     settings.minibatch_responses_per_rank)):
            mask = batch.response_mask[minibatch]
            totals = torch.tensor([float(mask.sum()), float(mask.any(1).sum()),
                                   float(len(minibatch))], dtype=torch.float64)
            micro = micro_batches(minibatch, prompt_len, response_len,
                                  settings.max_tokens_per_micro_batch, model.packs)

            def part(m: torch.Tensor, totals: torch.Tensor = totals) -> LossInputs:
                return loss_inputs(batch, m, old, adv, totals, temperature=settings.temperature,
                                   norm_length=settings.norm_length)

            optimizer_step(model, wrapper, [part(m) for m in micro], loss_scale=1.0,
                           pad=lambda part=part: part(torch.arange(1)).without_tokens())


def run(tiny_dir, batch, old, adv, loss='ppo-seq-mean', keep=None, **settings):
    model, wrapper = build(tiny_dir / 'model', LOSSES[loss])
    torch.manual_seed(7)  # the minibatch shuffle
    metrics = ppo_update(model, wrapper, batch, old, adv, keep,
                         UpdateSettings(**{**SETTINGS, **settings}))
    return params(model), metrics


def test_none_is_bit_identical_to_the_update_before_the_correction(tiny_dir):
    batch, old, adv = make_batch(seed=3)
    model, wrapper = build(tiny_dir / 'model', LOSSES['ppo-seq-mean'])
    torch.manual_seed(7)
    uncorrected_update(model, wrapper, batch, old, adv, UpdateSettings(**SETTINGS))
    before = params(model)
    default, m_default = run(tiny_dir, batch, old, adv)
    none, m_none = run(tiny_dir, batch, old, adv, behaviour_correction='none', behaviour_cap=1.5,
                       behaviour_veto=None)
    for key in before:
        assert torch.equal(default[key], before[key]), key
        assert torch.equal(none[key], before[key]), key
    assert m_none == m_default and not any(k.startswith('offpolicy/') for k in m_none)
    first, _ = build(tiny_dir / 'model', LOSSES['ppo-seq-mean'])
    assert any(not torch.equal(first.llm.state_dict()[k], v) for k, v in before.items())


def test_truncate_changes_the_update_only_where_rollout_logprobs_differ(tiny_dir):
    batch, old, adv = make_batch(seed=3)  # old = rollout + 0.05 * noise
    none, _ = run(tiny_dir, batch, old, adv, loss='cispo-token-mean')
    truncated, metrics = run(tiny_dir, batch, old, adv, loss='cispo-token-mean',
                             behaviour_correction='truncate', behaviour_cap=1.05)
    assert any(not torch.equal(truncated[k], none[k]) for k in none)
    valid = batch.response_mask
    w = torch.exp(old - batch.rollout_logprobs)[valid]
    assert metrics['offpolicy/weight_mean'] == pytest.approx(float(w.mean()), rel=1e-6)
    assert metrics['offpolicy/weight_max'] == pytest.approx(float(w.max()), rel=1e-6)
    assert metrics['offpolicy/frac_truncated'] == pytest.approx(float((w > 1.05).float().mean()))
    assert 0 < metrics['offpolicy/frac_truncated'] < 1 and 'offpolicy/frac_masked' not in metrics
    # the rollout's logprobs equal to the recomputed ones: w = 1 exactly, the same update
    batch.rollout_logprobs = old.clone()
    same, metrics = run(tiny_dir, batch, old, adv, loss='cispo-token-mean',
                        behaviour_correction='truncate', behaviour_cap=1.05)
    baseline, _ = run(tiny_dir, batch, old, adv, loss='cispo-token-mean')
    assert all(torch.equal(same[k], baseline[k]) for k in baseline)
    assert metrics['offpolicy/weight_mean'] == 1.0 and metrics['offpolicy/frac_truncated'] == 0


ONE_STEP = dict(minibatch_responses_per_rank=12, ppo_epochs=1, max_tokens_per_micro_batch=None)


@pytest.mark.parametrize('mode', ['mask', 'sequence_mask', 'geometric_mask'])
@pytest.mark.parametrize('loss', ['ppo-seq-mean', 'cispo-token-mean'])
def test_mask_takes_dropped_rows_out_of_loss_and_denominators(tiny_dir, loss, mode):
    """Rows whose every token leaves [1/C, C] (so do their product and geometric mean)
    train like rows the processor removed."""
    batch, old, adv = make_batch(seed=4)
    drop = torch.tensor([1, 4, 5, 9])
    batch.rollout_logprobs = old.clone()
    batch.rollout_logprobs[drop] += 3.0  # w = e^-3 < 1/2: every token of these rows out
    one_step = dict(ONE_STEP, minibatch_responses_per_rank=len(batch))
    masked, metrics = run(tiny_dir, batch, old, adv, loss=loss, behaviour_correction=mode,
                          behaviour_cap=2.0, **one_step)
    keep = torch.ones(len(batch), dtype=torch.bool)
    keep[drop] = False
    removed, removed_metrics = run(tiny_dir, batch, old, adv, loss=loss, keep=keep, **one_step)
    torch.testing.assert_close(masked, removed, rtol=1e-5, atol=1e-6)
    assert metrics['loss/pg'] == pytest.approx(removed_metrics['loss/pg'], rel=1e-5, abs=1e-7)
    plain, _ = run(tiny_dir, batch, old, adv, loss=loss, **one_step)
    assert any(not torch.equal(plain[k], masked[k]) for k in plain)
    tokens = batch.response_mask
    if mode == 'mask':
        assert metrics['offpolicy/frac_masked'] == pytest.approx(
            float(tokens[drop].sum() / tokens.sum()))
    else:
        assert metrics['offpolicy/frac_seq_masked'] == pytest.approx(len(drop) / len(batch))
        assert metrics['offpolicy/seq_weight_max'] == 1.0 and 'offpolicy/frac_masked' not in metrics
    assert metrics['offpolicy/weight_max'] == 1.0


@pytest.mark.parametrize('mode', ['none', 'truncate', 'sequence_truncate', 'geometric_mask'])
def test_veto_takes_rows_with_one_bad_token_out_like_removed_rows(tiny_dir, mode):
    """One token with w = e^-10 < v vetoes its whole response, in every mode; elsewhere
    w = 1, so the correction changes nothing else and the update is that of the rows kept."""
    batch, old, adv = make_batch(seed=5)
    drop = torch.tensor([0, 3, 8])
    batch.rollout_logprobs = old.clone()
    last = batch.response_mask.sum(1) - 1
    batch.rollout_logprobs[drop, last[drop]] += 10.0
    vetoed, metrics = run(tiny_dir, batch, old, adv, loss='ppo-seq-mean',
                          behaviour_correction=mode, behaviour_veto=1e-4, **ONE_STEP)
    keep = torch.ones(len(batch), dtype=torch.bool)
    keep[drop] = False
    removed, removed_metrics = run(tiny_dir, batch, old, adv, loss='ppo-seq-mean', keep=keep,
                                   **ONE_STEP)
    torch.testing.assert_close(vetoed, removed, rtol=1e-5, atol=1e-6)
    assert metrics['loss/pg'] == pytest.approx(removed_metrics['loss/pg'], rel=1e-5, abs=1e-7)
    assert metrics['offpolicy/frac_vetoed'] == pytest.approx(len(drop) / len(batch))
    # a veto of 1e-5 lets e^-10 = 4.5e-5 through: the update of all rows, weights 1
    kept_all, metrics = run(tiny_dir, batch, old, adv, loss='ppo-seq-mean',
                            behaviour_correction='none', behaviour_veto=1e-5, **ONE_STEP)
    plain, _ = run(tiny_dir, batch, old, adv, loss='ppo-seq-mean', **ONE_STEP)
    torch.testing.assert_close(kept_all, plain, rtol=1e-5, atol=1e-6)
    assert metrics['offpolicy/frac_vetoed'] == 0
    assert any(not torch.equal(plain[k], vetoed[k]) for k in plain)


@pytest.mark.parametrize('mode', ['sequence_truncate', 'geometric_truncate'])
def test_sequence_truncate_weights_and_metrics_against_a_loop(tiny_dir, mode):
    """The logged W of the trained rows against a loop over responses; the update differs
    from the token-level one."""
    batch, old, adv = make_batch(seed=3)
    cap = 1.02
    corrected, metrics = run(tiny_dir, batch, old, adv, loss='cispo-token-mean',
                             behaviour_correction=mode, behaviour_cap=cap)
    token, _ = run(tiny_dir, batch, old, adv, loss='cispo-token-mean',
                   behaviour_correction='truncate', behaviour_cap=cap)
    assert any(not torch.equal(corrected[k], token[k]) for k in token)
    big = []
    for i in range(len(batch)):
        d = [float(old[i, t] - batch.rollout_logprobs[i, t])
             for t in range(batch.response_mask.shape[1]) if batch.response_mask[i, t]]
        big.append(math.exp(sum(d) / (len(d) if mode.startswith('geometric') else 1)))
    assert metrics['offpolicy/seq_weight_mean'] == pytest.approx(sum(big) / len(big), rel=1e-5)
    assert metrics['offpolicy/seq_weight_max'] == pytest.approx(max(big), rel=1e-5)
    assert metrics['offpolicy/frac_seq_truncated'] == pytest.approx(
        sum(b > cap for b in big) / len(big))
    assert 0 < metrics['offpolicy/frac_seq_truncated'] < 1


def test_settings_refuse_unknown_modes_and_caps():
    with pytest.raises(ValueError, match='train_cfg.behaviour_correction must be one of'):
        UpdateSettings(4, behaviour_correction='truncated')
    with pytest.raises(ValueError, match='train_cfg.behaviour_cap must be a real number in'):
        UpdateSettings(4, behaviour_correction='mask', behaviour_cap=0.5)
    assert UpdateSettings(4).behaviour_correction == 'none'
    assert UpdateSettings(4).behaviour_cap == 2.0
    with pytest.raises(ValueError, match='train_cfg.behaviour_veto must be a real number in'):
        UpdateSettings(4, behaviour_veto=1.0)
    assert UpdateSettings(4).behaviour_veto is None
    assert UpdateSettings(4, behaviour_correction='geometric_mask',
                          behaviour_veto=1e-4).behaviour_veto == 1e-4


def test_loss_inputs_carry_the_correction_and_padding_inputs_count_nothing():
    batch, old, adv = make_batch(seed=2)
    rows = torch.tensor([0, 5, 7])
    weights = torch.rand(old.shape)
    kept = batch.response_mask & (torch.rand(old.shape) < 0.5)
    totals = torch.tensor([3.0, 2.0, 3.0], dtype=torch.float64)
    inp = loss_inputs(batch, rows, old, adv, totals, temperature=1.0, norm_length=None,
                      behaviour_weights=weights, loss_mask=kept)
    width = inp.response_mask.shape[1]
    assert torch.equal(inp.behaviour_weights, weights[rows, :width])
    assert torch.equal(inp.counted_mask, kept[rows, :width])
    empty = inp.without_tokens()
    assert not empty.counted_mask.any() and not empty.response_mask.any()
    plain = loss_inputs(batch, rows, old, adv, totals, temperature=1.0, norm_length=None)
    assert plain.behaviour_weights is None and plain.loss_mask is None
    assert plain.counted_mask is plain.response_mask
