"""LMDeploy 0.18's own vision preprocessing over the ``/generate`` bodies the backend sends.

Run under transformers 5 (the overlay of ``make tf5-deps``: LMDeploy's
``internvl3_hf`` module needs the ``internvl`` processor classes)::

    PYTHONPATH=work_dirs/tf5_deps:. python -m tests.test_rollout.lmdeploy_vl_ids OUT_DIR

For a tiny Intern-S1-shaped VLM (native InternVL classes, the architecture LMDeploy's
``InternVL3VisionModel`` serves for ``InternVLForConditionalGeneration`` and
``InternS1ForConditionalGeneration``) and a tiny Qwen2-VL, and for records with images
of 1 to 5 tiles, two images per prompt (apart, and in a row: two image parts one after
the other, whose runs the template still separates) and text-only prompts, it builds the trainer's
request (:func:`~gepo_xtuner.engine.step.prompt_encoding.encode_request`), the body the
backend sends (:func:`~gepo_xtuner.rollout.lmdeploy.protocol.build_generate_payload`),
and then does to the body what LMDeploy's server does with it:

* ``/generate`` (``lmdeploy/serve/openai/endpoints/generate.py``): with ``image_data``,
  one user message whose first part's ``text`` is the ``input_ids`` list, then one
  ``image_url`` part per image; without, the ids go to the engine as they are;
* ``MultimodalProcessor.async_parse_multimodal_item``: loads the data URIs;
* ``ImageEncoder.preprocess`` and ``ImageEncoder.wrap_for_pytorch``
  (``lmdeploy/vl/engine.py``) with the vision model ``load_vl_model`` picks for the
  checkpoint: the ids and pixel tensors the PyTorch engine is given.

It also lists the names a weight push sends next to the checkpoint's own (what LMDeploy
loads at start, ``load_weights`` of ``lmdeploy/pytorch/models/internvl3_hf.py`` included).

It prints one JSON object: per model family and record, whether the engine's ids equal
the trainer's ``model_input_ids``, the largest pixel difference, whether each image's
offset is where the trainer's run of image tokens starts, and the same for the body of
the old form (the bare ``input_ids``, as sent before), which the test expects to differ
for InternVL.
"""

import asyncio
import json
import sys
from pathlib import Path

import torch


def _records(data_dir: Path, family: str) -> list[dict]:
    from gepo_xtuner.testbed.tiny_vl import draw_squares
    sizes = [(56, 56), (112, 56), (56, 112), (112, 112), (168, 56), (224, 112), (84, 84)]
    records = []
    for i, size in enumerate(sizes):
        path = draw_squares(data_dir / f'{family}-{i}.png', 'red', 1 + i % 2, size=size)
        records.append(dict(id=f'one-{size[0]}x{size[1]}', images=[str(path)], messages=[
            dict(role='user', content=[dict(type='image'), dict(type='text', text='colour?')])]))
    a = draw_squares(data_dir / f'{family}-a.png', 'blue', 1, size=(112, 56))
    b = draw_squares(data_dir / f'{family}-b.png', 'green', 2, size=(56, 56))
    records.append(dict(id='two-images', images=[str(a), str(b)], messages=[
        dict(role='user', content='<image>first, <image>second: which is blue?')]))
    records.append(dict(id='two-images-in-a-row', images=[str(b), str(a)], messages=[
        dict(role='user', content=[dict(type='image'), dict(type='image'),
                                   dict(type='text', text='same?')])]))
    records.append(dict(id='text-only', messages=[dict(role='user', content='1+1=?')]))
    return records


