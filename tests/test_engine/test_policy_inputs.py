"""Records the policy cannot read are refused before step 1: chat records without a chat
template, images that do not decode or are smaller than the processor's minimum; images
above its maximum are named in a warning. Chat ``messages`` as published train end to end.

The image checks run on the tiny Qwen2-VL processor (patch 14 x merge 2: 28 px minimum,
max_pixels 84 x 84) as transformers builds it.
"""

import json
import shutil

import pytest
from PIL import Image

from gepo_xtuner.engine.step.prompt_encoding import check_policy_inputs, encode_request
from gepo_xtuner.testbed.tiny_vl import build_vl_processor, build_vl_tokenizer

from .conftest import scalars, train, write_config


@pytest.fixture(scope='module')
def vl():
    tokenizer = build_vl_tokenizer()
    return tokenizer, build_vl_processor(tokenizer)


def image(path, width, height):
    Image.new('RGB', (width, height), (0, 90, 200)).save(path)
    return str(path)


def chat(rid: str, images: list[str]) -> dict:
    return {'id': rid, 'domain': 'chart', 'answer': '1', 'images': images,
            'messages': [{'role': 'user', 'content': 'How many squares?'}]}


def test_a_small_image_at_training_time_names_record_and_file(vl, tmp_path):
    small = image(tmp_path / 'small.png', 20, 20)
    with pytest.raises(ValueError) as info:
        encode_request(chat('s1', [small]), *vl)
    assert str(info.value).startswith(
        f"record 's1' (images ['{small}']): the processor refused it: height:20 or width:20 "
        'must be larger than factor:28; tools/check_data.py FILE --model MODEL_DIR names')


def test_bad_images_and_chat_records_are_refused_by_the_loops_check(vl, tmp_path):
    tokenizer, processor = vl
    ok, small = image(tmp_path / 'ok.png', 56, 56), image(tmp_path / 'small.png', 56, 10)
    broken = tmp_path / 'broken.png'
    broken.write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 20)
    huge = image(tmp_path / 'huge.png', 300, 200)
    sets = {'train': [chat('a', [ok]), chat('b', [small]), chat('c', [str(broken)])],
            'val': [chat('d', [huge])]}
    with pytest.raises(ValueError) as info:
        check_policy_inputs(sets, tokenizer, processor)
    lines = str(info.value).splitlines()
    assert lines[0] == 'records the policy cannot read:'
    assert lines[1].startswith(f"  train: record 'b': field 'images[0]': {small} is 56x10 px, "
                               'below the 28 px per side')
    assert lines[2].startswith(f"  train: record 'c': field 'images[0]': {broken} does not "
                               'decode as an image')
    warnings = check_policy_inputs({'val': sets['val']}, tokenizer, processor)
    assert warnings == [f"val: record 'd': field 'images[0]': {huge} is 300x200 px (0.1 M), "
                        "above the max_pixels 7056 of the policy's tokenizer and processor: it "
                        'is decoded and downscaled again on every step that draws it; resize it '
                        'once beforehand (to about 102x69 px) to save that time']
    plain = build_vl_tokenizer()
    plain.chat_template = None
    text_chat = {'id': 't', 'domain': 'd', 'messages': [{'role': 'user', 'content': 'hi'}]}
    with pytest.raises(ValueError, match="train: record 't': field 'messages': chat turns need "
                                         "a chat template, and the policy's tokenizer has none"):
        check_policy_inputs({'train': [text_chat]}, plain)
    assert check_policy_inputs({'train': [text_chat]}, tokenizer) == []


CHAT_ROWS = [{'messages': [{'role': 'system', 'content': 'Answer with a number.'},
                           {'role': 'user', 'content': f'{a}+{b}'}],
              'answer': str(a + b)} for a in range(1, 5) for b in range(1, 5)]


def test_chat_messages_as_published_train_or_are_refused_before_step_1(tmp_path, tiny_dir):
    data = tmp_path / 'chat.jsonl'
    data.write_text(''.join(json.dumps(r) + '\n' for r in CHAT_ROWS))
    cfg = write_config(tmp_path, extra=f"""
        train_dataloader = dict(dataset=dict(_delete_=True, type='PromptDataset', path='{data}',
                                             default_domain='math', required=['answer']))
        train_cfg = dict(rewards=dict(math=dict(type='MathReward')),
                         val=dict(_delete_=True, path='{data}', default_domain='math',
                                  interval=100))
    """)
    # the tiny character tokenizer has no chat template: refused before any rollout
    proc = train(cfg, tmp_path / 'refused', tiny_dir, 'train_cfg.max_steps=1', check=False)
    assert ("train_dataloader.dataset: record 'chat-1': field 'messages': chat turns need a chat "
            "template, and the policy's tokenizer has none") in proc.stdout + proc.stderr
    assert 1 not in scalars(tmp_path / 'refused')
    # the same data with a chat template: trains, scored by MathReward
    model = tmp_path / 'tiny'
    shutil.copytree(tiny_dir, model)
    config = json.loads((model / 'model' / 'tokenizer_config.json').read_text())
    config['chat_template'] = ("{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
                               '{% if add_generation_prompt %}={% endif %}')
    (model / 'model' / 'tokenizer_config.json').write_text(json.dumps(config))
    work = tmp_path / 'run'
    train(cfg, work, model, 'train_cfg.max_steps=1')
    logged = scalars(work)
    assert 'reward/mean/math' in logged[1] and logged[1]['reward/errors/math'] == 0
