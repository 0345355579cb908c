#!/usr/bin/env python
"""Evaluate a policy on benchmark files: per-benchmark scores and every sample, resumable.

Usage::

    python tools/evaluate.py MODEL --data [NAME=]FILE [...] --out DIR
        [--backend hf|lmdeploy] [--server-url URL] [--concurrency 64]
        [--base-model DIR] [--tokenizer DIR] [--model-class CLASS] [--processor DIR]
        [--trust-remote-code] [--rewards DOMAIN=Type,...] [--config CONFIG]
        [--import MODULE ...] [--route-by domain|data_source] [--prompt-template TEMPLATE]
        [--n 1] [--temperature 0] [--top-p 1] [--top-k 0] [--max-new-tokens T]
        [--stop-token-ids ID ...] [--seed 0] [--batch-size 32] [--limit N]
        [--device DEV] [--dtype DT]

MODEL is a Hugging Face model directory or an ``iter_N.pth`` checkpoint of an RL run (its
architecture, tokenizer and processor come from the run's ``model`` config, or
``--base-model``); vision-language models need ``--model-class`` (or the checkpoint's).
With ``--backend lmdeploy`` an LMDeploy server at ``--server-url`` generates (it must serve
MODEL's weights; MODEL gives the tokenizer). Each ``--data`` file (JSONL or Parquet, the
record schema of ``docs/data.md``) is one benchmark, named NAME or after the file.

Rewards come from ``--rewards math=MathReward,code=CodeReward`` (``default=`` serves other
domains), else from ``train_cfg.rewards`` of ``--config``, else from the config saved in a
``.pth`` checkpoint. The prompt template and stop tokens follow the same order, then
``'{prompt}'`` and the tokenizer's / generation config's EOS. ``--max-new-tokens``
defaults to the training config's ``train_cfg.sampling.max_new_tokens`` (``--config``, else
the checkpoint's), else 1024.

Output in DIR: ``<NAME>.samples.jsonl`` (one line per sample: benchmark, id, sample,
data_source, domain, prompt, completion, reward, error, finish_reason, response_tokens),
``scores.json`` (per benchmark: ``acc``, the mean reward over all samples, i.e. avg@n;
per domain and data_source; errors; prompts done) and ``settings.json``.

Resumable: samples are appended and flushed after every chunk of ``--batch-size`` prompts,
and a restart skips the ids already in the samples file (a crash loses at most the chunk
in flight; a torn last line is dropped). A restart with different settings (model, n,
sampling, template, rewards, a benchmark's file) is refused. ``--limit N`` evaluates the
first N records of each file, e.g. for a quick look; a later run without it completes.
"""

