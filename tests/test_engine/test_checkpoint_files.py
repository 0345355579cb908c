"""Real runs: leftovers of killed saves are removed, a cut-off checkpoint is refused by name."""

import tempfile

from .conftest import train, write_config


def test_cut_off_checkpoint_and_leftover_temporaries(tmp_path, tiny_dir):
    cfg = write_config(tmp_path)
    work = tmp_path / 'w'
    quiet = train(cfg, work, tiny_dir, 'train_cfg.max_steps=2',
                  'default_hooks.checkpoint.interval=1')
    # the default start is quiet: no config or environment dump on the console ...
    assert 'System environment' not in quiet.stdout + quiet.stderr
    assert 'Hooks will be executed' not in quiet.stdout + quiet.stderr
    assert 'Environment, config and hooks: ' in quiet.stdout
    (log,) = work.glob('*/*.log')  # ... but in the log file
    assert 'System environment' in log.read_text() and 'Config:' in log.read_text()

    # a save killed before its rename, and the last checkpoint cut off (e.g. by a copy)
    fd, leftover = tempfile.mkstemp(prefix='.iter_3.pth.', suffix='.tmp', dir=work)
    with open(fd, 'wb') as fh:
        fh.write(b'\0' * 4096)
    last = work / 'iter_2.pth'
    data = last.read_bytes()
    last.write_bytes(data[:len(data) // 3])

    # xtuner's --resume (which loads the file for its seed before any runner exists)
    cli = train(cfg, work, tiny_dir, 'train_cfg.max_steps=3', '--resume', str(last),
                check=False)
    assert cli.returncode == 1
    assert cli.stderr.strip().splitlines()[-1].startswith(
        f'error: cannot load checkpoint {last}: not a complete torch checkpoint')
    assert f'resume from the previous checkpoint instead: --resume {work / "iter_1.pth"}' \
        in cli.stderr
    # the runner's own resume (resume=True, load_from=...) says the same
    runner = train(cfg, work, tiny_dir, 'train_cfg.max_steps=3', 'resume=True',
                   f'load_from={last}', check=False)
    assert runner.returncode == 1
    assert f'CheckpointError: cannot load checkpoint {last}: not a complete' in runner.stderr
    assert f'--resume {work / "iter_1.pth"}' in runner.stderr
    # the runner removed the leftover at its start, and said so
    assert f'Removed 1 unfinished checkpoint file(s) that interrupted saves left in {work}: ' \
           f'{leftover.rsplit("/", 1)[1]} (0.0 MiB)' in runner.stdout
    assert not list(work.glob('.*.tmp'))

    # resuming from the suggested checkpoint works; torch's warning about the pickle load,
    # once per load, is not repeated (the run's own notice says it)
    resumed = train(cfg, work, tiny_dir, 'train_cfg.max_steps=3', '--resume',
                    str(work / 'iter_1.pth'))
    assert 'Removed' not in resumed.stdout
    assert 'allowing pickle checkpoint loads' in resumed.stdout
    assert 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected' not in resumed.stderr
    assert '`resume_param_scheduler` is True' not in resumed.stdout
    assert (work / 'iter_3.pth').is_file()
