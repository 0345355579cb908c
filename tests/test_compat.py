"""The xtuner-CLI resume shim acts only in xtuner's training process with --resume."""

import os

import pytest

from gepo_xtuner.compat import WEIGHTS_ONLY_ENV, allow_pickle_checkpoints_for_xtuner_resume

TRAIN = '/venv/lib/python3.11/site-packages/xtuner/tools/train.py'


@pytest.mark.parametrize('argv,expected', [
    ([TRAIN, 'cfg.py', '--resume', 'iter_2.pth'], True),
    ([TRAIN, 'cfg.py', '--resume=iter_2.pth'], True),
    ([TRAIN, 'cfg.py'], False),
    (['/usr/bin/pytest', '--resume', 'x'], False),
    ([], False),
])
def test_only_xtuner_train_with_resume(monkeypatch, argv, expected):
    # setenv first so that teardown removes what the call sets (a bare delenv of an absent
    # variable records nothing, and the variable would leak into later tests' subprocesses)
    monkeypatch.setenv(WEIGHTS_ONLY_ENV, 'unset')
    monkeypatch.delenv(WEIGHTS_ONLY_ENV)
    assert allow_pickle_checkpoints_for_xtuner_resume(argv) is expected
    assert (os.environ.get(WEIGHTS_ONLY_ENV) == '1') is expected