import argparse
import importlib
import json
import math
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SETTINGS_THAT_CHANGE_RESULTS = ('model', 'base_model', 'n', 'temperature', 'top_p', 'top_k',
                                'max_new_tokens', 'stop_token_ids', 'prompt_template',
                                'rewards', 'route_by')


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('model', help='Hugging Face model directory or an RL checkpoint (.pth)')
    p.add_argument('--data', nargs='+', required=True, metavar='[NAME=]FILE',
                   help='benchmark files (JSONL or Parquet); NAME defaults to the file stem')
    p.add_argument('--out', required=True, type=Path, help='output directory')
    p.add_argument('--backend', choices=('hf', 'lmdeploy'), default='hf')
    p.add_argument('--server-url', help='LMDeploy server, e.g. http://127.0.0.1:23333')
    p.add_argument('--concurrency', type=int, default=64,
                   help='requests in flight (lmdeploy backend)')
    p.add_argument('--base-model', help='architecture and tokenizer for a .pth checkpoint')
    p.add_argument('--tokenizer', help='tokenizer directory (default: MODEL)')
    p.add_argument('--model-class', help="from_pretrained class, e.g. "
                   "'AutoModelForImageTextToText' (default: AutoModelForCausalLM, or the "
                   "checkpoint's model.model_class)")
    p.add_argument('--processor', help='AutoProcessor directory (vision-language models; '
                   'default: MODEL when --model-class is not AutoModelForCausalLM)')
    p.add_argument('--trust-remote-code', action='store_true', default=None,
                   help="allow code shipped with the model")
    p.add_argument('--rewards', help='DOMAIN=Type,... from the REWARDS registry')
    p.add_argument('--config', help='training config whose train_cfg.rewards (and '
                   'prompt_template, sampling.stop_token_ids) to use')
    p.add_argument('--import', dest='imports', nargs='+', default=[], metavar='MODULE',
                   help='modules to import first (they register custom rewards)')
    p.add_argument('--route-by', choices=('domain', 'data_source'), default='domain',
                   help='record field that picks the reward function')
    p.add_argument('--prompt-template', help="str.format template for 'prompt' records")
    p.add_argument('--n', type=int, default=1, help='samples per prompt (avg@n)')
    p.add_argument('--temperature', type=float, default=0.0, help='0 = greedy')
    p.add_argument('--top-p', type=float, default=1.0)
    p.add_argument('--top-k', type=int, default=0)
    p.add_argument('--max-new-tokens', type=int, default=None,
                   help='response length cap (default: train_cfg.sampling.max_new_tokens of '
                        '--config or of the checkpoint\'s config, else 1024)')
    p.add_argument('--stop-token-ids', type=int, nargs='+')
    p.add_argument('--batch-size', type=int, default=32,
                   help='prompts per chunk (generated together, then written and flushed)')
    p.add_argument('--limit', type=int, help='only the first N records of each file')
    p.add_argument('--seed', type=int, default=0, help='torch seed for sampled decoding')
    p.add_argument('--device', help='hf backend: cuda if available, else cpu')
    p.add_argument('--dtype', choices=('auto', 'float32', 'bfloat16', 'float16'),
                   default='auto', help='hf backend: auto = bfloat16 on GPU, float32 on CPU')
    args = p.parse_args(argv)
    if args.backend == 'lmdeploy' and not args.server_url:
        p.error('--backend lmdeploy needs --server-url (start a server with `lmdeploy serve '
                'api_server MODEL --backend pytorch`)')
    if args.backend == 'lmdeploy' and args.model.endswith('.pth'):
        p.error('--backend lmdeploy generates with the server\'s weights; a .pth checkpoint '
                'cannot be served: evaluate it with --backend hf')
    if args.batch_size < 1 or args.n < 1 or (args.limit is not None and args.limit < 1):
        p.error('--batch-size, --n and --limit must be >= 1')
    return args


# ----------------------------------------------------------------------------- inputs
def load_config(path: str | None) -> Any:
    if path is None:
        return None
    from mmengine.config import Config
    return Config.fromfile(path)  # imports the config's custom_imports


def train_cfg_value(cfgs: list[tuple[str, Any]], *keys: str) -> tuple[Any, str | None]:
    """The first config (in priority order) that sets ``train_cfg.<keys>``, and its name."""
    for name, cfg in cfgs:
        node = (cfg or {}).get('train_cfg') or {}
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        if node is not None:
            return node, name
    return None, None


def parse_rewards(spec: str) -> dict[str, dict]:
    rewards = {}
    for item in spec.split(','):
        domain, sep, kind = item.strip().partition('=')
        if not sep or not domain or not kind:
            raise SystemExit(f'--rewards: {item!r} is not DOMAIN=Type (e.g. math=MathReward)')
        rewards[domain] = dict(type=kind)
    return rewards


def parse_benchmarks(items: list[str]) -> dict[str, Path]:
    benchmarks: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition('=')
        if not sep or not name or os.path.exists(item):
            name, path = Path(item).stem, item
        if name in benchmarks:
            raise SystemExit(f'--data: two benchmarks are named {name!r}; name them '
                             f'NAME=FILE')
        if '/' in name:
            raise SystemExit(f'--data: benchmark name {name!r} must not contain "/"')
        benchmarks[name] = Path(path)
    return benchmarks


