"""RLPolicy's KL penalty to a frozen copy of its initial weights, on a real tiny model."""

import pytest
import torch

from gepo_xtuner.model.policy import RLPolicy
from gepo_xtuner.testbed.tiny import build_char_tokenizer, build_tiny_model

LOSS = dict(type='CISPOLoss', eps_low=1.0, eps_high=4.0)


@pytest.fixture(scope='module')
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp('tiny_policy')
    tok = build_char_tokenizer()
    build_tiny_model(len(tok), seed=3).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def batch(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 40, (4, 9), generator=gen)
    mask = torch.ones(4, 5, dtype=torch.bool)
    mask[1, 3:] = False
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=mask,
                advantages=torch.tensor([1.0, -0.5, 0.25, -1.0]))


def with_old(policy: RLPolicy, inputs: dict) -> dict:
    old, _ = policy(inputs=inputs, mode='logprobs')
    return dict(inputs, old_logprobs=old)


def test_reference_is_frozen_and_not_in_the_module_tree(model_dir):
    policy = RLPolicy(model_dir, LOSS, kl_coef=0.5)
    plain = RLPolicy(model_dir, LOSS)
    assert policy.state_dict().keys() == plain.state_dict().keys()
    assert sum(p.numel() for p in policy.parameters()) == \
        sum(p.numel() for p in plain.parameters())
    assert plain._reference == ()  # kl_coef 0 loads no second model


def test_penalty_is_zero_at_the_start_and_adds_beta_times_kl_after_a_change(model_dir):
    policy = RLPolicy(model_dir, LOSS, kl_coef=0.5)
    plain = RLPolicy(model_dir, LOSS)
    inputs = with_old(plain, batch())
    out = policy(inputs=inputs, mode='loss')
    assert out['loss/kl_ref'] == 0
    torch.testing.assert_close(out['loss'], plain(inputs=inputs, mode='loss')['loss'])

    with torch.no_grad():  # move both policies away from the initial weights, identically
        for a, b in zip(policy.llm.parameters(), plain.llm.parameters()):
            noise = torch.randn_like(a) * 0.05
            a.add_(noise)
            b.add_(noise)
    out, base = policy(inputs=inputs, mode='loss'), plain(inputs=inputs, mode='loss')
    assert out['loss/kl_ref'] > 0
    torch.testing.assert_close(out['loss'], base['loss'] + 0.5 * out['loss/kl_ref'])


def test_kl_gradient_steps_reduce_the_kl(model_dir):
    policy = RLPolicy(model_dir, dict(LOSS), kl_coef=1.0)
    with torch.no_grad():
        for p in policy.llm.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    inputs = with_old(policy, batch(1))
    inputs['advantages'] = torch.zeros(4)  # only the penalty acts
    opt = torch.optim.SGD(policy.llm.parameters(), lr=0.05)
    kls = []
    for _ in range(5):
        out = policy(inputs=inputs, mode='loss')
        kls.append(float(out['loss/kl_ref']))
        opt.zero_grad()
        out['loss'].backward()
        opt.step()
    assert kls[-1] < kls[0]


def test_bad_kl_coef_is_refused(model_dir):
    with pytest.raises(ValueError, match='kl_coef must be a number >= 0'):
        RLPolicy(model_dir, LOSS, kl_coef=-0.1)
