"""LMDeployRolloutBackend's failure handling, against LMDeployProtocolDouble (not LMDeploy).

What works is tested against LMDeploy's own server code (test_lmdeploy_real_server.py);
this file keeps what that server cannot be made to do on cue: answer 5xx, hang, die,
drop logprobs, and images (the tiny text policy has no vision path). The double answers
as LMDeploy's server does (test_protocol_double.py) and validates every body with
LMDeploy's pydantic models.
"""

import time

import pytest
import torch

from gepo_xtuner.rollout import (
    LMDeployRolloutBackend,
    LMDeployServerError,
    RolloutRequest,
    SamplingParams,
)
from gepo_xtuner.rollout.server.process import free_port

from .protocol_double import LMDeployProtocolDouble

PROMPTS = [[1, 14, 20, 33], [1, 9, 9], [1, 40, 41, 42, 43, 44], [1, 5]]


def _backend(url: str, **kwargs) -> LMDeployRolloutBackend:
    kwargs = {'max_retries': 2, 'backoff_s': 0.01, 'timeout_s': 30.0, **kwargs}
    return LMDeployRolloutBackend(server_url=url, **kwargs)


def _requests(prompts=PROMPTS) -> list[RolloutRequest]:
    return [RolloutRequest(list(p)) for p in prompts]


def test_many_requests_stay_within_max_concurrency_and_keep_order(double):
    prompts = [[1, 10 + i, 20 + i] for i in range(12)]
    params = SamplingParams(n=3, temperature=0.0, max_new_tokens=3)
    one_by_one = _backend(double.url, max_concurrency=1)
    expected = [one_by_one.generate(_requests([p]), params)[0] for p in prompts]
    one_by_one.close()
    assert double.max_in_flight == 1
    double.max_in_flight, double.delay_s = 0, 0.05
    backend = _backend(double.url, max_concurrency=4)
    got = backend.generate(_requests(prompts), params)
    backend.close()
    assert 2 <= double.max_in_flight <= 4  # parallel, and bounded
    assert [[s.response_ids for s in g] for g in got] == \
        [[s.response_ids for s in g] for g in expected]


def test_request_timeout_is_a_clear_error(double):
    double.delay_s = 2.0
    backend = _backend(double.url, timeout_s=0.3)
    backend.attach(None, None)  # health answers at once
    start = time.monotonic()
    with pytest.raises(LMDeployServerError, match=r'no answer within 0\.3 s') as err:
        backend.generate(_requests(PROMPTS[:1]), SamplingParams())
    assert time.monotonic() - start < 1.5 and double.url in str(err.value)
    assert double.generate_attempts == 1  # a timeout is not retried
    backend.close()


def test_5xx_is_retried_then_succeeds(double):
    double.fail_next = [503, 500]
    backend = _backend(double.url, max_retries=3)
    got = backend.generate(_requests(PROMPTS[:2]), SamplingParams(n=2, max_new_tokens=2))
    backend.close()
    assert sum(len(g) for g in got) == 4
    assert double.generate_attempts == 4 + 2


def test_5xx_gives_up_after_max_retries(double):
    double.fail_next = [503] * 10
    backend = _backend(double.url, max_retries=2)
    with pytest.raises(LMDeployServerError, match=r'failed 3 time\(s\), last: HTTP 503'):
        backend.generate(_requests(PROMPTS[:1]), SamplingParams())
    assert double.generate_attempts == 3
    backend.close()


def test_4xx_is_not_retried(double):
    double.fail_next = [400]
    backend = _backend(double.url, max_retries=3)
    with pytest.raises(LMDeployServerError, match='HTTP 400') as err:
        backend.generate(_requests(PROMPTS[:1]), SamplingParams())
    assert double.generate_attempts == 1 and double.url in str(err.value)
    backend.close()


def test_dead_server_fails_fast_naming_the_address():
    url = f'http://127.0.0.1:{free_port()}'
    backend = _backend(url, max_retries=2, backoff_s=0.05)
    start = time.monotonic()
    with pytest.raises(LMDeployServerError, match='no healthy LMDeploy server') as err:
        backend.generate(_requests(), SamplingParams())
    assert time.monotonic() - start < 5 and url in str(err.value)
    assert '--logprobs-mode raw_logprobs' in str(err.value)  # how to start one


def test_server_dying_mid_run_says_what_to_check(tiny_model_dir):
    double = LMDeployProtocolDouble(str(tiny_model_dir)).start()
    backend = _backend(double.url, max_retries=1, backoff_s=0.05)
    backend.attach(None, None)
    double.stop()
    with pytest.raises(LMDeployServerError, match='failed 2 time') as err:
        backend.generate(_requests(PROMPTS[:1]), SamplingParams())
    assert f'curl {double.url}/health' in str(err.value)
    backend.close()


def test_answer_without_logprobs_is_explained(double):
    double.omit_logprobs = True
    backend = _backend(double.url)
    with pytest.raises(LMDeployServerError, match='--logprobs-mode raw_logprobs'):
        backend.generate(_requests(PROMPTS[:1]), SamplingParams())
    backend.close()


def test_images_reach_the_server_as_data_uris(double, tmp_path):
    from PIL import Image
    Image.new('RGB', (3, 3)).save(tmp_path / 'x.png')
    backend = _backend(double.url)
    got = backend.generate([RolloutRequest([1, 3], images=[tmp_path / 'x.png'])],
                           SamplingParams(max_new_tokens=2))
    backend.close()
    assert len(got[0][0].response_ids) >= 1
    assert double.bodies[0].image_data[0].startswith('data:image/png;base64,')


def test_update_weights_needs_a_weight_sync_mode(double):
    backend = _backend(double.url)
    with pytest.raises(LMDeployServerError, match="mode='none'"):
        backend.update_weights(torch.nn.Linear(2, 2))
    _backend(double.url, weight_sync={'mode': 'none'}).update_weights(torch.nn.Linear(2, 2))
    backend.close()
