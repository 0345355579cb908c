"""What we send to and read from LMDeploy, checked against LMDeploy's own pydantic models."""

import base64
import io

import pytest
import torch
from lmdeploy.serve.openai.protocol import (
    GenerateReqInput,
    GenerateReqMetaOutput,
    GenerateReqOutput,
    UpdateParamsRequest,
)
from PIL import Image

from gepo_xtuner.rollout import LMDeployRolloutBackend, RolloutRequest, SamplingParams
from gepo_xtuner.rollout.lmdeploy.protocol import (
    LMDeployProtocolError,
    build_generate_payload,
    encode_image,
    parse_generate_response,
)
from gepo_xtuner.rollout.lmdeploy.server import SERVE_ENTRY, LMDeployServerProcess
from gepo_xtuner.rollout.lmdeploy.weights import (
    buckets,
    check_weight_sync,
    serialize_ipc,
)

PARAMS = [SamplingParams(), SamplingParams(n=4, temperature=0.0, max_new_tokens=7),
          SamplingParams(temperature=0.7, top_p=0.9, top_k=20, stop_token_ids=(2, 5))]


def _png(path):
    Image.new('RGB', (4, 3), (200, 10, 10)).save(path)
    return path


@pytest.mark.parametrize('params', PARAMS)
def test_generate_body_is_a_valid_generate_req_input(params):
    payload = build_generate_payload(RolloutRequest([1, 7, 9]), params)
    req = GenerateReqInput.model_validate(payload)
    # pydantic ignores unknown keys: every key must be a real field, kept as sent
    assert set(payload) <= set(GenerateReqInput.model_fields)
    assert req.model_dump(exclude_unset=True) == payload
    assert req.input_ids == [1, 7, 9] and req.max_tokens == params.max_new_tokens
    assert req.return_logprob is True and req.include_stop_str_in_output is True
    assert req.stream is False and req.prompt is None
    assert req.stop_token_ids == (list(params.stop_token_ids) or None)
    # fields that fall back to the model's generation_config.json when unset
    assert (req.temperature, req.top_p, req.top_k) == (params.temperature, params.top_p,
                                                       params.top_k)
    assert (req.repetition_penalty, req.min_p) == (1.0, 0.0)


@pytest.mark.parametrize('stops, server_stops, sent', [
    ((2,), (2,), None),  # only EOS ids the server adds itself: its template's words stay
    ((2,), (2, 9), None),
    ((2, 5), (2,), [2, 5]),  # another id: sent, and LMDeploy drops the template's words
    ((5,), (), [5]),
    ((), (2,), None),
])
def test_stop_ids_the_server_adds_itself_are_not_sent(stops, server_stops, sent):
    params = SamplingParams(stop_token_ids=stops)
    payload = build_generate_payload(RolloutRequest([1, 7]), params, server_stops)
    assert payload.get('stop_token_ids') == sent
    assert GenerateReqInput.model_validate(payload).stop_token_ids == sent


def test_images_become_image_data_that_lmdeploy_accepts(tmp_path):
    pil = Image.new('L', (2, 2), 128)
    images = [_png(tmp_path / 'a.png'), str(_png(tmp_path / 'b.png')), pil,
              'https://example.com/x.jpg', 'data:image/png;base64,AAAA', {'url': 'https://e/x'}]
    payload = build_generate_payload(RolloutRequest([3], images=images), SamplingParams())
    req = GenerateReqInput.model_validate(payload)
    data = req.image_data
    assert len(data) == 6 and data[3:] == images[3:]
    for uri, size in zip(data[:3], [(4, 3), (4, 3), (2, 2)]):
        assert uri.startswith('data:image/png;base64,')
        assert Image.open(io.BytesIO(base64.b64decode(uri.split(',', 1)[1]))).size == size
    with pytest.raises(FileNotFoundError, match='missing.png'):
        encode_image(tmp_path / 'missing.png')
    with pytest.raises(TypeError, match='int'):
        encode_image(3)


