"""GEPO on TRL's GRPOTrainer (gepo_xtuner.integrations.trl), in real TRL runs.

TRL 1.16 needs transformers >= 4.56 and this environment keeps 4.48 for xtuner 0.2.0, so
TRL and its transformers come from the overlay of ``make trl-deps`` (put first on
PYTHONPATH of the processes that use it). The runs are TRL's own: ``torchrun`` starts 2
CPU processes (gloo) of ``trl_env/run_grpo.py``, 3 completions per process and 2 per
prompt, so one group of every step is split between the processes. Each rank records
what it saw; the test rebuilds the global batch from those records and recomputes with
this package's core.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from gepo_xtuner.advantage import AdvantageInputs, GEPOAdvantage, GRPOAdvantage
from tests.conftest import WITHOUT_XTUNER_STACK
from tests.test_engine.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / 'trl_env' / 'run_grpo.py'
STEPS, WORLD, PER_DEVICE, K = 3, 2, 3, 2
GEPO = dict(alpha_low=0.5, alpha_high=0.2, beta_low=0.2, beta_high=0.3, gamma=0.5)
#: modules a TRL user's environment need not have
XTUNER_STACK = ('mmengine', 'xtuner', 'lmdeploy')


def run_trl(deps: Path, model: Path, out: Path, records: Path, *extra: str,
            ok: bool = True) -> subprocess.CompletedProcess:
    """``trl_env/run_grpo.py`` on WORLD processes started by torchrun."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(deps), str(ROOT)]),
               OMP_NUM_THREADS='1')
    proc = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', f'--nproc_per_node={WORLD}',
         f'--master_port={free_port()}', str(SCRIPT), str(model), str(out), str(records),
         *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    if ok:
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    return proc


@pytest.fixture(scope='module')
def straight(trl_deps, tiny_model_dir, tmp_path_factory) -> Path:
    """A 3-step run, checkpointed after every step; its records."""
    tmp = tmp_path_factory.mktemp('trl_straight')
    run_trl(trl_deps, tiny_model_dir, tmp / 'out', tmp / 'records')
    return tmp


def band(state: dict) -> tuple[float, float, int]:
    return state['h_low'], state['h_high'], state['num_updates']


def load(records: Path, step: int) -> list[dict]:
    return [json.loads((records / f'step{step}_rank{r}.json').read_text())
            for r in range(WORLD)]


def global_batch(ranks: list[dict]) -> tuple[AdvantageInputs, torch.Tensor, torch.Tensor]:
    """The step's batch in TRL's order (rank 0's rows, then rank 1's), groups of K
    consecutive rows; TRL's advantages; the shaped ones the ranks trained on."""
    width = max(len(r['logprobs'][0]) for r in ranks)
    pad = [torch.nn.functional.pad(torch.tensor(r[key]), (0, width - len(r[key][0])))
           for r in ranks for key in ('logprobs', 'mask')]
    logprobs, mask = torch.cat(pad[0::2]), torch.cat(pad[1::2]).bool()
    weights = torch.tensor(ranks[0]['reward_weights'])
    rewards = (torch.tensor(ranks[0]['rewards_per_func']) * weights).nansum(1)
    n = logprobs.shape[0]
    batch = AdvantageInputs(rewards=rewards.double(), group_ids=torch.arange(n) // K,
                            logprobs=logprobs, mask=mask)
    base = torch.cat([torch.tensor(r['base']) for r in ranks])
    shaped = torch.cat([torch.tensor(r['shaped']) for r in ranks])
    return batch, base, shaped


def test_two_processes_with_split_groups_give_the_cores_advantages(straight):
    """Every step: the shaped advantages both processes trained on are the core's GEPO
    of the whole batch (groups across the process boundary), TRL's own advantages are the
    core's GRPO (eps 1e-4, TRL's guard), and both processes hold the core's band."""
    gepo = GEPOAdvantage(**GEPO)
    state = gepo.init_state()
    damped = 0
    for step in range(1, STEPS + 1):
        ranks = load(straight / 'records', step)
        assert [len(r['base']) for r in ranks] == [PER_DEVICE] * WORLD  # group 1 is split
        batch, base, shaped = global_batch(ranks)
        grpo = GRPOAdvantage(eps=1e-4)(batch).advantages
        torch.testing.assert_close(base, grpo, atol=1e-6, rtol=0)
        core = gepo(batch, state, base_advantages=base)
        torch.testing.assert_close(shaped, core.advantages, atol=1e-6, rtol=0)
        for rank in ranks:
            assert band(rank['state']) == pytest.approx(band(state.state_dict()), rel=1e-12)
        damped += int(core.damped_positive.sum() + core.damped_negative.sum())
    assert damped > 0  # the band shaped something: a wrong grouping would show
    logged = json.loads((straight / 'records' / 'log_history.json').read_text())
    assert [row['gepo/num_updates'] for row in logged if 'gepo/num_updates' in row] == [1, 2, 3]


