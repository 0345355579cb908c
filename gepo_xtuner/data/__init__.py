"""Task data: the record schema and its loaders.

The synthetic multi-domain task mix of the CPU demo lives in
:mod:`gepo_xtuner.testbed.synthetic_tasks`; it is a fixture, not part of the library,
and ``import gepo_xtuner`` does not import it.
"""

from .jsonl import PromptDataset, list_collate  # registers them with mmengine
from .mixture import PromptMixture
from .prompts import encode_prompt
from .records import DataFormatError, iter_records, load_records, validate_record

__all__ = ['DataFormatError', 'PromptDataset', 'PromptMixture', 'encode_prompt', 'iter_records',
           'list_collate', 'load_records', 'validate_record']