def load_policy(args: argparse.Namespace) -> Any:
    """The :class:`~gepo_xtuner.model.checkpoint.InferencePolicy` (no model for lmdeploy)."""
    import torch

    from gepo_xtuner.model.checkpoint import load_for_inference

    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    dtype = getattr(torch, args.dtype) if args.dtype != 'auto' else (
        torch.bfloat16 if device.startswith('cuda') else torch.float32)
    policy = load_for_inference(args.model, base_model=args.base_model, tokenizer=args.tokenizer,
                                processor=args.processor, model_class=args.model_class,
                                trust_remote_code=args.trust_remote_code, torch_dtype=dtype,
                                load_model=args.backend == 'hf')
    if policy.model is not None:
        policy.model.to(device)
    return policy


def stop_ids(args: argparse.Namespace, policy: Any, configured: Any) -> tuple[int, ...]:
    if args.stop_token_ids:
        return tuple(args.stop_token_ids)
    if configured:
        return tuple(configured)
    eos = policy.tokenizer.eos_token_id
    ids = {eos} if eos is not None else set()
    try:  # chat models often end a turn with a token other than the tokenizer's EOS
        from transformers import GenerationConfig
        eos = GenerationConfig.from_pretrained(policy.directory).eos_token_id
        ids |= set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    except (OSError, ValueError):
        pass
    if not ids:
        raise SystemExit('no stop token known: the tokenizer has no EOS; pass --stop-token-ids')
    return tuple(sorted(ids))


# ----------------------------------------------------------------------------- output
def read_samples(path: Path, n: int) -> dict[str, list[dict]]:
    """Complete prompts (all ``n`` samples) of a samples file, keeping only those.

    A torn last line (a crash while writing) or a prompt with missing samples is
    dropped, and the file is rewritten without them, so appending stays valid JSONL.
    """
    if not path.exists():
        return {}
    rows: dict[str, list[dict]] = defaultdict(list)
    dirty = False
    with path.open(encoding='utf-8') as fh:
        for line in fh:
            try:
                row = json.loads(line)
                int(row['sample']), float(row['reward'])  # a complete row has both
                rows[str(row['id'])].append(row)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                dirty = True
    done = {rid: sorted(r, key=lambda x: x['sample']) for rid, r in rows.items()
            if sorted(x['sample'] for x in r) == list(range(n))}
    if dirty or len(done) != len(rows):
        tmp = path.with_suffix('.tmp')
        with tmp.open('w', encoding='utf-8') as fh:
            for group in done.values():
                fh.writelines(json.dumps(row) + '\n' for row in group)
        os.replace(tmp, path)
    return done


def summarize(rows_by_id: dict[str, list[dict]], records: list[dict], n: int) -> dict:
    """Scores of one benchmark from its samples (only ids of the current records)."""
    ids = [r['id'] for r in records if r['id'] in rows_by_id]
    rows = [row for rid in ids for row in rows_by_id[rid]]
    out: dict[str, Any] = dict(acc=None, n=n, prompts=len(ids), total_prompts=len(records),
                               complete=len(ids) == len(records), samples=len(rows))
    if not rows:
        return out
    out['acc'] = sum(r['reward'] for r in rows) / len(rows)
    for field in ('domain', 'data_source'):
        groups: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            groups[r[field]].append(r['reward'])
        out[f'by_{field}'] = {k: sum(v) / len(v) for k, v in sorted(groups.items())}
    out['errors'] = sum(r['error'] is not None for r in rows)
    out['truncated'] = sum(r['finish_reason'] == 'length' for r in rows) / len(rows)
    out['mean_response_tokens'] = sum(r['response_tokens'] for r in rows) / len(rows)
    return out


def local(path: str | None) -> str | None:
    """An absolute path for a local file or directory (a restart may run elsewhere)."""
    return str(Path(path).absolute()) if path and os.path.exists(path) else path


def write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix('.tmp')
    tmp.write_text(json.dumps(value, indent=2) + '\n', encoding='utf-8')
    os.replace(tmp, path)


