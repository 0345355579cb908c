"""What reaches the console: third-party notices that say nothing about the run are dropped."""

import logging

from gepo_xtuner.engine.runtime.runner import THIRD_PARTY_NOISE, quiet_third_party


def test_transformers_generate_notice_is_dropped_and_other_records_pass(caplog):
    quiet_third_party()
    quiet_third_party()  # idempotent: one filter per logger
    name = 'transformers.generation.utils'
    logger = logging.getLogger(name)
    assert sum(type(f).__name__ == 'PrefixFilter' for f in logger.filters) == 1
    with caplog.at_level(logging.WARNING):
        logger.warning(THIRD_PARTY_NOISE[name][0] + ' ... set `return_legacy_cache=True`.')
        logger.warning('Setting `pad_token_id` to `eos_token_id`')
    assert [r.getMessage() for r in caplog.records] == ['Setting `pad_token_id` to `eos_token_id`']
