"""InstructionFollowingReward: IFEval's and IFBench's own reference checkers.

The checkers are the benchmarks' published ``instructions_registry`` modules, as
packaged by ``if-verifiable`` (``if_verifiable.ifeval``: google-research IFEval, 25
instruction types; ``if_verifiable.ifbench``: allenai IFBench, 58 types). Their ids
do not overlap, so a record may mix both. Scoring follows the benchmarks'
``evaluation_lib``: each checker is built with the record's ``kwargs`` (null values
dropped) and, when it asks for one, the record's prompt; *strict* accepts a
non-empty response the checker passes, *loose* accepts it if any of the response
variants without the first line, the last line, both, or the ``*`` characters passes.

No instruction is checked by code of this project. The NLTK data some checkers
read is provided offline by :mod:`gepo_xtuner.reward.nltk_data`.
"""

import inspect
import logging
from collections.abc import Mapping
from typing import Any, Literal

from mmengine.logging import print_log

from ..registry import REWARDS
from .base import Reward

__all__ = ['InstructionFollowingReward', 'instruction_checkers', 'record_instructions']

_CHECKERS: dict[str, tuple[str, type]] | None = None


def instruction_checkers() -> dict[str, tuple[str, type]]:
    """Instruction id -> (benchmark, checker class) of IFEval and IFBench.

    Imported once; provides the English Punkt model first
    (:func:`~gepo_xtuner.reward.nltk_data.ensure_punkt_tab`). IFBench's module tries
    to download the NLTK data it lacks when imported; offline, NLTK prints one error
    per resource, preceded by a warning saying what it means: the checkers that need
    a missing resource are refused when records are checked, with the fix.
    """
    global _CHECKERS
    if _CHECKERS is None:
        from langdetect import DetectorFactory

        from .nltk_data import RESOURCES, ensure_punkt_tab, missing_at_import
        ensure_punkt_tab()
        # IFEval's language checker calls langdetect, which samples: seeded, a response
        # gets the same reward every time (a resumed run repeats the straight one)
        DetectorFactory.seed = 0
        try:
            from if_verifiable.ifeval.instructions_registry import INSTRUCTION_DICT as ifeval
        except ImportError as exc:
            raise ImportError(f'InstructionFollowingReward needs the if-verifiable package '
                              f'(Python >= 3.11): pip install "if-verifiable>=0.1.2,<0.2" '
                              f'({exc})') from exc
        missing = [r for r in missing_at_import() if r in RESOURCES]
        if missing:
            print_log(f'IFBench\'s checkers download the NLTK data {missing} when imported (the '
                      '[nltk_data] lines that follow, if this machine is offline); without it, '
                      f'records with {sorted({i for r in missing for i in RESOURCES[r]})} are '
                      'refused when checked (docs/rewards.md)', logger='current',
                      level=logging.WARNING)
        from if_verifiable.ifbench.instructions_registry import INSTRUCTION_DICT as ifbench
        _CHECKERS = {**{i: ('ifeval', c) for i, c in ifeval.items()},
                     **{i: ('ifbench', c) for i, c in ifbench.items()}}
    return _CHECKERS


