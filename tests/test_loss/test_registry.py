"""Building the policy losses from pure-dict configs through POLICY_LOSSES."""

import pytest
import torch
from mmengine.registry import MODELS

import gepo_xtuner.loss  # noqa: F401  (registers the losses)
from gepo_xtuner.loss import CISPOLoss, ClipCovLoss, KLCovLoss, PPOClipLoss
from gepo_xtuner.registry import POLICY_LOSSES

CONFIGS = [
    (dict(type='PPOClipLoss', clip_low=0.2, clip_high=0.28, dual_clip=3.0),
     PPOClipLoss, dict(clip_high=0.28, dual_clip=3.0)),
    (dict(type='CISPOLoss', eps_high=2.0), CISPOLoss, dict(eps_low=1.0, eps_high=2.0)),
    (dict(type='ClipCovLoss', clip_cov_ratio=1e-3, importance='cispo', seed=7),
     ClipCovLoss, dict(clip_cov_ratio=1e-3, importance='cispo', seed=7)),
    (dict(type='KLCovLoss', kl_cov_ratio=2e-4, agg='seq-mean-token-mean'),
     KLCovLoss, dict(kl_cov_ratio=2e-4, ppo_kl_coef=1.0, agg='seq-mean-token-mean')),
]


@pytest.mark.parametrize('cfg,cls,attrs', CONFIGS)
def test_build_from_config(cfg, cls, attrs):
    fn = POLICY_LOSSES.build(cfg)
    assert type(fn) is cls
    for name, value in attrs.items():
        assert getattr(fn, name) == value
    lp = torch.randn(2, 3, requires_grad=True)
    loss, metrics = fn(lp, lp.detach() + 0.1, torch.randn(2), torch.ones(2, 3))
    loss.backward()
    assert loss.dim() == 0 and lp.grad is not None
    assert {'loss/pg', 'ratio/mean', 'ratio/max', 'ratio/min', 'loss/approx_kl'} <= set(metrics)


def test_registered_names_equal_class_names():
    for cls in (PPOClipLoss, CISPOLoss, ClipCovLoss, KLCovLoss):
        assert POLICY_LOSSES.get(cls.__name__) is cls
        assert MODELS.build(dict(type=f'gepo_xtuner.{cls.__name__}')).__class__ is cls


@pytest.mark.parametrize('cfg,name', [
    (dict(type='PPOClipLoss', clip_low=1.5), 'clip_low'),
    (dict(type='PPOClipLoss', clip_high=-0.1), 'clip_high'),
    (dict(type='PPOClipLoss', dual_clip=0.9), 'dual_clip'),
    (dict(type='PPOClipLoss', agg='sum'), 'agg'),
    (dict(type='CISPOLoss', eps_high=-1.0), 'eps_high'),
    (dict(type='CISPOLoss', eps_low=float('nan')), 'eps_low'),
    (dict(type='CISPOLoss', eps_low=True), 'eps_low'),
    (dict(type='ClipCovLoss', clip_cov_ratio=1.5), 'clip_cov_ratio'),
    (dict(type='ClipCovLoss', clip_cov_lb=2.0, clip_cov_ub=1.0), 'clip_cov_ub'),
    (dict(type='ClipCovLoss', importance='softmax'), 'importance'),
    (dict(type='ClipCovLoss', seed=-1), 'seed'),
    (dict(type='ClipCovLoss', seed=1.5), 'seed'),
    (dict(type='KLCovLoss', kl_cov_ratio=-0.1), 'kl_cov_ratio'),
    (dict(type='KLCovLoss', ppo_kl_coef='1'), 'ppo_kl_coef'),
    (dict(type='KLCovLoss', importance='cispo', eps_high=-2), 'eps_high'),
])
def test_invalid_parameter_names_itself(cfg, name):
    bad = repr(next(v for k, v in cfg.items() if k == name))
    with pytest.raises(ValueError, match=name) as info:
        POLICY_LOSSES.build(cfg)
    assert bad in str(info.value)


def test_unknown_parameter_is_rejected():
    with pytest.raises(TypeError, match='clip_ratio'):
        POLICY_LOSSES.build(dict(type='PPOClipLoss', clip_ratio=0.2))
