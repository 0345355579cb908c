"""Several prompt files read as one training set, each with its own field mapping."""

from typing import Any

from mmengine.registry import DATASETS

from .jsonl import PromptDataset, RecordDataset


@DATASETS.register_module()
class PromptMixture(RecordDataset):
    """The records of several :class:`PromptDataset` s, one after the other.

    Each part is a dataset config (or a built ``PromptDataset``) with its own
    ``path``, ``fields``, ``default_domain`` and ``required``, so files in their
    published schemas mix without conversion (GSM8K's ``question`` / ``answer`` next
    to instruction and code records). ``records`` is the concatenation, which the RL
    loop checks against the rewards before the first step; the sampler shuffles it.

    Example::

        dataset=dict(type='PromptMixture', datasets=[
            dict(type='PromptDataset', path='gsm8k.jsonl', fields=dict(prompt='question'),
                 default_domain='math', required=['answer']),
            dict(type='PromptDataset', path='code.jsonl', required=['tests'])])

    Args:
        datasets: the parts, in order.

    Raises:
        ValueError: no parts, or a part that is not a ``PromptDataset``.
    """

    def __init__(self, datasets: list[dict | PromptDataset]) -> None:
        if not datasets:
            raise ValueError('PromptMixture.datasets is empty: list at least one '
                             "dict(type='PromptDataset', path=...)")
        parts = [DATASETS.build(d) if isinstance(d, dict) else d for d in datasets]
        for i, part in enumerate(parts):
            if not isinstance(part, PromptDataset):
                raise ValueError(f'PromptMixture.datasets[{i}] is a {type(part).__name__}; '
                                 'each part must be a PromptDataset')
        self.datasets = parts
        self.records: list[dict[str, Any]] = [r for part in parts for r in part.records]

    @property
    def metainfo(self) -> dict[str, Any]:
        return dict(paths=[str(p.path) for p in self.datasets], **self.records_info())
