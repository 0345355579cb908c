"""The cluster scripts in ``tools/``: exact dry-run commands, real runs of what can run here.

Slurm and LMDeploy need a cluster and a GPU; where a test needs them, a fake stands in and
says so in its name (``fake_scontrol``, ``fake_lmdeploy``). The scripts themselves always
run for real under bash.
"""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / 'tools'
CONFIG = 'configs/gepo_intern_s1_mini.py'
SCRIPTS = sorted(TOOLS.glob('*.sh'))
# Variables the scripts read; cleared so the caller's environment cannot leak in.
SCRIPT_VARS = ('GPUS_PER_NODE', 'CPUS_PER_TASK', 'SRUN_ARGS', 'PYTHON', 'LMDEPLOY_ADDR_FILE',
               'NNODES', 'NODE_RANK', 'NPROC_PER_NODE', 'MASTER_ADDR', 'MASTER_PORT',
               'LMDEPLOY_PORT', 'LMDEPLOY', 'LMDEPLOY_HOST', 'LMDEPLOY_STARTUP_S', 'DRY_RUN')
SET_MASTER = ('MASTER_ADDR=$(scontrol show hostnames "$SLURM_STEP_NODELIST" | head -n 1) && '
              '[ -n "$MASTER_ADDR" ] || { echo "no first node in SLURM_STEP_NODELIST" >&2; '
              'exit 1; }; export MASTER_ADDR; exec "$@"')


def script_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SCRIPT_VARS}
    env.update(overrides)
    return env


def run(script: str, *args: str, dry_run: bool = True, **env: str
        ) -> subprocess.CompletedProcess:
    if dry_run:
        env['DRY_RUN'] = '1'
    return subprocess.run(['bash', str(TOOLS / script), *args], cwd=ROOT, env=script_env(**env),
                          capture_output=True, text=True, timeout=120, check=False)