def test_resume_restores_the_band_exactly(straight, trl_deps, tiny_model_dir, tmp_path):
    """Resumed from the step-1 checkpoint: the band file there is the band after step 1,
    and the resumed steps see the batches, band and shaped advantages of the straight run."""
    checkpoint = straight / 'out' / 'checkpoint-1'
    saved = json.loads((checkpoint / 'gepo_state.json').read_text())
    assert saved == load(straight / 'records', 1)[0]['state']
    run_trl(trl_deps, tiny_model_dir, tmp_path / 'out', tmp_path / 'records', '--resume',
            str(checkpoint))
    assert not (tmp_path / 'records' / 'step1_rank0.json').exists()
    for step in range(2, STEPS + 1):
        assert load(tmp_path / 'records', step) == load(straight / 'records', step), step


def test_the_trl_integration_imports_without_the_xtuner_stack(trl_deps, straight, tmp_path):
    """In a process where mmengine, xtuner and lmdeploy cannot be imported (as after
    ``pip install gepo-xtuner[trl]``), the integration and the core import and build, and
    TRL's shaping gives the core's answer on the conformance batch. There,
    on the rest of a trainer's chain reduced to what the mixin calls: the logprobs it picks,
    the step-1 checkpoint of the run loading its band, and a copy without the band file (a
    checkpoint of a run without GEPO) refused, since resuming would restart the band."""
    import shutil
    checkpoint = straight / 'out' / 'checkpoint-1'
    shutil.copytree(checkpoint, tmp_path / 'checkpoint-1')
    (tmp_path / 'checkpoint-1' / 'gepo_state.json').unlink()
    code = WITHOUT_XTUNER_STACK + textwrap.dedent(f'''
        sys.modules.setdefault('bitsandbytes', None)
        from gepo_xtuner.integrations.trl import GEPOGRPOTrainer
        from gepo_xtuner.registry import ADVANTAGES, HAVE_MMENGINE
        assert not HAVE_MMENGINE
        assert type(ADVANTAGES.build(dict(type='GEPOAdvantage'))).__name__ == 'GEPOAdvantage'
        from tests.test_integrations import conformance
        conformance.check('trl')  # the conformance batch (test_conformance.py)
        from gepo_xtuner.integrations.trl import GEPOTrainerMixin
        import torch
        from types import SimpleNamespace
        class Base:  # the rest of the trainer's chain
            model, args = None, SimpleNamespace(per_device_train_batch_size=2)
            def _load_optimizer_and_scheduler(self, checkpoint):
                pass
            def _get_per_token_logps_and_entropies(self, model, ids, mask, keep, batch_size):
                return torch.full((ids.shape[0], keep), -3.0), None, None
        class Trainer(GEPOTrainerMixin, Base):
            pass
        trainer = Trainer(gepo=dict(gamma=0.5))
        ones = torch.ones(2, 3, dtype=torch.long)
        out = dict(prompt_ids=ones, prompt_mask=ones, completion_ids=ones,
                   completion_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))
        sampled = torch.full((2, 3), -1.0)
        old = torch.full((2, 3), -2.0)
        picks = [trainer._gepo_logprobs(dict(out, sampling_per_token_logps=sampled,
                                             old_per_token_logps=old))[0][0, 0].item()]
        sampled[1, 2] = float('nan')  # a token the engine could not score
        picks.append(trainer._gepo_logprobs(dict(out, sampling_per_token_logps=sampled,
                                                 old_per_token_logps=old))[0][0, 0].item())
        sampled[1, 2], sampled[0, 2] = -1.0, float('nan')  # NaN on padding: still the engine's
        picks.append(trainer._gepo_logprobs(dict(out, sampling_per_token_logps=sampled))[0][0, 0].item())
        lp, mask = trainer._gepo_logprobs(dict(out, tool_mask=torch.tensor([[1, 0, 1], [1, 1, 1]])))
        picks += [lp[0, 0].item(), mask.tolist()]
        print(picks)
        trainer._load_optimizer_and_scheduler({str(checkpoint)!r})
        print(trainer.gepo_state.num_updates)
        try:
            trainer._load_optimizer_and_scheduler({str(tmp_path / 'checkpoint-1')!r})
        except FileNotFoundError as e:
            print(e)
        print(sorted(m for m in sys.modules if m.split('.')[0] in {XTUNER_STACK!r}))
    ''')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(trl_deps), str(ROOT)]))
    proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    picks, loaded, refused, stack = proc.stdout.strip().splitlines()[-4:]
    # the engine's logprobs, the trainer's where the engine's have a NaN on a trained token,
    # computed where TRL has neither; tool tokens leave the mask
    assert picks == str([-1.0, -2.0, -1.0, -3.0, [[1, 0, 0], [1, 1, 1]]])
    assert loaded == '1' and stack == '[]'
    assert 'has no gepo_state.json: it was not written by a GEPO trainer' in refused
