"""Runs that learn nothing say so, logs hold only what each step measured, resume is exact."""

import pytest

from .conftest import scalars, train, write_config
from .test_train import comparable


def test_a_run_without_signal_warns_and_logs_zero_advantage(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    proc = train(cfg, tmp_path / 'run', tiny_dir, 'train_cfg.max_steps=3',
                 'train_cfg.rewards.default.max_len=-1')  # every reward is 0
    out = proc.stdout + proc.stderr
    assert 'no learning signal for 3 steps' in out and 'num_responses' in out
    logged = scalars(tmp_path / 'run')
    assert all(logged[s]['adv/frac_zero'] == 1.0 for s in (1, 2, 3))
    assert any(k.startswith('adv/frac_zero/') for k in logged[1])  # per domain


def test_one_response_per_prompt_is_refused_before_training(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    proc = train(cfg, tmp_path / 'run', tiny_dir, 'train_cfg.num_responses=1', check=False)
    assert proc.returncode != 0
    assert 'set num_responses >= 2' in proc.stderr + proc.stdout


def test_a_renamed_train_cfg_key_is_refused_with_its_new_name(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    proc = train(cfg, tmp_path / 'run', tiny_dir, 'train_cfg.minibatch_size=8', check=False)
    assert proc.returncode != 0
    assert ("got an unexpected keyword argument 'minibatch_size' (train_cfg.minibatch_size was "
            'renamed: use train_cfg.minibatch_responses_per_rank)') in proc.stderr + proc.stdout
    assert not (tmp_path / 'run' / 'iter_1.pth').exists()


def test_unknown_train_cfg_keys_are_named_with_what_was_meant():
    from gepo_xtuner.engine.loop import RLTrainLoop
    RLTrainLoop.check_keys(['max_steps', 'minibatch_responses_per_rank', 'type'])  # accepted
    with pytest.raises(TypeError, match=r"arguments 'num_response', 'zzz' \(did you mean "
                                        r'train_cfg.num_responses\?\)$'):
        RLTrainLoop.check_keys(['num_response', 'zzz'])
    with pytest.raises(TypeError, match='use train_cfg.minibatch_responses_per_rank'):
        RLTrainLoop(None, None, max_steps=1, rollout={}, advantage={}, rewards={},
                    minibatch_size=8)  # refused before anything is built


def test_validation_is_logged_only_when_it_ran_and_resume_with_more_steps_is_exact(
        tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    full, short, resumed = tmp_path / 'full', tmp_path / 'short', tmp_path / 'resumed'
    every3 = 'train_cfg.val.interval=3'
    train(cfg, full, tiny_dir, 'train_cfg.max_steps=4', every3)
    a = scalars(full)
    assert [s for s in sorted(a) if 'val/acc' in a[s]] == [0, 3, 4]  # never a stale value
    # the short run validates at its last step (2), which the full run does not do
    train(cfg, short, tiny_dir, 'train_cfg.max_steps=2', every3)
    assert 'val/acc' in scalars(short)[2]
    train(cfg, resumed, tiny_dir, 'train_cfg.max_steps=4', every3, '--resume',
          str(short / 'iter_2.pth'))
    b = scalars(resumed)
    for step in (3, 4):
        assert comparable(a[step]) == comparable(b[step]), step


def test_a_tokenizer_without_pad_token_pads_with_eos(tiny_dir, tmp_path):
    import shutil

    from gepo_xtuner.model.policy import RLPolicy
    from gepo_xtuner.rollout import HFRolloutBackend, RolloutRequest, SamplingParams
    model = tmp_path / 'model'
    shutil.copytree(tiny_dir / 'model', model)
    policy = RLPolicy(pretrained=str(model), policy_loss=dict(type='CISPOLoss'))
    policy.tokenizer.pad_token = None  # as Llama-family tokenizers ship
    policy.tokenizer.save_pretrained(model)
    policy = RLPolicy(pretrained=str(model), policy_loss=dict(type='CISPOLoss'))
    tok = policy.tokenizer
    assert tok.pad_token == tok.eos_token
    backend = HFRolloutBackend()
    backend.attach(policy.llm, tok)
    out = backend.generate([RolloutRequest(tok('1+2=')['input_ids'])],
                           SamplingParams(n=2, max_new_tokens=4, stop_token_ids=(tok.eos_token_id, )))
    assert len(out[0]) == 2
    with pytest.raises(ValueError, match='not in the tokenizer vocabulary'):
        RLPolicy(pretrained=str(model), policy_loss=dict(type='CISPOLoss'), pad_token='<nope>')
