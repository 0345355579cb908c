"""Images reach LMDeploy's engine as the trainer sees them: LMDeploy 0.18's own vision code.

``tests/test_rollout/lmdeploy_vl_ids.py`` runs, under transformers 5 (the overlay of
``make tf5-deps``), LMDeploy's ``/generate`` conversion, ``MultimodalProcessor`` and
``ImageEncoder`` (``InternVL3VisionModel`` for the tiny Intern-S1-shaped VLM,
``Qwen2VLModel`` for the tiny Qwen2-VL) over the bodies
:func:`~gepo_xtuner.rollout.lmdeploy.protocol.build_generate_payload` sends, and compares
the ids, pixels and image offsets the engine would get with the trainer's. Nothing of
LMDeploy is replaced; no engine runs (the comparison stops where the PyTorch engine
takes over, which needs a GPU).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def report(tf5_deps, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp('vl_ids')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tf5_deps), str(ROOT)]),
               OMP_NUM_THREADS='1')
    proc = subprocess.run([sys.executable, '-m', 'tests.test_rollout.lmdeploy_vl_ids', str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith('REPORT ')]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len('REPORT '):])


@pytest.mark.parametrize('family,vision_model', [('internvl', 'InternVL3VisionModel'),
                                                 ('qwen2_vl', 'Qwen2VLModel')])
def test_the_engine_gets_the_trainers_ids_pixels_and_offsets(report, family, vision_model):
    """Every record (1 to 5 tiles, two images apart and in a row, text only): equal ids,
    equal pixel tensors, each image's offset at the start of the trainer's run."""
    fam = report[family]
    assert fam['vision_model'] == vision_model  # LMDeploy's dispatch by architecture
    rows = fam['records']
    assert len(rows) == 10 and sum(r['tiles'] > 0 for r in rows.values()) == 9
    for name, row in rows.items():
        now = row['now']
        assert now['ids_equal'], (name, now)
        if row['tiles']:
            assert now['pixel_shape_equal'] and now['pixel_max_diff'] == 0.0, (name, now)
            assert now['offsets_equal'], (name, now)
            assert now.get('grid_equal', True), (name, now)
    if family == 'internvl':  # several tile counts were exercised
        assert len({r['tiles'] for r in rows.values()}) >= 4


def test_the_bare_placeholder_form_gives_internvl_another_context(report):
    """The negative control: the chat template's bare ``<IMG_CONTEXT>`` (what the backend
    sent before) loses ``<img>`` / ``</img>`` around every image in LMDeploy's expansion;
    for Qwen2-VL, whose template writes the markers, both forms are the same."""
    for name, row in report['internvl']['records'].items():
        if row['tiles']:
            old = row['old']
            assert not old['ids_equal'], name
            assert old['trainer_len'] - old['engine_len'] == 2 * old['images'], (name, old)
    assert all(row['old']['ids_equal'] for row in report['qwen2_vl']['records'].values())


@pytest.mark.parametrize('family', ['internvl', 'qwen2_vl'])
def test_a_weight_push_names_every_tensor_as_the_checkpoint_does(report, family):
    """The push covers the vision tower and projector under the checkpoint's names, which
    differ from the module names on transformers 5 (``model.language_model.X`` is
    ``language_model.model.X`` for InternVL): LMDeploy's InternVL loader sends names
    starting ``language_model.`` to the language model and looks every other one up
    among ``vision_tower.*`` / ``multi_modal_projector.*``."""
    push = report[family]['push']
    assert push['pushed'] and sorted(push['pushed']) == push['on_disk']
    assert push['module_names'] != push['pushed']  # the renaming is real, and undone
    if family == 'internvl':
        prefixes = {name.split('.')[0] for name in push['pushed']}
        assert prefixes == {'language_model', 'vision_tower', 'multi_modal_projector'}
