"""Write an analysis to disk: JSONL/JSON tables and figures."""

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from .plots import plot_advantages, plot_group_entropy, plot_thresholds
from .rollouts import Analysis, RolloutTable


def _finite_or_none(x: float) -> float | None:
    return None if x is None or math.isnan(x) else float(x)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + '.tmp')
    tmp.write_text(text, encoding='utf-8')
    os.replace(tmp, path)


def write_report(table: RolloutTable, analysis: Analysis, domains: dict[str, dict[str, Any]],
                 out_dir: str | Path, processor_name: str) -> dict[str, Path]:
    """Writes advantages.jsonl, thresholds.jsonl, domains.json and the PNG figures.

    ``advantages.jsonl`` holds every input line in input order with ``advantage``
    (after shaping), ``group_entropy`` (null for groups without tokens),
    ``advantage_raw`` (before shaping) and ``shaped`` (``"low"``, ``"high"`` or
    null) added.

    Returns:
        Name -> path of every file written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {name: out / name for name in ('advantages.jsonl', 'thresholds.jsonl', 'domains.json')}

    row_of_line = dict(zip(table.line_numbers, range(len(table))))
    tmp = paths['advantages.jsonl'].with_name('advantages.jsonl.tmp')
    with table.path.open(encoding='utf-8') as src, tmp.open('w', encoding='utf-8') as dst:
        for lineno, text in enumerate(src, start=1):
            i = row_of_line.get(lineno)
            if i is None:
                continue
            obj = json.loads(text)
            obj['advantage'] = float(analysis.advantages[i])
            obj['group_entropy'] = _finite_or_none(analysis.group_entropy[i])
            obj['advantage_raw'] = float(analysis.raw_advantages[i])
            obj['shaped'] = ('low' if analysis.shaped_low[i] else
                             'high' if analysis.shaped_high[i] else None)
            dst.write(json.dumps(obj) + '\n')
    os.replace(tmp, paths['advantages.jsonl'])

    lines = []
    for t in analysis.thresholds:
        lines.append(json.dumps({k: _finite_or_none(v) if isinstance(v, float) else v
                                 for k, v in t.items()}))
    _atomic_write(paths['thresholds.jsonl'], '\n'.join(lines) + '\n')
    _atomic_write(paths['domains.json'], json.dumps(domains, indent=2) + '\n')

    names = table.domain_names
    dom = np.array([names.index(d) for d in table.domains])
    firsts = sorted({(s, p): i for i, (s, p) in reversed(list(enumerate(
        zip(table.steps, table.prompt_ids))))}.values())
    firsts = np.array([i for i in firsts if not math.isnan(analysis.group_entropy[i])], int)
    per_dom_ent = {n: analysis.group_entropy[firsts[dom[firsts] == k]] for k, n in enumerate(names)}
    n_steps = len(analysis.thresholds)
    span = f'{n_steps} step' + ('s' if n_steps != 1 else '')
    paths['group_entropy_by_domain.png'] = plot_group_entropy(
        per_dom_ent, out / 'group_entropy_by_domain.png', f'Group entropy by domain ({span})')
    paths['advantage_by_domain.png'] = plot_advantages(
        {n: analysis.raw_advantages[dom == k] for k, n in enumerate(names)},
        {n: analysis.advantages[dom == k] for k, n in enumerate(names)},
        out / 'advantage_by_domain.png', f'Advantages by domain, {processor_name} ({span})')
    paths['thresholds.png'] = plot_thresholds(analysis.thresholds, out / 'thresholds.png')
    return paths
