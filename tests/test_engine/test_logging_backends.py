"""The scalar backends users read: TensorBoard (shipped configs) and W&B (offline mode),
through mmengine's own backends in a real ``xtuner train`` run. Each receives every
step's metrics under the names ``scalars.json`` and README use."""

import json
import math

import pytest

from .conftest import scalars, train, write_config

# names README lists, present in every step of the tiny GEPO run
CORE = ('reward/mean', 'entropy/group_nll_mean', 'entropy/policy', 'gepo/h_low', 'gepo/h_high',
        'loss/pg', 'optim/grad_norm', 'perf/gen_tokens_per_sec', 'time/step')


def tensorboard_scalars(work_dir) -> dict[int, dict[str, float]]:
    """Every scalar of the run's TensorBoard event files, by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out: dict[int, dict[str, float]] = {}
    files = list(work_dir.glob('*/vis_data/**/events.out.tfevents.*'))
    assert files, f'no TensorBoard event file under {work_dir}'
    for path in files:
        events = EventAccumulator(str(path), size_guidance={'scalars': 0})
        events.Reload()
        for tag in events.Tags()['scalars']:
            for event in events.Scalars(tag):
                out.setdefault(event.step, {})[tag] = event.value
    return out


def wandb_history(path) -> list[dict]:
    """The history rows (``wandb.log`` calls) of an offline run file ``run-<id>.wandb``.

    The file is a LevelDB-style log (32 KiB blocks; records, possibly split across
    blocks, each behind a 7-byte header: crc32, length, type) of W&B ``Record``
    protobufs, after a 7-byte file header.
    """
    import struct

    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b':W&B', f'{path} is not a W&B run file'
    records, part, pos = [], b'', 7
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # block trailer
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 0:
            break
        part = chunk if kind in (1, 2) else part + chunk  # FULL, FIRST / MIDDLE, LAST
        if kind in (1, 4):
            records.append(part)
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof('record_type') == 'history':
            rows.append({('/'.join(i.nested_key) or i.key): json.loads(i.value_json)
                         for i in record.history.item})
    return rows


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6)


def test_tensorboard_and_wandb_offline_get_every_metric(tiny_dir, tmp_path, monkeypatch):
    pytest.importorskip('tensorboard')
    pytest.importorskip('wandb')
    cfg = write_config(tmp_path, extra="""
        visualizer = dict(vis_backends=[
            dict(type='LocalVisBackend'),
            dict(type='OptionalTensorboardVisBackend'),  # as the shipped configs
            dict(type='WandbVisBackend', init_kwargs=dict(project='gepo-tiny', mode='offline'))])
    """)
    work = tmp_path / 'run'
    # the training process inherits these (train() copies os.environ)
    monkeypatch.setenv('WANDB_MODE', 'offline')
    monkeypatch.setenv('WANDB_SILENT', 'true')
    # from the config's own directory: W&B stages every .py file under the working directory
    # as the run's code artifact, which from the checkout (its .venv included) is ~30,000 files
    train(cfg, work, tiny_dir, 'train_cfg.max_steps=2', 'train_cfg.val=None', cwd=tmp_path)

    logged = scalars(work)
    board = tensorboard_scalars(work)
    for step in (1, 2):
        assert set(CORE) <= set(logged[step]), sorted(set(CORE) - set(logged[step]))
        for key, value in logged[step].items():
            assert key in board[step], (step, key)
            assert same(board[step][key], value), key

    # mmengine's WandbVisBackend puts the offline run under vis_data/ (`wandb sync DIR`)
    runs = list(work.glob('*/vis_data/wandb/offline-run-*/run-*.wandb'))
    assert len(runs) == 1, runs
    rows = wandb_history(runs[0])
    assert len(rows) == 2
    for step, row in zip((1, 2), rows):
        for key, value in logged[step].items():
            assert key in row and same(float(row[key]), value), (step, key)