def _engine_side(encoder, body: dict) -> dict:
    """What LMDeploy's /generate hands its PyTorch engine for ``body``."""
    from lmdeploy.serve.processors import MultimodalProcessor
    if 'image_data' not in body:
        return dict(input_ids=list(body['input_ids']), multimodal=[])
    content = [dict(type='text', text=body['input_ids'])]
    content += [dict(type='image_url', image_url=dict(url=u)) for u in body['image_data']]
    messages = [dict(role='user', content=content)]

    async def run() -> dict:
        parsed = await MultimodalProcessor.async_parse_multimodal_item(messages, {}, None)
        prepared = await encoder.preprocess(parsed)
        return await encoder.wrap_for_pytorch(prepared, chat_template=None, tokenizer=None)
    try:
        return asyncio.run(run())
    except AssertionError as exc:  # LMDeploy refuses a body whose ids and images disagree
        return dict(error=f'AssertionError: {exc}')


def _compare(request, engine: dict) -> dict:
    trainer_ids = request.prompt_ids
    if 'error' in engine:
        return dict(ids_equal=False, error=engine['error'])
    out = dict(ids_equal=engine['input_ids'] == trainer_ids,
               engine_len=len(engine['input_ids']), trainer_len=len(trainer_ids))
    if request.images:
        items = engine['multimodal']
        mine = request.mm_inputs['pixel_values'].float()
        theirs = torch.cat([item['pixel_values'].float() for item in items])
        out['pixel_shape_equal'] = tuple(mine.shape) == tuple(theirs.shape)
        out['pixel_max_diff'] = (float((mine - theirs).abs().max())
                                 if out['pixel_shape_equal'] else None)
        if 'image_grid_thw' in request.mm_inputs:
            grid = torch.cat([item['image_grid_thw'] for item in items])
            out['grid_equal'] = bool(torch.equal(grid, request.mm_inputs['image_grid_thw']))
        token = request.image_token_id
        starts = [i for i, t in enumerate(trainer_ids)
                  if t == token and (i == 0 or trainer_ids[i - 1] != token)]
        out['offsets_equal'] = [item.get('offset') for item in items] == starts
        out['images'] = len(items)
    return out


def _push_names(model_dir: Path) -> dict:
    """The names a weight push sends (``named_weights`` of the model as the trainer loads
    it) against the checkpoint's own, which the server's loader reads at start."""
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    from gepo_xtuner.rollout.server.weights import named_weights
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    pushed = [name for name, _ in named_weights(model)]
    on_disk = sorted(load_file(str(model_dir / 'model.safetensors')))
    return dict(pushed=pushed, on_disk=on_disk,
                module_names=[name for name, _ in model.named_parameters()])


def main(out_dir: str) -> None:
    from lmdeploy.messages import PytorchEngineConfig
    from lmdeploy.vl.engine import ImageEncoder
    from transformers import AutoProcessor

    from gepo_xtuner.engine.step.prompt_encoding import encode_request
    from gepo_xtuner.rollout import SamplingParams
    from gepo_xtuner.rollout.lmdeploy.protocol import build_generate_payload
    from gepo_xtuner.testbed.tiny_interns1 import save_tiny_interns1
    from gepo_xtuner.testbed.tiny_vl import save_tiny_vl

    out = Path(out_dir)
    report: dict = {}
    for family, save in (('internvl', save_tiny_interns1), ('qwen2_vl', save_tiny_vl)):
        model_dir = save(out / family)
        processor = AutoProcessor.from_pretrained(model_dir)
        encoder = ImageEncoder(str(model_dir), 'pytorch', backend_config=PytorchEngineConfig())
        rows = {}
        for record in _records(out / f'{family}-images', family):
            request = encode_request(record, processor.tokenizer,
                                     processor if record.get('images') else None)
            body = build_generate_payload(request, SamplingParams())
            old = dict(body, input_ids=list(request.input_ids))  # the form sent before
            rows[record['id']] = dict(
                now=_compare(request, _engine_side(encoder, body)),
                old=_compare(request, _engine_side(encoder, old)),
                tiles=(int(request.mm_inputs['pixel_values'].shape[0])
                       if request.mm_inputs else 0))
        report[family] = dict(vision_model=type(encoder.model).__name__, records=rows,
                              push=_push_names(model_dir))
    print("REPORT " + json.dumps(report))


if __name__ == '__main__':
    main(sys.argv[1])
