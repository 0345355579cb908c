"""Task data: the synthetic multi-domain task mix and JSONL helpers."""

from .synthetic_tasks import (DOMAINS, MAX_ANSWER_CHARS, TASK_CHARS, build_task_files,
                              generate_split, make_record, read_jsonl, score, split_of,
                              write_jsonl)

__all__ = [
    'DOMAINS', 'MAX_ANSWER_CHARS', 'TASK_CHARS', 'build_task_files', 'generate_split',
    'make_record', 'read_jsonl', 'score', 'split_of', 'write_jsonl'
]
