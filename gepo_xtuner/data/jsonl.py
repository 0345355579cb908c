"""Prompt datasets read from JSONL or Parquet, validated record by record before training."""

from pathlib import Path
from typing import Any

from mmengine.registry import DATASETS, FUNCTIONS
from torch.utils.data import Dataset

from .records import DataFormatError, check_field_map, load_records

__all__ = ['DataFormatError', 'PromptDataset', 'list_collate']


class RecordDataset(Dataset):
    """A map-style dataset of prompt records (``self.records``, set by the subclass)."""

    records: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.records[index]

    def records_info(self) -> dict[str, Any]:
        """``num_records`` and the sorted ``domains`` and ``data_sources`` present."""
        return dict(num_records=len(self.records),
                    domains=sorted({r['domain'] for r in self.records}),
                    data_sources=sorted({r['data_source'] for r in self.records}))


@DATASETS.register_module()
class PromptDataset(RecordDataset):
    """RL prompts in the record schema of :mod:`gepo_xtuner.data.records`.

    Each record needs ``prompt`` (str) or ``messages`` (chat turns) and ``domain``
    (str, routes the reward); the reference fields (``answer``, ``tests``, ...) are
    checked for type and passed to the reward function with any other field.
    Records without ``id`` get ``'<file stem>-<line>'`` (Parquet: ``-<row>``);
    ``data_source`` defaults to ``domain``; relative image paths are resolved
    against the file's directory, and must exist.

    Files with other column names need no conversion: ``fields`` renames them, and
    ``default_domain`` gives every record without a ``domain`` one. GSM8K as
    published (``{"question": ..., "answer": "...reasoning... #### 72"}``)::

        dataset=dict(type='PromptDataset', path='gsm8k/train.jsonl',
                     fields=dict(prompt='question', answer='answer'),
                     default_domain='math', required=['answer'])

    (``MathReward`` takes the text after ``####`` as the reference.)

    Args:
        path: a JSONL file, or a ``.parquet`` file.
        required: extra fields every record must have (e.g. ``['answer']``), named
            as after the renaming.
        fields: record field <- source field, e.g. ``dict(prompt='question')``; a
            mapped field is read from its source only, and the source field is renamed.
        default_domain: the ``domain`` of records that have none (e.g. ``'math'``).

    Raises:
        DataFormatError: naming the file and line (row) of the first bad record, with
            every problem of that record.
        FileNotFoundError: if ``path`` does not exist.
        ValueError: ``fields`` or ``default_domain`` is malformed.
    """

    def __init__(self, path: str, required: tuple[str, ...] | list[str] = (),
                 fields: dict[str, str] | None = None, default_domain: str | None = None
                 ) -> None:
        if default_domain is not None and (not isinstance(default_domain, str)
                                           or not default_domain.strip()):
            raise ValueError(f'PromptDataset default_domain must be a non-empty string such as '
                             f"'math', got {default_domain!r}")
        self.path = Path(path)
        self.fields = check_field_map(fields)
        self.default_domain = default_domain
        self.records: list[dict[str, Any]] = load_records(
            self.path, required=tuple(required), fields=self.fields,
            default_domain=default_domain)

    @property
    def metainfo(self) -> dict[str, Any]:
        return dict(path=str(self.path), **self.records_info())


@FUNCTIONS.register_module()
def list_collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keeps a batch of records as a list of dicts (``collate_fn=dict(type='list_collate')``).

    mmengine's ``pseudo_collate`` would turn it into a dict of lists.
    """
    return list(batch)
