"""Prompt datasets read from JSONL or Parquet, validated record by record before training."""

from pathlib import Path
from typing import Any

from mmengine.registry import DATASETS, FUNCTIONS
from torch.utils.data import Dataset

from .records import DataFormatError, load_records

__all__ = ['DataFormatError', 'PromptDataset', 'list_collate']


@DATASETS.register_module()
class PromptDataset(Dataset):
    """RL prompts in the record schema of :mod:`gepo_xtuner.data.records`.

    Each record needs ``prompt`` (str) or ``messages`` (chat turns) and ``domain``
    (str, routes the reward); the reference fields (``answer``, ``tests``, ...) are
    checked for type and passed to the reward function with any other field.
    Records without ``id`` get ``'<file stem>-<line>'`` (Parquet: ``-<row>``);
    ``data_source`` defaults to ``domain``; relative image paths are resolved
    against the file's directory, and must exist.

    Args:
        path: a JSONL file, or a ``.parquet`` file.
        required: extra fields every record must have (e.g. ``['answer']``).

    Raises:
        DataFormatError: naming the file and line (row) of the first bad record.
        FileNotFoundError: if ``path`` does not exist.
    """

    def __init__(self, path: str, required: tuple[str, ...] | list[str] = ()) -> None:
        self.path = Path(path)
        self.records: list[dict[str, Any]] = load_records(self.path, required=tuple(required))

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.records[index]

    @property
    def metainfo(self) -> dict[str, Any]:
        return dict(path=str(self.path), num_records=len(self.records),
                    domains=sorted({r['domain'] for r in self.records}),
                    data_sources=sorted({r['data_source'] for r in self.records}))


@FUNCTIONS.register_module()
def list_collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keeps a batch of records as a list of dicts (``collate_fn=dict(type='list_collate')``).

    mmengine's ``pseudo_collate`` would turn it into a dict of lists.
    """
    return list(batch)
