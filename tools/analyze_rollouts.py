#!/usr/bin/env python
"""Replay rollouts dumped by any trainer through an advantage processor.

Usage::

    python tools/analyze_rollouts.py ROLLOUTS.jsonl --out DIR \
        [--advantage GEPOAdvantage] [--cfg-options alpha_low=0.5 gamma=0.01 ...]

Each input line is one response: ``{"step", "prompt_id", "domain", "reward",
"logprobs"}``. Writes ``advantages.jsonl``, ``thresholds.jsonl``, ``domains.json``
and PNG figures (group entropy and advantages by domain, thresholds over steps)
to DIR. Exits with status 2 and a ``file:line:`` message on bad input.
"""

import argparse
import inspect
import sys

from mmengine.config import DictAction

import gepo_xtuner  # noqa: F401  (registers the processors)
from gepo_xtuner.analysis import (RolloutFormatError, analyze_rollouts, load_rollouts,
                                  summarize_domains)
from gepo_xtuner.analysis.report import write_report
from gepo_xtuner.registry import ADVANTAGES


def build_processor(name: str, options: dict):
    cls = ADVANTAGES.get(name)
    if cls is None:
        raise SystemExit(f'error: --advantage {name!r} is not registered; choose one of '
                         f'{sorted(ADVANTAGES.module_dict)}')
    params = [p for p in inspect.signature(cls.__init__).parameters if p != 'self']
    nested: dict = {}
    for key, value in options.items():  # 'base.type=RLOOAdvantage' -> base=dict(type=...)
        *parents, leaf = key.split('.')
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    options = nested
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise SystemExit(f'error: --cfg-options {unknown} are not parameters of {name}; '
                         f'valid: {params}')
    try:
        return ADVANTAGES.build(dict(type=name, **options))
    except (TypeError, ValueError, KeyError) as exc:
        raise SystemExit(f'error: --cfg-options: {exc}') from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        epilog="GEPO's entropy band starts at the first step's own statistics (H(0) = "
        'Hhat(0)) and moves by gamma per step: with gamma=0.01 the first step anchors the '
        'thresholds for about 100 steps (its weight at step t is (1-gamma)^(t-1)).')
    parser.add_argument('rollouts', help='JSONL file, one response per line')
    parser.add_argument('--out', required=True, help='output directory')
    parser.add_argument('--advantage', default='GEPOAdvantage',
                        help='advantage processor registry name (default: GEPOAdvantage)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='processor parameters, e.g. alpha_low=0.5 beta_high=0.3 gamma=0.01; '
                        'a shaper\'s estimator as base.type=RLOOAdvantage')
    args = parser.parse_args(argv)

    processor = build_processor(args.advantage, dict(args.cfg_options))
    try:
        table = load_rollouts(args.rollouts)
        analysis = analyze_rollouts(table, processor)
    except (RolloutFormatError, FileNotFoundError) as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 2
    domains = summarize_domains(table, analysis)
    paths = write_report(table, analysis, domains, args.out, args.advantage)

    print(f'{len(table)} responses, {len(analysis.thresholds)} steps, '
          f'{len(domains)} domains, processor {processor!r}')
    header = f'{"domain":<24}{"groups":>7}{"H_g mean":>10}{"acc":>7}{"skew":>8}' \
             f'{"skew out":>9}{"low%":>7}{"high%":>7}'
    note = processor.start_note(processor.init_state())
    if note:
        print(note)
    print(header)
    fmt = lambda v, w, p: f'{"-":>{w}}' if v is None else f'{v:>{w}.{p}f}'  # noqa: E731
    for name, d in domains.items():
        print(f'{name:<24}{d["num_groups"]:>7}{fmt(d["group_entropy_mean"], 10, 3)}'
              f'{fmt(d["accuracy"], 7, 3)}{fmt(d["advantage_skewness_before"], 8, 2)}'
              f'{fmt(d["advantage_skewness_after"], 9, 2)}{100 * d["frac_shaped_low"]:>7.1f}'
              f'{100 * d["frac_shaped_high"]:>7.1f}')
    for path in paths.values():
        print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