def test_extra_fields_pass_through_but_not_over_ours():
    payload = build_generate_payload(
        RolloutRequest([3], extra={'mm_processor_kwargs': {'max_pixels': 64}}), SamplingParams())
    assert GenerateReqInput.model_validate(payload).mm_processor_kwargs == {'max_pixels': 64}
    with pytest.raises(ValueError, match='return_logprob'):
        build_generate_payload(RolloutRequest([3], extra={'return_logprob': False}),
                               SamplingParams())
    with pytest.raises(ValueError, match=r'\[0, 2\]'):
        build_generate_payload(RolloutRequest([3]), SamplingParams(temperature=2.5))
    with pytest.raises(ValueError, match='empty'):
        build_generate_payload(RolloutRequest([]), SamplingParams())


def _response(ids, logprobs=None, finish='stop', logprob_ids=None) -> dict:
    """A /generate answer built with LMDeploy's models, as its server serialises it."""
    pairs = None if logprobs is None else list(zip(logprobs, logprob_ids or ids))
    meta = GenerateReqMetaOutput(prompt_tokens=3, completion_tokens=len(ids),
                                 finish_reason=None if finish is None else {'type': finish},
                                 output_token_logprobs=pairs)
    return GenerateReqOutput(text='x', output_ids=ids, meta_info=meta).model_dump(mode='json')


def test_parse_generate_response():
    sample = parse_generate_response(_response([5, 6, 2], [-0.5, -1.25, -0.0]))
    assert sample.response_ids == [5, 6, 2] and sample.logprobs == [-0.5, -1.25, -0.0]
    assert sample.finish_reason == 'stop'
    assert parse_generate_response(_response([5], [-1.0], 'length')).finish_reason == 'length'


@pytest.mark.parametrize('body, match', [
    (_response([5, 6], None), '--logprobs-mode raw_logprobs'),
    (_response([5, 6], [-1.0, -2.0], logprob_ids=[5, 7]), 'do not match output_ids'),
    (_response([5, 6], [-1.0]), 'do not match'),
    (_response([5, 6], [3.5, -2.0]), 'raw_logits'),
    (_response([5, 6], [-1.0, -2.0], 'abort'), "'abort'"),
    (_response([5, 6], [-1.0, -2.0], None), 'None'),
    (_response([], []), 'empty'),
    ({'detail': 'nope'}, 'not a /generate response'),
])
def test_parse_rejects_what_training_cannot_use(body, match):
    with pytest.raises(LMDeployProtocolError, match=match):
        parse_generate_response(body)


def test_ipc_body_is_a_valid_update_params_request():
    """Only the body's shape can be checked on CPU (the handles are CUDA-only)."""
    named = [('a', torch.zeros(3)), ('b', torch.ones(2, 2))]
    body = {'serialized_named_tensors': serialize_ipc(named), 'finished': True}
    req = UpdateParamsRequest.model_validate(body)
    assert req.finished and req.load_format is None
    assert [len(b) for b in buckets(iter(named), bucket_bytes=12)] == [1, 1]
    assert [len(b) for b in buckets(iter(named), bucket_bytes=1 << 20)] == [2]


def test_default_launch_command_parses_with_lmdeploys_cli():
    from lmdeploy.cli.cli import CLI
    from lmdeploy.cli.serve import SubCliServe
    server = LMDeployServerProcess(model_path='/models/qwen', port=24000, tp=2,
                                   python='/envs/lmd/bin/python', extra_args=['--session-len',
                                                                              '4096'])
    argv = server.argv()
    assert argv[:4] == ['/envs/lmd/bin/python', SERVE_ENTRY, 'serve', 'api_server']
    SubCliServe.add_parsers()
    args = CLI.parser.parse_args(argv[2:])
    assert (args.model_path, args.server_name, args.server_port) == ('/models/qwen',
                                                                     '127.0.0.1', 24000)
    assert (args.backend, args.tp, args.logprobs_mode) == ('pytorch', 2, 'raw_logprobs')
    assert args.session_len == 4096


