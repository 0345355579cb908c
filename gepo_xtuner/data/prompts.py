"""From a record to the prompt token ids the policy sees."""

from typing import Any


def encode_prompt(tokenizer: Any, record: dict[str, Any], template: str = '{prompt}'
                  ) -> list[int]:
    """Token ids of a record's prompt.

    * ``prompt`` records: ``template.format(**record)`` tokenised with the
      tokenizer's own convention for special tokens (BOS or not), as in SFT. The
      template may name any field of the record, e.g. ``'{prompt}='``.
    * ``messages`` records: the tokenizer's chat template with the generation
      prompt appended (``apply_chat_template(..., add_generation_prompt=True)``);
      ``template`` does not apply.

    Args:
        tokenizer: a Hugging Face tokenizer.
        record: a record in the schema of :mod:`gepo_xtuner.data.records`.
        template: ``str.format`` template for ``prompt`` records.

    Raises:
        ValueError: the template names a field the record lacks, or the record has
            ``messages`` and the tokenizer no chat template.
    """
    if 'messages' in record:
        if not getattr(tokenizer, 'chat_template', None):
            raise ValueError(f'record {record.get("id", "?")!r} gives "messages", but the '
                             'tokenizer has no chat template; use a tokenizer whose '
                             'tokenizer_config.json sets chat_template, or give the prompt as '
                             'text in "prompt"')
        # rendered, then tokenised without added specials, as apply_chat_template(tokenize=True)
        # does; its return type differs between transformers 4 (ids) and 5 (a BatchEncoding)
        text = tokenizer.apply_chat_template(record['messages'], add_generation_prompt=True,
                                             tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)['input_ids'])
    try:
        text = template.format(**record)
    except KeyError as exc:
        raise ValueError(f'prompt_template {template!r} names the field {exc.args[0]!r}, which '
                         f'record {record.get("id", "?")!r} does not have') from None
    return tokenizer(text)['input_ids']
