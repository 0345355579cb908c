"""InstructionFollowingReward: IFEval-style verifiable constraints."""

from collections.abc import Mapping
from typing import Any, Literal

from ..registry import REWARDS
from .base import Reward
from .ifeval_checks import CHECKERS, check_instruction

__all__ = ['InstructionFollowingReward']


def _loose_variants(response: str) -> list[str]:
    """IFEval's loose variants: without the first and/or last line, and without ``*``."""
    lines = response.split('\n')
    base = [response, '\n'.join(lines[1:]).strip(), '\n'.join(lines[:-1]).strip(),
            '\n'.join(lines[1:-1]).strip()]
    return [v for v in base + [v.replace('*', '') for v in base] if v.strip()]


def _instructions(record: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if 'instructions' in record:
        items = record['instructions']
        if not isinstance(items, list) or not all(
                isinstance(i, Mapping) and 'id' in i for i in items):
            raise ValueError(f"record {record.get('id', '?')!r}: 'instructions' must be a list "
                             'of {"id": "<IFEval id>", "kwargs": {...}}')
        return [(i['id'], dict(i.get('kwargs') or {})) for i in items]
    if 'instruction_id_list' in record:  # the IFEval dataset's own columns
        ids, kwargs = record['instruction_id_list'], record.get('kwargs') or [{}] * len(
            record['instruction_id_list'])
        if len(ids) != len(kwargs):
            raise ValueError(f"record {record.get('id', '?')!r}: {len(ids)} instruction ids "
                             f'but {len(kwargs)} kwargs')
        return [(i, dict(k or {})) for i, k in zip(ids, kwargs)]
    raise ValueError(f"instruction-following record {record.get('id', '?')!r} has no "
                     "'instructions' (list of {\"id\", \"kwargs\"})")


@REWARDS.register_module()
class InstructionFollowingReward(Reward):
    """Scores a response against the record's verifiable instructions.

    The record lists its instructions as ``instructions: [{"id": "<IFEval id>",
    "kwargs": {...}}]`` (the IFEval columns ``instruction_id_list`` + ``kwargs`` are
    also read). All 25 IFEval instruction types are supported
    (:data:`~gepo_xtuner.reward.ifeval_checks.CHECKERS`); see
    :mod:`~gepo_xtuner.reward.ifeval_checks` for how they differ from the reference
    implementation. An unknown id or wrong arguments raise :class:`ValueError`, which
    the router counts in ``reward/errors/<domain>``.

    Args:
        mode: ``'all'`` (default): 1.0 if every instruction is followed, else 0.0
            (IFEval's prompt-level accuracy, a binary reward); ``'fraction'``: the
            fraction followed (instruction-level accuracy, partial credit).
        loose: also accept an instruction if it holds after dropping the first and/or
            last line or the ``*`` characters (IFEval's loose evaluation; default False).

    Example:
        >>> reward = InstructionFollowingReward(mode='fraction')
        >>> record = {'instructions': [
        ...     {'id': 'punctuation:no_comma', 'kwargs': {}},
        ...     {'id': 'length_constraints:number_words',
        ...      'kwargs': {'num_words': 10, 'relation': 'less than'}}]}
        >>> reward('Short and sweet.', record)
        1.0
        >>> reward('Well, this answer is far longer than ten words, and it has commas.', record)
        0.0
        >>> reward('Ten words would be too many for this one really.', record)
        0.5
    """

    def __init__(self, mode: Literal['all', 'fraction'] = 'all', loose: bool = False) -> None:
        if mode not in ('all', 'fraction'):
            raise ValueError(f"mode must be 'all' or 'fraction', got {mode!r}")
        self.mode = mode
        self.loose = bool(loose)

    def __call__(self, completion: str, record: dict[str, Any]) -> float:
        instructions = _instructions(record)
        if not instructions:
            raise ValueError(f"record {record.get('id', '?')!r} has an empty instruction list")
        responses = _loose_variants(completion) if self.loose else [completion]
        followed = []
        for instruction_id, kwargs in instructions:
            if instruction_id not in CHECKERS:  # fail on the id, before any response
                check_instruction(instruction_id, '', kwargs)
            followed.append(bool(responses) and any(
                check_instruction(instruction_id, r, kwargs) for r in responses))
        if self.mode == 'all':
            return float(all(followed))
        return sum(followed) / len(followed)

    def parse_record(self, record: dict[str, Any]) -> None:
        unknown = [i for i, _ in _instructions(record) if i not in CHECKERS]
        if unknown:
            raise ValueError(f'unknown instruction id(s) {unknown}')