@pytest.mark.parametrize('kwargs, match', [
    ({}, 'exactly one of server_url'),
    ({'server_url': 'http://h:1', 'launch': {'model_path': 'm'}}, 'exactly one'),
    ({'server_url': 'h:1'}, 'http://'),
    ({'launch': {'model_path': 'm', 'gpus': 2}}, 'gpus'),
    ({'launch': {'port': 1}}, 'model_path'),
    ({'server_url': 'http://h:1', 'weight_sync': {'mode': 'disk', 'shared_dir': 'd'}},
     'needs launch'),
    ({'server_url': 'http://h:1', 'weight_sync': {'mode': 'rsync'}}, 'mode in'),
    ({'server_url': 'http://h:1', 'weight_sync': {'mode': 'ipc', 'shared_dir': 'd'}},
     'does not take'),
    ({'launch': {'model_path': 'm'}, 'weight_sync': {'mode': 'disk'}}, 'shared_dir'),
    ({'launch': {'model_path': 'm', 'tp': 2}, 'weight_sync': {'mode': 'ipc'}}, 'tp=1'),
    ({'server_url': 'http://h:1', 'weight_sync': {'mode': 'ipc', 'dtype': 'int8'}}, 'dtype'),
    ({'server_url': 'http://h:1', 'max_concurrency': 0}, 'max_concurrency'),
    ({'server_url': 'http://h:1', 'server_max_batch_size': 0}, 'server_max_batch_size'),
])
def test_bad_configs_are_rejected_with_what_to_fix(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        LMDeployRolloutBackend(**kwargs)


def test_building_touches_no_network_or_disk(tmp_path):
    """Configs build without a server: no connection, no port, no log file."""
    backend = LMDeployRolloutBackend(launch={'model_path': 'm', 'port': 0,
                                             'log_file': str(tmp_path / 'log')},
                                     weight_sync={'mode': 'disk', 'shared_dir': str(tmp_path)})
    assert backend.server.port == 0 and not (tmp_path / 'log').exists()
    backend.close()  # nothing started: nothing to stop
    assert check_weight_sync(None) is None


def test_images_are_sent_as_the_expanded_prompt_with_each_run_collapsed(tmp_path):
    """LMDeploy's /generate repeats each image token it is given; the body carries the
    trainer's expanded prompt with every run cut to one token, markers kept."""
    ctx, start, end = 9, 7, 8
    expanded = [1, 2, start, *[ctx] * 4, end, 3, start, *[ctx] * 12, end, 4]
    request = RolloutRequest([1, 2, ctx, 3, ctx, 4], images=[_png(tmp_path / 'a.png')] * 2,
                             model_input_ids=expanded, image_token_id=ctx)
    body = build_generate_payload(request, SamplingParams())
    assert body['input_ids'] == [1, 2, start, ctx, end, 3, start, ctx, end, 4]
    text = RolloutRequest([1, 2, 3], model_input_ids=[1, 2, 3], image_token_id=ctx)
    assert build_generate_payload(text, SamplingParams())['input_ids'] == [1, 2, 3]
    touching = RolloutRequest([ctx, ctx], images=['data:image/png;base64,AA'] * 2,
                              model_input_ids=[ctx] * 8, image_token_id=ctx)
    with pytest.raises(ValueError, match='1 runs of image token 9 for 2 images'):
        build_generate_payload(touching, SamplingParams())
    # an expanded prompt without its token cannot be rebuilt: no silent bare form
    unnamed = RolloutRequest([1, ctx, 2], images=['data:image/png;base64,AA'],
                             model_input_ids=[1, start, ctx, ctx, end, 2])
    with pytest.raises(ValueError, match='image_token_id is not set'):
        build_generate_payload(unnamed, SamplingParams())
