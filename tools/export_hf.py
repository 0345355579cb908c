#!/usr/bin/env python
"""Export a trained RL checkpoint as a Hugging Face model directory.

Usage::

    python tools/export_hf.py work_dirs/run/iter_100.pth --out work_dirs/run/hf
        [--base-model DIR] [--dtype bfloat16] [--trust-remote-code]

The directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``
(in the dtype the policy was trained in, or ``--dtype``), the tokenizer with its chat
template and, for vision-language models, the processor: ``from_pretrained`` loads it and
LMDeploy / vLLM serve it. The architecture and tokenizer come from the ``model`` section of
the training config saved in the checkpoint (paths relative to the directory training ran
in), or from ``--base-model``. To export during training instead, add
``dict(type='HFExportHook')`` to ``custom_hooks`` (README, "Export to Hugging Face").

A checkpoint is a pickle: loading one can run code, so export only checkpoints you trust.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gepo_xtuner.model.export import export_checkpoint  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('checkpoint', help='iter_N.pth written by the RL runner')
    parser.add_argument('--out', required=True, help='output directory (replaced if it exists)')
    parser.add_argument('--base-model', help='architecture / tokenizer directory (default: '
                        "the checkpoint's model.pretrained)")
    parser.add_argument('--dtype', help="weights' dtype, e.g. bfloat16 (default: as trained)")
    parser.add_argument('--trust-remote-code', action='store_true', default=None,
                        help='allow code shipped with the base model')
    args = parser.parse_args(argv)
    if not Path(args.checkpoint).is_file():
        parser.error(f'checkpoint {args.checkpoint} does not exist')
    try:
        out = export_checkpoint(args.checkpoint, args.out, base_model=args.base_model,
                                torch_dtype=args.dtype, trust_remote_code=args.trust_remote_code)
    except (ValueError, FileNotFoundError) as exc:
        print(f'error: {exc}', file=sys.stderr)
        return 1
    print(f'exported {args.checkpoint} -> {out}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