def record_instructions(record: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A record's instructions as ``[(id, kwargs), ...]``, null arguments dropped.

    Read from the published IFEval / IFBench columns ``instruction_id_list`` and
    ``kwargs`` (one object per instruction, in order), or from ``instructions:
    [{"id": ..., "kwargs": {...}}]``.

    Raises:
        ValueError: neither form, or lists of different lengths.
    """
    where = f"record {record.get('id', '?')!r}"
    if 'instructions' in record:
        items = record['instructions']
        if not isinstance(items, list) or not all(
                isinstance(i, Mapping) and isinstance(i.get('id'), str) for i in items):
            raise ValueError(f"{where}: 'instructions' must be a list of "
                             '{"id": "<instruction id>", "kwargs": {...}}')
        pairs = [(i['id'], i.get('kwargs')) for i in items]
    elif 'instruction_id_list' in record:
        ids = record['instruction_id_list']
        kwargs = record.get('kwargs')
        kwargs = [{}] * len(ids) if kwargs is None else kwargs
        if not isinstance(ids, list) or not isinstance(kwargs, list) or len(ids) != len(kwargs):
            raise ValueError(f"{where}: 'instruction_id_list' and 'kwargs' must be lists of the "
                             f'same length (one kwargs object per instruction), got '
                             f'{_shape(ids)} and {_shape(kwargs)}')
        pairs = list(zip(ids, kwargs))
    else:
        raise ValueError(f"{where} has no instructions: give the published columns "
                         "'instruction_id_list' and 'kwargs', or 'instructions'")
    for instruction_id, kwargs in pairs:
        if not isinstance(kwargs, (Mapping, type(None))):
            raise ValueError(f'{where}: the kwargs of {instruction_id!r} must be an object, got '
                             f'{type(kwargs).__name__}')
    return [(i, {k: v for k, v in (kw or {}).items() if v is not None}) for i, kw in pairs]


def _shape(value: Any) -> str:
    return f'{len(value)} items' if isinstance(value, list) else type(value).__name__


@REWARDS.register_module()
class InstructionFollowingReward(Reward):
    """Scores a response with the IFEval / IFBench checkers of the record's instructions.

    Records as published (IFEval: ``key``, ``prompt``, ``instruction_id_list``,
    ``kwargs``; IFBench: the same columns, string ``key``) are read as they are;
    ``instructions: [{"id": ..., "kwargs": {...}}]`` is read too.

    Args:
        mode: ``'all'`` (default): 1.0 if every instruction is followed, else 0.0
            (the benchmarks' prompt-level accuracy); ``'fraction'``: the fraction
            followed (instruction-level accuracy, partial credit).
        loose: the benchmarks' loose evaluation instead of the strict one.

    Raises (when records are checked, before the first step):
        ValueError: an unknown instruction id, an argument the checker does not take,
        an argument it needs but the record lacks (the checker would draw it at
        random), a value it refuses, or NLTK data it needs and cannot find.

    Example:
        >>> reward = InstructionFollowingReward(mode='fraction')
        >>> record = {'prompt': 'Describe a cat in under ten words, without commas.',
        ...           'instruction_id_list': ['punctuation:no_comma',
        ...                                   'length_constraints:number_words'],
        ...           'kwargs': [{}, {'num_words': 10, 'relation': 'less than'}]}
        >>> reward('A small furry hunter.', record)
        1.0
        >>> reward('Well, this answer is far longer than ten words, and has commas.', record)
        0.0
        >>> reward('Ten words would be too many for this one really.', record)
        0.5
    """

    def __init__(self, mode: Literal['all', 'fraction'] = 'all', loose: bool = False) -> None:
        if mode not in ('all', 'fraction'):
            raise ValueError(f"mode must be 'all' or 'fraction', got {mode!r}")
        self.mode = mode
        self.loose = bool(loose)
        self.checkers = instruction_checkers()

    def _build(self, instruction_id: str, kwargs: dict[str, Any], prompt: Any) -> Any:
        """The checker of one instruction, built as the benchmarks' evaluation does."""
        entry = self.checkers.get(instruction_id)
        if entry is None:
            raise ValueError(f'unknown instruction id {instruction_id!r}; IFEval has '
                             f'{_ids(self.checkers, "ifeval")}, IFBench has '
                             f'{_ids(self.checkers, "ifbench")}')
        checker = entry[1](instruction_id)
        try:
            checker.build_description(**kwargs)
        except TypeError as exc:
            params = list(inspect.signature(checker.build_description).parameters)
            raise ValueError(f'instruction {instruction_id!r} takes arguments {params}, got '
                             f'{sorted(kwargs)} ({exc})') from None
        args = checker.get_instruction_args()
        if args and 'prompt' in args:
            checker.build_description(prompt=prompt)
        return checker

    def _checkers(self, record: dict[str, Any]) -> list[tuple[str, Any]]:
        instructions = record_instructions(record)
        if not instructions:
            raise ValueError(f"record {record.get('id', '?')!r} has an empty instruction list")
        prompt = record.get('prompt')
        return [(i, self._build(i, kw, prompt)) for i, kw in instructions]

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        responses = _loose_variants(completion) if self.loose else [completion]
        followed = [any(r.strip() and checker.check_following(r) for r in responses)
                    for _, checker in self._checkers(record)]
        if self.mode == 'all':
            return float(all(followed))
        return sum(followed) / len(followed)

    def parse_record(self, record: dict[str, Any]) -> None:
        from .nltk_data import missing_for
        built = self._checkers(record)
        for (instruction_id, kwargs), (_, checker) in zip(record_instructions(record), built):
            keys = [k for k in (checker.get_instruction_args_keys() or ()) if k != 'prompt']
            lacking = [k for k in keys if k not in kwargs]
            if lacking:
                raise ValueError(f'instruction {instruction_id!r} needs the argument(s) '
                                 f'{lacking} in its kwargs (the checker would draw them at '
                                 'random)')
        missing = missing_for([i for i, _ in built])
        if missing:
            lines = '; '.join(f'{", ".join(ids)} read(s) {res}' for res, ids in missing.items())
            names = ' '.join(r.rsplit('/', 1)[-1] for r in missing)
            raise ValueError(f'NLTK data not found: {lines}. Install it on a machine with '
                             f'internet: python -m nltk.downloader -d DIR {names}, then copy DIR '
                             'and set NLTK_DATA=DIR (or drop these instructions)')


def _ids(checkers: dict[str, tuple[str, type]], benchmark: str) -> str:
    ids = sorted(i for i, (b, _) in checkers.items() if b == benchmark)
    return f'{len(ids)} ids ({", ".join(ids[:4])}, ...)'


def _loose_variants(response: str) -> list[str]:
    """The benchmarks' loose variants: the response without its first line, its last line,
    both, and each of these without ``*``."""
    lines = response.split('\n')
    cut = [response, '\n'.join(lines[1:]).strip(), '\n'.join(lines[:-1]).strip(),
           '\n'.join(lines[1:-1]).strip()]
    return cut + [v.replace('*', '') for v in cut]