def dry_run(script: str, *args: str, **env: str) -> str:
    proc = run(script, *args, **env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    return lines[0]


def write_server_file(path: Path, url='http://node3:23333', tp='2') -> Path:
    path.write_text(f'GEPO_LMDEPLOY_URL={url}\nGEPO_LMDEPLOY_TP={tp}\n')
    return path


# ---------------------------------------------------------------- slurm_train.sh
def test_slurm_train_prints_the_exact_srun_command():
    line = dry_run('slurm_train.sh', 'gpu', 'gepo', CONFIG, '16', '--deepspeed',
                   'deepspeed_zero2')
    assert line == (
        'srun -p gpu --job-name=gepo --gres=gpu:8 --ntasks=16 --ntasks-per-node=8 '
        '--cpus-per-task=8 --kill-on-bad-exit=1 '
        f"bash -c '{SET_MASTER}' slurm_train "
        f'python -m gepo_xtuner_launch {CONFIG} --launcher slurm --deepspeed deepspeed_zero2')


def test_slurm_train_environment_overrides_and_quoting():
    line = dry_run('slurm_train.sh', 'gpu', 'my job', CONFIG, '--work-dir', "/tmp/a b'c",
                   GPUS_PER_NODE='4', CPUS_PER_TASK='12', SRUN_ARGS='--time=1:00:00  -w node1',
                   PYTHON='/opt/env/bin/python')
    assert shlex.split(line) == [
        'srun', '-p', 'gpu', '--job-name=my job', '--gres=gpu:4', '--ntasks=8',
        '--ntasks-per-node=4', '--cpus-per-task=12', '--kill-on-bad-exit=1',
        '--time=1:00:00', '-w', 'node1', 'bash', '-c', SET_MASTER, 'slurm_train',
        '/opt/env/bin/python', '-m', 'gepo_xtuner_launch', CONFIG, '--launcher', 'slurm',
        '--work-dir', "/tmp/a b'c"]


def test_slurm_train_defaults_to_8_gpus_and_fewer_per_node_for_small_jobs():
    argv = shlex.split(dry_run('slurm_train.sh', 'gpu', 'j', CONFIG))
    assert '--ntasks=8' in argv and '--gres=gpu:8' in argv
    argv = shlex.split(dry_run('slurm_train.sh', 'gpu', 'j', CONFIG, '2'))
    assert '--ntasks=2' in argv and '--gres=gpu:2' in argv and '--ntasks-per-node=2' in argv


def test_slurm_train_passes_the_server_address_file(tmp_path):
    addr = write_server_file(tmp_path / 'server.env')
    argv = shlex.split(dry_run('slurm_train.sh', 'gpu', 'j', CONFIG,
                               LMDEPLOY_ADDR_FILE=str(addr)))
    assert argv[:4] == ['env', 'GEPO_LMDEPLOY_URL=http://node3:23333', 'GEPO_LMDEPLOY_TP=2',
                        'srun']


@pytest.mark.parametrize('content, message', [
    ('GEPO_LMDEPLOY_TP=2\n', 'has no GEPO_LMDEPLOY_URL'),
    ('GEPO_LMDEPLOY_URL=node3:23333\n', "unexpected line 'GEPO_LMDEPLOY_URL=node3:23333'"),
    ('GEPO_LMDEPLOY_URL=http://n:1\nrm -rf /\n', "unexpected line 'rm -rf /'"),
    ('GEPO_LMDEPLOY_URL=http://n:1\nGEPO_LMDEPLOY_TP=two\n', "bad line 'GEPO_LMDEPLOY_TP=two'"),
])
def test_a_bad_server_file_is_refused_with_its_line(tmp_path, content, message):
    addr = tmp_path / 'server.env'
    addr.write_text(content)
    for script, args in (('slurm_train.sh', ('gpu', 'j', CONFIG)), ('dist_train.sh', (CONFIG,))):
        proc = run(script, *args, LMDEPLOY_ADDR_FILE=str(addr))
        assert proc.returncode == 2 and proc.stdout == ''
        assert f'{addr}' in proc.stderr and message in proc.stderr


def test_a_missing_server_file_says_to_start_the_server(tmp_path):
    proc = run('slurm_train.sh', 'gpu', 'j', CONFIG, LMDEPLOY_ADDR_FILE=str(tmp_path / 'none'))
    assert proc.returncode == 2
    assert 'does not exist: start tools/slurm_lmdeploy_server.sh first' in proc.stderr


@pytest.mark.parametrize('args, env, message', [
    (('gpu', 'j'), {}, 'usage:'),
    (('gpu', 'j', 'configs/nope.py'), {}, 'config configs/nope.py does not exist'),
    (('gpu', 'j', CONFIG, '0'), {}, "GPUS must be a positive integer, got '0'"),
    (('gpu', 'j', CONFIG), {'GPUS_PER_NODE': 'x'}, "GPUS_PER_NODE must be a positive integer"),
])
def test_slurm_train_rejects_bad_arguments(args, env, message):
    proc = run('slurm_train.sh', *args, **env)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ''


def fake_scontrol(bin_dir: Path, nodes: str) -> None:
    """Stands in for Slurm's ``scontrol show hostnames`` (no Slurm here)."""
    path = bin_dir / 'scontrol'
    path.write_text(f'#!/bin/sh\nprintf "{nodes}"\n')
    path.chmod(0o755)


def test_task_wrapper_exports_the_first_node_with_fake_scontrol(tmp_path):
    """Runs the exact ``bash -c`` text each srun task runs, with a fake ``scontrol``."""
    argv = shlex.split(dry_run('slurm_train.sh', 'gpu', 'j', CONFIG))
    script = argv[argv.index('-c') + 1]
    fake_scontrol(tmp_path, 'node07\\nnode08\\n')
    env = script_env(PATH=f'{tmp_path}:{os.environ["PATH"]}', SLURM_STEP_NODELIST='node[07-08]')
    probe = [sys.executable, '-c', 'import os, sys; print(os.environ["MASTER_ADDR"], sys.argv[1:])',
             'x', 'y z']
    proc = subprocess.run(['bash', '-c', script, 'slurm_train', *probe], env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "node07 ['x', 'y z']"
    fake_scontrol(tmp_path, '')  # no nodes: the task stops instead of training without a master
    proc = subprocess.run(['bash', '-c', script, 'slurm_train', *probe], env=env,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and 'no first node' in proc.stderr


# ---------------------------------------------------------------- dist_train.sh
def test_dist_train_prints_the_exact_launcher_command():
    assert dry_run('dist_train.sh', CONFIG, '--deepspeed', 'deepspeed_zero2') == (
        'python -m gepo_xtuner_launch --nnodes=1 --node-rank=0 --nproc-per-node=8 '
        f'--master-addr=127.0.0.1 --master-port=29500 {CONFIG} --deepspeed deepspeed_zero2')


def test_dist_train_launcher_command_is_the_torchrun_command():
    """What the launcher runs for the script's line: torchrun, xtuner's program, pytorch."""
    from gepo_xtuner_launch import build_command

    argv = shlex.split(dry_run('dist_train.sh', CONFIG, '--deepspeed', 'deepspeed_zero2'))
    assert argv[:3] == ['python', '-m', 'gepo_xtuner_launch']
    assert build_command(argv[3:], env={}, python='python') == [
        'python', '-m', 'torch.distributed.run', '--nnodes=1', '--node_rank=0',
        '--nproc_per_node=8', '--master_addr=127.0.0.1', '--master_port=29500',
        '-m', 'xtuner.tools.train', CONFIG, '--deepspeed', 'deepspeed_zero2',
        '--launcher', 'pytorch']


def test_dist_train_multi_node_environment():
    line = dry_run('dist_train.sh', CONFIG, '--resume', 'work_dirs/x/iter_20.pth', NNODES='2',
                   NODE_RANK='1', NPROC_PER_NODE='4', MASTER_ADDR='nodeA', MASTER_PORT='29600',
                   PYTHON='/opt/env/bin/python')
    assert line == (
        '/opt/env/bin/python -m gepo_xtuner_launch --nnodes=2 --node-rank=1 '
        '--nproc-per-node=4 --master-addr=nodeA --master-port=29600 '
        f'{CONFIG} --resume work_dirs/x/iter_20.pth')


def test_dist_train_with_a_server_uses_this_hosts_name_as_master(tmp_path):
    addr = write_server_file(tmp_path / 'server.env', tp='1')
    argv = shlex.split(dry_run('dist_train.sh', CONFIG, LMDEPLOY_ADDR_FILE=str(addr)))
    hostname = subprocess.run(['hostname'], capture_output=True, text=True,
                              check=True).stdout.strip()
    assert argv[:3] == ['env', 'GEPO_LMDEPLOY_URL=http://node3:23333', 'GEPO_LMDEPLOY_TP=1']
    assert f'--master-addr={hostname}' in argv  # 127.0.0.1 is unreachable from the server


@pytest.mark.parametrize('env, message', [
    ({'NODE_RANK': '2', 'NNODES': '2'}, "NODE_RANK must be in 0..1, got '2'"),
    ({'NPROC_PER_NODE': '0'}, 'NPROC_PER_NODE must be a positive integer'),
    ({'MASTER_PORT': 'http'}, 'MASTER_PORT must be a port number'),
])
def test_dist_train_rejects_bad_environment(env, message):
    proc = run('dist_train.sh', CONFIG, **env)
    assert proc.returncode == 2 and message in proc.stderr


def test_dist_train_runs_xtuner_under_torchrun_and_keeps_the_exit_status(tmp_path):
    """Real launcher and torchrun, two CPU processes: a config that cannot load fails.

    (``xtuner train`` would exit 0 here.)
    """
    bad = tmp_path / 'bad_config.py'
    bad.write_text('model = dict(\n')
    env = dict(NPROC_PER_NODE='2', MASTER_PORT=str(free_port()), PYTHON=sys.executable,
               OMP_NUM_THREADS='1')
    proc = run('dist_train.sh', str(bad), dry_run=False, **env)
    assert proc.returncode == 1
    assert 'SyntaxError' in proc.stdout + proc.stderr
    proc = run('dist_train.sh', str(bad), '--help', dry_run=False, **env)
    assert proc.returncode == 0 and '--deepspeed' in proc.stdout  # xtuner's train arguments


# ------------------------------------------------------ slurm_lmdeploy_server.sh
def test_lmdeploy_server_prints_the_exact_srun_command(tmp_path):
    line = dry_run('slurm_lmdeploy_server.sh', 'gpu', 'srv', '/models/Intern-S1-mini', '2',
                   '--session-len', '32768', LMDEPLOY_ADDR_FILE=str(tmp_path / 'srv.env'),
                   SRUN_ARGS='-w node3')
    assert line == (
        'srun -p gpu --job-name=srv --gres=gpu:2 --ntasks=1 --cpus-per-task=16 -w node3 '
        f'bash {TOOLS / "slurm_lmdeploy_server.sh"} --on-node {tmp_path / "srv.env"} 23333 '
        '/models/Intern-S1-mini 2 --session-len 32768')


def test_lmdeploy_server_address_file_defaults_to_an_absolute_path():
    argv = shlex.split(dry_run('slurm_lmdeploy_server.sh', 'gpu', 'srv', '/m',
                               LMDEPLOY_PORT='24000'))
    assert argv[argv.index('--on-node') + 1:] == [
        str(ROOT / 'work_dirs' / 'lmdeploy_server.env'), '24000', '/m', '1']


def test_lmdeploy_server_on_node_prints_the_exact_lmdeploy_command():
    line = dry_run('slurm_lmdeploy_server.sh', '--on-node', '/tmp/srv.env', '23333', '/m', '4',
                   '--session-len', '32768', LMDEPLOY='/opt/lmdeploy-env/bin/lmdeploy')
    assert line == ('/opt/lmdeploy-env/bin/lmdeploy serve api_server /m --server-port 23333 '
                    '--backend pytorch --logprobs-mode raw_logprobs --enable-abort-handling --tp 4 '
                    '--session-len 32768')


def test_lmdeploy_server_trusts_a_checkpoint_that_ships_its_own_code(tmp_path):
    """Intern-S1-mini's config.json maps its classes to its own code (auto_map): the
    server needs --trust-remote-code as the trainer does; a plain checkpoint does not."""
    model = tmp_path / 'Intern-S1-mini'
    model.mkdir()
    (model / 'config.json').write_text('{"model_type": "interns1", "auto_map": '
                                       '{"AutoConfig": "configuration_interns1.InternS1Config"}}')
    line = dry_run('slurm_lmdeploy_server.sh', '--on-node', '/tmp/srv.env', '23333', str(model), '1')
    assert line.endswith('--tp 1 --trust-remote-code'), line
    (model / 'config.json').write_text('{"model_type": "qwen3_5"}')
    line = dry_run('slurm_lmdeploy_server.sh', '--on-node', '/tmp/srv.env', '23333', str(model), '1')
    assert '--trust-remote-code' not in line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


FAKE_LMDEPLOY = '''#!{python}
"""Stands in for `lmdeploy serve api_server` (LMDeploy needs a GPU): GET /health -> 200."""
import http.server, json, os, sys
argv = sys.argv[1:]
with open(os.environ['FAKE_LOG'], 'w') as fh:
    json.dump(dict(argv=argv, pid=os.getpid()), fh)
if os.environ.get('FAKE_FAIL'):
    sys.exit(3)
port = int(argv[argv.index('--server-port') + 1])

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == '/health' else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(('127.0.0.1', port), Health).serve_forever()
'''


def start_on_node_with_fake_lmdeploy(tmp_path, **env):
    fake = tmp_path / 'fake_lmdeploy'
    fake.write_text(FAKE_LMDEPLOY.format(python=sys.executable))
    fake.chmod(0o755)
    port = free_port()
    addr = tmp_path / 'out' / 'server.env'
    proc = subprocess.Popen(
        ['bash', str(TOOLS / 'slurm_lmdeploy_server.sh'), '--on-node', str(addr), str(port),
         '/models/m', '1'], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=script_env(LMDEPLOY=str(fake), LMDEPLOY_HOST='node3', FAKE_LOG=str(tmp_path / 'log'),
                       **env))
    return proc, addr, port


def test_lmdeploy_server_on_node_with_fake_lmdeploy_publishes_and_cleans_up(tmp_path):
    """Real script on this node; a fake server answers /health like LMDeploy's."""
    import json

    proc, addr, port = start_on_node_with_fake_lmdeploy(tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not addr.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, 'no address file after 60 s'
            time.sleep(0.2)
        assert addr.read_text() == f'GEPO_LMDEPLOY_URL=http://node3:{port}\nGEPO_LMDEPLOY_TP=1\n'
        log = json.loads((tmp_path / 'log').read_text())
        assert log['argv'] == ['serve', 'api_server', '/models/m', '--server-port', str(port),
                               '--backend', 'pytorch', '--logprobs-mode', 'raw_logprobs',
                               '--enable-abort-handling', '--tp', '1']
    finally:
        proc.send_signal(signal.SIGTERM)  # what scancel sends
        out, _ = proc.communicate(timeout=30)
    assert not addr.exists(), 'the address file must go with the server'
    assert f'LMDeploy server at http://node3:{port}' in out
    with pytest.raises(ProcessLookupError):
        for _ in range(50):  # the server is stopped by the script's trap
            os.kill(log['pid'], 0)
            time.sleep(0.1)


def test_lmdeploy_server_on_node_reports_a_server_that_dies_at_start(tmp_path):
    proc, addr, _ = start_on_node_with_fake_lmdeploy(tmp_path, FAKE_FAIL='1')
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert 'the LMDeploy server exited during start-up' in err
    assert not addr.exists()


# ---------------------------------------------------------------------- shellcheck
def shellcheck() -> str | None:
    here = Path(sys.executable).parent / 'shellcheck'  # the dev extra installs it in the venv
    return str(here) if here.exists() else shutil.which('shellcheck')


@pytest.mark.skipif(shellcheck() is None,
                    reason="shellcheck not installed: pip install -e '.[dev]' installs it")
def test_scripts_are_shellcheck_clean():
    assert len(SCRIPTS) >= 4
    proc = subprocess.run([shellcheck(), '-x', *map(str, SCRIPTS)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_scripts_are_executable():
    for script in ('slurm_train.sh', 'dist_train.sh', 'slurm_lmdeploy_server.sh'):
        assert os.access(TOOLS / script, os.X_OK), script
