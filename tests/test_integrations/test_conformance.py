"""GEPO's five paths give one answer: the same batch through this core, XTuner v1's
estimator, TRL's trainer mixin, verl's ``gepo`` estimator and slime's reward post-process.

The batch, each path's driver and the comparison are in ``conformance.py``. Here: slime
against the core, in this process. TRL, verl and XTuner v1 each need their own transformers:
the same :func:`conformance.check` runs inside the tests that already start a process in
their environments (``test_trl.py``'s process without the XTuner stack,
``verl_env/check_verl.py``, ``xtuner_v1_env/check_xtuner_v1.py``).
Every path must give the core's shaped advantages and band after every step, to 1e-6.
"""

from pathlib import Path

import torch

from . import conformance


def test_slime_gives_the_cores_advantages_and_band():
    conformance.check('slime')


def test_every_path_is_checked_somewhere():
    """Each of the five paths has its check: here, or in its environment's suite."""
    here = Path(__file__).parent
    checked = {'core', 'slime'}
    for path, suite in (('trl', 'test_trl.py'), ('verl', 'verl_env/check_verl.py'),
                        ('xtuner_v1', 'xtuner_v1_env/check_xtuner_v1.py')):
        if f"conformance.check('{path}')" in (here / suite).read_text():
            checked.add(path)
    assert checked == set(conformance.PATHS)


def test_the_batch_is_one_gepo_shapes():
    """The conformance batch exercises the method: both directions of shaping happen, a
    group of equal rewards gets zeros, and the band moves between steps."""
    from gepo_xtuner.advantage import AdvantageInputs, GRPOAdvantage
    batches = conformance.make_batches()
    out = conformance.through_core(batches)
    damped = {'pos': 0, 'neg': 0}
    for batch, result in zip(batches, out):
        base = GRPOAdvantage(eps=conformance.EPS)(AdvantageInputs(
            rewards=torch.tensor(batch['reward'], dtype=torch.float64),
            group_ids=conformance._group_ids(batch['uid']))).advantages
        shaped = torch.tensor(result['advantages'])
        changed = (shaped - base).abs() > 1e-6
        damped['pos'] += int((changed & (base > 0)).sum())
        damped['neg'] += int((changed & (base < 0)).sum())
        assert (shaped == 0).sum() >= conformance.K
    assert damped['pos'] and damped['neg'], damped
    assert len({round(r['band']['h_low'], 9) for r in out}) == conformance.STEPS