def check_settings(out: Path, settings: dict) -> dict:
    """The merged settings; exits if a restart would mix results of different settings."""
    path = out / 'settings.json'
    if not path.exists():
        return settings
    old = json.loads(path.read_text(encoding='utf-8'))
    diff = [f'{k}: {old.get(k)!r} -> {settings.get(k)!r}' for k in SETTINGS_THAT_CHANGE_RESULTS
            if old.get(k) != settings.get(k)]
    for name, file in settings['benchmarks'].items():
        if name in old.get('benchmarks', {}) and old['benchmarks'][name] != file:
            diff.append(f'benchmark {name}: {old["benchmarks"][name]} -> {file}')
    if diff:
        raise SystemExit(f'{out} holds results of other settings ({"; ".join(diff)}); use '
                         'another --out, or delete the directory to start over')
    return {**settings, 'benchmarks': {**old.get('benchmarks', {}), **settings['benchmarks']}}


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if str(ROOT) not in sys.path:  # so --import reaches modules of the source tree
        sys.path.insert(0, str(ROOT))
    import gepo_xtuner  # noqa: F401  (registers the rewards and backends)
    from gepo_xtuner.data.records import DataFormatError, load_records
    from gepo_xtuner.reward import RewardRouter
    from gepo_xtuner.rollout import (HFRolloutBackend, LMDeployRolloutBackend,
                                     SamplingParams)

    for module in args.imports:
        importlib.import_module(module)
    benchmarks = parse_benchmarks(args.data)
    try:
        data = {name: load_records(path, unique_ids=True) for name, path in benchmarks.items()}
    except (DataFormatError, FileNotFoundError) as exc:
        raise SystemExit(f'error: {exc}') from None
    try:
        policy = load_policy(args)
    except (OSError, ValueError) as exc:
        raise SystemExit(f'error: {exc}') from None
    tokenizer = policy.tokenizer
    cfgs = [('--config', load_config(args.config)), ('the checkpoint', policy.config)]
    if args.rewards:
        rewards, source = parse_rewards(args.rewards), '--rewards'
    else:
        rewards, source = train_cfg_value(cfgs, 'rewards')
        if rewards is None:
            raise SystemExit('no rewards given: pass --rewards math=MathReward,... or --config '
                             'CONFIG (its train_cfg.rewards)')
    template, _ = train_cfg_value(cfgs, 'prompt_template')
    template = args.prompt_template or template or '{prompt}'
    configured_stops, _ = train_cfg_value(cfgs, 'sampling', 'stop_token_ids')
    if args.max_new_tokens is None:  # the length the policy was trained to answer in
        configured, where = train_cfg_value(cfgs, 'sampling', 'max_new_tokens')
        args.max_new_tokens = int(configured) if configured else 1024
        print(f'max_new_tokens {args.max_new_tokens} '
              + (f'(train_cfg.sampling of {where})' if configured else '(default)'))
    try:
        params = SamplingParams(n=args.n, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                                stop_token_ids=stop_ids(args, policy, configured_stops))
    except ValueError as exc:
        raise SystemExit(f'error: {exc}') from None
    try:
        router = RewardRouter(rewards, route_by=args.route_by)
    except KeyError as exc:
        raise SystemExit(f'error: {exc}; register it (--import MODULE) or fix --rewards'
                         ) from None
    print(f'rewards from {source}: ' + ', '.join(f'{k}: {type(v).__name__}'
                                                for k, v in router.fns.items()))

    if args.backend == 'hf':
        if tokenizer.pad_token_id is None:  # batched generation pads; EOS is never attended
            tokenizer.pad_token = tokenizer.eos_token
        rollout = HFRolloutBackend(max_sequences_per_call=args.batch_size * args.n)
    else:
        rollout = LMDeployRolloutBackend(server_url=args.server_url, weight_sync=dict(mode='none'),
                                         max_concurrency=args.concurrency)
    rollout.attach(policy.model, tokenizer)
    import torch
    torch.manual_seed(args.seed)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    settings = dict(model=local(args.model), base_model=local(args.base_model), n=args.n,
                    temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                    max_new_tokens=args.max_new_tokens,
                    stop_token_ids=list(params.stop_token_ids), prompt_template=template,
                    rewards=json.loads(json.dumps(rewards, default=str)),
                    route_by=args.route_by,
                    benchmarks={k: str(v.absolute()) for k, v in benchmarks.items()})
    settings = check_settings(out, settings)
    write_json(out / 'settings.json', settings)
    scores_path = out / 'scores.json'
    scores = json.loads(scores_path.read_text()) if scores_path.exists() else {}
    scores = dict(model=settings['model'], benchmarks=scores.get('benchmarks', {}))
    try:
        for name, records in data.items():
            scores['benchmarks'][name] = evaluate_benchmark(
                name, records, out / f'{name}.samples.jsonl', args, rollout, policy, router,
                params, template)
            write_json(scores_path, scores)
    finally:
        rollout.close()
    print(f'\n{"benchmark":<20} {"acc":>7} {"prompts":>13} {"errors":>7}')
    for name in data:
        s = scores['benchmarks'][name]
        acc = '-' if s['acc'] is None else f'{s["acc"]:.4f}'
        print(f'{name:<20} {acc:>7} {s["prompts"]:>6}/{s["total_prompts"]:<6} '
              f'{s.get("errors", 0):>7}')
    print(f'scores: {scores_path}')
    return 0


