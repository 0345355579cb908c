"""Offline analysis of rollouts dumped by any trainer (see ``tools/analyze_rollouts.py``)."""

from .rollouts import (RolloutFormatError, RolloutTable, analyze_rollouts, load_rollouts,
                       summarize_domains)

__all__ = ['RolloutFormatError', 'RolloutTable', 'load_rollouts', 'analyze_rollouts',
           'summarize_domains']
