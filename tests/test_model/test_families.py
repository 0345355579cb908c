"""What loading a policy needs (gepo_xtuner.model.families), per checkpoint and environment."""

import types

from gepo_xtuner.model.families import loading_problems, version_tuple
from gepo_xtuner.rollout.lmdeploy.server import LMDeployServerProcess, runs_remote_code
from gepo_xtuner.rollout.vllm.server import VLLMServerProcess

TF4 = dict(transformers_version='4.48.0',
           native_types=frozenset({'qwen2', 'qwen2_vl', 'llama'}))
TF5 = dict(transformers_version='5.23.0',
           native_types=frozenset({'qwen2', 'qwen2_vl', 'qwen3', 'qwen3_5', 'internvl'}))
INTERNS1 = dict(model_class='AutoModelForCausalLM', processor='/m', trust_remote_code=True)


def test_version_order():
    assert version_tuple('4.48.0') < version_tuple('4.53') < version_tuple('5.0')
    assert version_tuple('5.23.0.dev0') == (5, 23, 0) and version_tuple('4.57.1rc2') == (4, 57, 1)


def test_intern_s1_as_the_paper_configs_load_it():
    """On transformers 5 with its code allowed and its processor: nothing to fix; on the
    pinned 4.48 the version is the problem, with the overlay as the fix."""
    assert loading_problems(INTERNS1, 'interns1', {'auto_map': {'AutoConfig': 'x.C'}}, **TF5) == []
    [problem] = loading_problems(INTERNS1, 'interns1', None, **TF4)
    assert 'needs transformers >= 4.53' in problem and 'make tf5-deps' in problem


def test_each_missing_piece_is_named():
    no_trust = dict(INTERNS1, trust_remote_code=False)
    assert any('set model.trust_remote_code=True' in p
               for p in loading_problems(no_trust, 'interns1', None, **TF5))
    no_processor = {k: v for k, v in INTERNS1.items() if k != 'processor'}
    assert any('set model.processor' in p
               for p in loading_problems(no_processor, 'interns1', None, **TF5))
    # a native VLM loaded as a text model would refuse every image record
    [problem] = loading_problems({}, 'internvl', None, **TF5)
    assert "model.model_class='AutoModelForImageTextToText'" in problem
    assert loading_problems({'model_class': 'AutoModelForImageTextToText'}, 'internvl', None,
                            **TF5) == []
    # a type nobody knows, without shipped code
    [problem] = loading_problems({}, 'mystery', {'model_type': 'mystery'}, **TF5)
    assert 'does not know' in problem and 'no auto_map' in problem
    # any checkpoint with its own code needs the flag, known family or not
    [problem] = loading_problems({}, 'mystery', {'auto_map': {'AutoConfig': 'a.B'}}, **TF5)
    assert 'trust_remote_code=True' in problem
    assert loading_problems({}, 'qwen2', None, **TF4) == []


def test_a_launched_server_trusts_the_checkpoints_code_as_the_policy_does():
    """--trust-remote-code is passed when set, or (default) when the trainer's model is an
    instance of a checkpoint's own code (transformers imports it as transformers_modules)."""
    assert '--trust-remote-code' in LMDeployServerProcess('/m', trust_remote_code=True).argv()
    assert '--trust-remote-code' not in LMDeployServerProcess('/m').argv()
    assert '--trust-remote-code' in VLLMServerProcess('/m', trust_remote_code=True).argv()
    remote = type('InternS1ForConditionalGeneration', (), {'__module__':
                  'transformers_modules.Intern_hyphen_S1_hyphen_mini.modeling_interns1'})
    assert runs_remote_code(remote()) and not runs_remote_code(types.SimpleNamespace())
