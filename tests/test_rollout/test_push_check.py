"""The push check of the server backends (``rollout/server/probe.py``) and what attach says
about an address that is not the engine.

The verdicts are checked on numbers; the probe request against LMDeploy's own API server
(CPU stand-in engine); a reload that never reaches the engine is in
``test_lmdeploy_real_server.py`` (a server process told to ignore weight updates) and
``tests/test_vllm/test_server.py`` (a real vLLM server behind a proxy that drops the
reload call).
"""

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from lmdeploy.serve.openai.protocol import GenerateReqInput

from gepo_xtuner.rollout import LMDeployRolloutBackend, LMDeployServerError, VLLMServerError
from gepo_xtuner.rollout.lmdeploy.protocol import build_probe_payload
from gepo_xtuner.rollout.server.probe import (
    DEFAULT_TOLERANCE,
    MOVE_FLOOR,
    ProbeRecord,
    judge,
    max_abs_diff,
    probe_ids,
    trainer_logprobs,
)
from gepo_xtuner.rollout.vllm.backend import VLLMRolloutBackend

from .conftest import load_policy

BEFORE = [-4.0, -5.0, -6.0]
RECORD = ProbeRecord(trainer=BEFORE, server=[-4.001, -5.001, -6.001], version=3)


def test_a_push_of_new_weights_passes():
    now = [-3.9, -5.2, -6.0]
    answer = [-3.901, -5.201, -6.001]
    why, gap, record = judge(answer, now, RECORD, DEFAULT_TOLERANCE, version=4)
    assert why is None and gap == pytest.approx(1e-3)
    assert record == ProbeRecord(now, answer, 4)


def test_an_answer_that_did_not_change_while_the_trainer_moved_fails():
    """Within the tolerance (a bf16 server's rounding could be that large) and still a
    failed push: the server answers what it answered before the push."""
    now = [-4.0, -5.05, -6.0]
    why, gap, record = judge(RECORD.server, now, RECORD, DEFAULT_TOLERANCE, version=4)
    assert gap < DEFAULT_TOLERANCE and record is None
    assert 'the ones it gave for weight version 3' in why and 'moved by up to 0.05' in why
    assert 'did not reach the engine' in why


def test_a_push_of_the_same_weights_is_not_flagged_and_small_moves_add_up():
    why, _, record = judge(RECORD.server, BEFORE, RECORD, DEFAULT_TOLERANCE, version=4)
    assert why is None and record is RECORD
    small = [x + MOVE_FLOOR / 2 for x in BEFORE]  # below the floor: the record stays
    why, _, record = judge(RECORD.server, small, RECORD, DEFAULT_TOLERANCE, version=5)
    assert why is None and record is RECORD
    more = [x + MOVE_FLOOR * 2 for x in BEFORE]  # against the same record: now it shows
    why, _, _ = judge(RECORD.server, more, RECORD, DEFAULT_TOLERANCE, version=6)
    assert 'weight version 3' in why


def test_a_gap_beyond_the_tolerance_fails_and_says_how_far_the_old_weights_are():
    now = [-4.0, -5.0, -3.0]
    answer = [-4.0, -5.0, -6.0]
    why, gap, record = judge(answer, now, RECORD, 0.5, version=4)
    assert gap == 3.0 and record is None
    assert "differ from the trainer's by up to 3 (weight_sync.probe_tolerance=0.5)" in why
    assert "from the trainer's of weight version 3 by 0" in why
    why, _, _ = judge([float('nan')] * 3, now, None, 0.5, version=1)
    assert why is not None


@pytest.mark.parametrize('build, pushing', [
    (lambda ws: LMDeployRolloutBackend(server_url='http://a:1', weight_sync=ws), 'nccl'),
    (lambda ws: VLLMRolloutBackend(server_url='http://a:1', weight_sync=ws), 'disk')])
def test_a_probe_setting_with_mode_none_is_refused(build, pushing):
    with pytest.raises(ValueError, match=r"mode 'none' pushes no weights, so "
                                         r'probe_tolerance=0.01 would check nothing'):
        build(dict(mode='none', probe_tolerance=0.01))
    with pytest.raises(ValueError, match='probe_tolerance must be a positive number, or None'):
        build(dict(mode=pushing, probe_tolerance=-1))
    assert build(dict(mode='none')).probe_tolerance is None
    assert build(dict(mode=pushing, probe_tolerance=None)).probe_tolerance is None
    assert build(dict(mode=pushing)).probe_tolerance == DEFAULT_TOLERANCE


def test_the_probe_is_lmdeploys_own_scoring_request(real_server, tiny_model_dir):
    """LMDeploy's request model takes the probe body as sent; its server answers the
    trainer's logprobs of the probe (float32 on both sides: rounding only, the gap a
    correct push leaves on CPU), in one short request."""
    sent = GenerateReqInput(**build_probe_payload([3, 4, 5]))
    assert (sent.logprob_start_len, sent.max_tokens, sent.return_logprob) == (0, 0, True)
    model, tok = load_policy(tiny_model_dir)
    backend = LMDeployRolloutBackend(server_url=real_server.url, timeout_s=30,
                                     weight_sync=dict(mode='nccl'))
    assert backend.probe_tolerance == DEFAULT_TOLERANCE
    backend.attach(model, tok)  # records the server's answer for the starting weights
    record = backend._probe_records[0]
    ids = probe_ids(model.config.vocab_size)
    assert record.trainer == trainer_logprobs(model, ids)
    assert max_abs_diff(record.server, record.trainer) < 1e-5
    assert len(real_server.engine.requests) == 1  # one request for the check
    backend.close()


@pytest.fixture
def plain_http(tmp_path):
    """``python -m http.server`` on a free port, serving ``tmp_path``."""
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize('engine', [
    (LMDeployRolloutBackend, LMDeployServerError, 'LMDeploy'),
    (VLLMRolloutBackend, VLLMServerError, 'vLLM')])
def test_an_address_that_answers_but_is_not_the_engine_gets_a_hint(engine, plain_http,
                                                                   tmp_path):
    build, error, name = engine
    backend = build(server_url=plain_http, timeout_s=5, weight_sync=dict(mode='none'))
    with pytest.raises(error, match=r'(?s)HTTP 404.*no /health route: is server_url the '
                                    f"{name} server's address"):
        backend.attach(None, None)
    backend.close()
    (tmp_path / 'health').write_text('ok')  # now /health answers 200
    backend = build(server_url=plain_http, timeout_s=5, weight_sync=dict(mode='none'))
    with pytest.raises(error, match=r'/health answered 200 but /v1/models did not \(HTTP 404\): '
                                    f"is server_url the {name} server's address"):
        backend.attach(None, None)
    backend.close()