def evaluate_benchmark(name: str, records: list[dict], samples_path: Path,
                       args: argparse.Namespace, rollout: Any, policy: Any, router: Any,
                       params: Any, template: str) -> dict:
    """Samples and scores the records (up to ``--limit``) not yet in ``samples_path``.

    Returns:
        The benchmark's scores over every record done so far.
    """
    from gepo_xtuner.engine.step.prompt_encoding import encode_request
    from gepo_xtuner.engine.step.scoring import sample_and_score

    done = read_samples(samples_path, args.n)
    todo = [r for r in records[:args.limit] if r['id'] not in done]
    print(f'{name}: {len(records)} prompts, {len(done)} done before, {len(todo)} to do now')
    start = time.perf_counter()
    with samples_path.open('a', encoding='utf-8') as fh:
        for first in range(0, len(todo), args.batch_size):
            chunk = todo[first:first + args.batch_size]
            try:
                requests = [encode_request(r, policy.tokenizer, policy.processor, template)
                            for r in chunk]
            except ValueError as exc:  # a template or image that does not fit the record
                raise SystemExit(f'error: {name}: {exc}') from None
            scored = sample_and_score(rollout, policy.tokenizer, router, chunk, requests, params)
            for i, record in enumerate(chunk):
                rows = [dict(benchmark=name, id=record['id'], sample=j,
                             data_source=record['data_source'], domain=record['domain'],
                             prompt=record.get('prompt', record.get('messages')),
                             completion=scored.completions[i][j],
                             reward=float(scored.rewards[i, j]), error=scored.errors[i][j],
                             finish_reason=scored.finish_reasons[i][j],
                             response_tokens=scored.response_tokens[i][j])
                        for j in range(args.n)]
                done[record['id']] = rows
                fh.writelines(json.dumps(row, ensure_ascii=False) + '\n' for row in rows)
            fh.flush()
            os.fsync(fh.fileno())  # a crash loses at most the chunk in flight
            finished = first + len(chunk)
            rate = finished / max(time.perf_counter() - start, 1e-9)
            acc = sum(r['reward'] for rows in done.values() for r in rows) / max(
                1, sum(len(rows) for rows in done.values()))
            eta = (len(todo) - finished) / rate if rate > 0 else math.inf
            print(f'{name}: {finished}/{len(todo)} prompts, acc so far {acc:.4f}, '
                  f'{rate:.2f} prompts/s, eta {eta:.0f} s', flush=True)
    return summarize(done, records, args.n)


if __name__ == '__main__':
    sys.exit(main())
