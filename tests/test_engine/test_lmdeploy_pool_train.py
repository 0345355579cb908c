"""``xtuner train`` against a pool of two servers (LMDeployProtocolDouble processes, not
LMDeploy: its engines need a GPU), weights pushed over the NCCL protocol with gloo."""

import sys

from gepo_xtuner.rollout.lmdeploy.server import LMDeployServerProcess

from .conftest import ROOT, scalars, train, write_config


def _servers(tiny_dir, log_dir, n: int = 2) -> list[LMDeployServerProcess]:
    command = [sys.executable, '-m', 'tests.test_rollout.protocol_double', '{model_path}',
               '--server-name', '{host}', '--server-port', '{port}', '--logprobs-mode',
               'raw_logprobs']
    servers = []
    for i in range(n):
        s = LMDeployServerProcess(model_path=str(tiny_dir / 'model'), port=0, command=command,
                                  env={'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1'},
                                  log_file=str(log_dir / f'server{i}.log'), startup_timeout_s=120)
        s.start()
        servers.append(s)
    return servers


def _config(tmp_path, urls: list[str]):
    return write_config(tmp_path, extra=f"""
        train_cfg = dict(rollout=dict(
            _delete_=True, type='LMDeployRolloutBackend', server_url={urls!r}, max_retries=0,
            timeout_s=120, weight_sync=dict(mode='nccl', backend='gloo', timeout_s=120)))
    """)


def test_training_on_a_server_pool_logs_each_server_and_resumes_on_fresh_servers(
        tmp_path, tiny_dir):
    """Two steps, then ``--resume`` for a third on new servers (initial weights): the
    resumed run pushes its weights before generating, so the servers' logprobs match
    the trainer's from the first resumed step on."""
    work = tmp_path / 'run'
    servers = _servers(tiny_dir, tmp_path)
    try:
        train(_config(tmp_path, [s.url for s in servers]), work, tiny_dir,
              'train_cfg.max_steps=2')
    finally:
        for s in servers:
            s.close()
    logged = scalars(work)
    # step 2's figures cover its B x K = 16 rollouts (step 1's also the step-0 validation)
    per_server = [logged[2][f'rollout/server/{i}/requests'] for i in range(2)]
    assert sum(per_server) == 4 * 4 and min(per_server) > 0  # spread over both
    for step in (1, 2):
        assert logged[step]['rollout/servers_ready'] == 2
        assert logged[step]['rollout/logprob_abs_diff'] < 1e-4

    fresh = _servers(tiny_dir, tmp_path)
    try:
        train(_config(tmp_path, [s.url for s in fresh]), work, tiny_dir,
              'train_cfg.max_steps=3', '--resume', str(work / 'iter_2.pth'))
    finally:
        for s in fresh:
            s.close()
    logged = scalars(work)
    assert logged[3]['rollout/logprob_abs_diff'] < 1e-4  # not the initial weights
    assert logged[3]['rollout/server/0/requests'] + logged[3]['rollout/server/1/requests'] == 16
