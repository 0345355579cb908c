"""Task data: the record schema and its loaders, the synthetic multi-domain task mix."""

from .jsonl import PromptDataset, list_collate  # registers them with mmengine
from .prompts import encode_prompt
from .records import DataFormatError, iter_records, load_records, validate_record
from .synthetic_tasks import (DOMAINS, MAX_ANSWER_CHARS, TASK_CHARS, build_task_files,
                              generate_split, make_record, read_jsonl, score, split_of,
                              write_jsonl)

__all__ = [
    'DOMAINS', 'MAX_ANSWER_CHARS', 'TASK_CHARS', 'DataFormatError', 'PromptDataset',
    'build_task_files', 'encode_prompt', 'generate_split', 'iter_records', 'list_collate',
    'load_records', 'make_record', 'read_jsonl', 'score', 'split_of', 'validate_record',
    'write_jsonl'
]
