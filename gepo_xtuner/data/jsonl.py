"""Prompt datasets read from JSONL, validated line by line before training starts."""

import json
from pathlib import Path
from typing import Any

from mmengine.registry import DATASETS, FUNCTIONS
from torch.utils.data import Dataset

REQUIRED = {'prompt': str, 'domain': str}


class DataFormatError(ValueError):
    """A dataset file is unusable; the message starts with ``path:line:``."""


@DATASETS.register_module()
class PromptDataset(Dataset):
    """RL prompts, one JSON object per line.

    Each record needs ``prompt`` (str) and ``domain`` (str, routes the reward);
    ``answer`` (whatever the domain's reward function checks against) and ``id``
    are optional; other fields are kept and passed to the reward function.
    Records without ``id`` get ``'<file stem>-<line>'``.

    Args:
        path: the JSONL file.
        required: extra fields every record must have (e.g. ``['answer']``).

    Raises:
        DataFormatError: naming the file and line of the first bad record.
        FileNotFoundError: if ``path`` does not exist.
    """

    def __init__(self, path: str, required: tuple[str, ...] | list[str] = ()) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f'dataset file {self.path} does not exist')
        self.records: list[dict[str, Any]] = []
        with self.path.open(encoding='utf-8') as fh:
            for lineno, text in enumerate(fh, start=1):
                if text.strip():
                    self.records.append(self._parse(lineno, text, tuple(required)))
        if not self.records:
            raise DataFormatError(f'{self.path}:1: no records (the file is empty)')

    def _parse(self, lineno: int, text: str, required: tuple[str, ...]) -> dict[str, Any]:
        where = f'{self.path}:{lineno}'
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataFormatError(f'{where}: not valid JSON ({exc.msg} at column {exc.colno})'
                                  ) from None
        if not isinstance(record, dict):
            raise DataFormatError(f'{where}: expected a JSON object, got {type(record).__name__}')
        for name, kind in REQUIRED.items():
            if not isinstance(record.get(name), kind) or not record[name]:
                raise DataFormatError(f"{where}: field '{name}' must be a non-empty string, got "
                                      f'{record.get(name)!r}')
        missing = [k for k in required if k not in record]
        if missing:
            raise DataFormatError(f'{where}: missing required field(s) {missing}')
        record.setdefault('id', f'{self.path.stem}-{lineno}')
        return record

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.records[index]

    @property
    def metainfo(self) -> dict[str, Any]:
        return dict(path=str(self.path), num_records=len(self.records),
                    domains=sorted({r['domain'] for r in self.records}))


@FUNCTIONS.register_module()
def list_collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keeps a batch of records as a list of dicts (``collate_fn=dict(type='list_collate')``).

    mmengine's ``pseudo_collate`` would turn it into a dict of lists.
    """
    return list(batch)
