"""The tiny Qwen2-VL builders: tokenizer, processor, model, pictures and picture tasks."""

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from gepo_xtuner.data import load_records
from gepo_xtuner.testbed.tiny_vl import (
    COLOURS,
    IMAGE_PAD,
    VL_ALPHABET,
    build_picture_tasks,
    build_tiny_vl_model,
    build_vl_processor,
    build_vl_tokenizer,
    draw_squares,
    save_tiny_vl,
)


def test_tokenizer_round_trips_text_and_keeps_special_tokens_whole():
    tok = build_vl_tokenizer()
    text = 'what colour is the square?\nred 3'
    ids = tok(text)['input_ids']
    assert len(ids) == len(text) and tok.decode(ids) == text  # one id per character, no BOS
    assert set(VL_ALPHABET) <= set(tok.get_vocab())
    special = tok('<|vision_start|><|image_pad|><|vision_end|>')['input_ids']
    assert len(special) == 3 and tok.convert_tokens_to_ids(IMAGE_PAD) in special
    assert tok.eos_token == '<|im_end|>' and tok.padding_side == 'left'
    assert tok.decode(tok('ab<|im_end|>')['input_ids'], skip_special_tokens=True) == 'ab'


@pytest.mark.parametrize(('size', 'grid'), [((56, 56), [1, 4, 4]), ((84, 56), [1, 4, 6]),
                                            ((28, 28), [1, 2, 2]), ((400, 400), [1, 6, 6])])
def test_processor_resizes_to_few_patches_and_expands_placeholders(size, grid):
    proc = build_vl_processor(build_vl_tokenizer())
    out = proc(text=['<|vision_start|><|image_pad|><|vision_end|>hi'],
               images=[Image.new('RGB', size, (9, 9, 9))], return_tensors='pt')
    patches = grid[0] * grid[1] * grid[2]
    assert out['image_grid_thw'].tolist() == [grid]  # width x height in, (t, h, w) out
    assert out['pixel_values'].shape == (patches, 3 * 2 * 14 * 14)
    pad = proc.tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    assert (out['input_ids'] == pad).sum().item() == patches // 4  # 2x2 patches merge


def test_model_is_deterministic_in_the_seed_and_saves_offline(tmp_path):
    tok = build_vl_tokenizer()
    a, b = build_tiny_vl_model(tok, seed=3), build_tiny_vl_model(tok, seed=3)
    state = torch.get_rng_state()
    c = build_tiny_vl_model(tok, seed=4)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is untouched
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    assert sum(p.numel() for p in a.visual.parameters()) > 0

    out = save_tiny_vl(tmp_path / 'm', seed=3)
    proc = AutoProcessor.from_pretrained(out)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 model.state_dict().values()))
    text = proc.apply_chat_template(
        [{'role': 'user', 'content': [{'type': 'image'}, {'type': 'text', 'text': 'hi'}]}],
        add_generation_prompt=True, tokenize=False)
    assert text == ('<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi'
                    '<|im_end|>\n<|im_start|>assistant\n')
    enc = proc(text=[text], images=[Image.new('RGB', (56, 56))], return_tensors='pt')
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc['input_ids'].shape[1], len(proc.tokenizer))
    assert torch.isfinite(logits).all()


def test_pictures_show_the_asked_colour_and_count(tmp_path):
    path = draw_squares(tmp_path / 'x.png', 'green', count=3, size=(84, 56))
    image = Image.open(path).convert('RGB')
    assert image.size == (84, 56)
    row = [image.getpixel((x, 28)) for x in range(84)]
    runs = sum(1 for x in range(1, 84) if row[x] == COLOURS['green'] and row[x - 1] != row[x])
    assert runs == 3 and image.getpixel((0, 0)) == (255, 255, 255)
    with pytest.raises(ValueError, match='do not fit'):
        draw_squares(tmp_path / 'y.png', 'red', count=9, size=(28, 28))


def test_picture_tasks_are_valid_records_with_images(tmp_path):
    path = build_picture_tasks(tmp_path / 'data', 6, seed=1)
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r['domain'] for r in raw] == ['colour', 'count'] * 3
    assert all(not r['images'][0].startswith('/') for r in raw)  # relative to the file
    records = load_records(path)  # the dataset's own validation resolves the paths
    for rec in records:
        image = Image.open(rec['images'][0])
        assert image.size == ((56, 56) if rec['domain'] == 'colour' else (84, 56))
        if rec['domain'] == 'colour':
            assert image.convert('RGB').getpixel((28, 28)) == COLOURS[rec['answer']]
        else:
            assert rec['answer'] in {'1', '2', '3'}
    assert build_picture_tasks(tmp_path / 'again', 6, seed=1).read_text() == path.read_text()
