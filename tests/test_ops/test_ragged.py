"""pad_ragged: ragged per-response values as a padded (N, T) batch and its mask."""

import random

import pytest
import torch

from gepo_xtuner.ops.ragged import pad_ragged


def padded_by_rows(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The row-by-row padding the slime and XTuner v1 adapters did before pad_ragged."""
    width = max(1, max(len(r) for r in rows))
    values = torch.zeros(len(rows), width, dtype=torch.float32)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, row in enumerate(rows):
        if row:
            values[i, :len(row)] = torch.tensor(row, dtype=torch.float32)
            mask[i, :len(row)] = True
    return values, mask


@pytest.mark.parametrize('seed', range(20))
def test_equals_the_row_by_row_padding_on_random_ragged_rows(seed):
    rng = random.Random(seed)
    rows = [[-rng.expovariate(1.0) for _ in range(rng.choice([0, 0, 1, rng.randint(1, 40)]))]
            for _ in range(rng.randint(1, 12))]
    values, mask = pad_ragged(rows)
    expected_values, expected_mask = padded_by_rows(rows)
    assert values.dtype == torch.float32 and mask.dtype == torch.bool
    assert torch.equal(values, expected_values) and torch.equal(mask, expected_mask)


def test_all_empty_rows_get_one_masked_column():
    values, mask = pad_ragged([[], []])
    assert values.shape == mask.shape == (2, 1) and not mask.any()


def test_dtype_pad_value_and_width():
    values, mask = pad_ragged([[1.5], [2.0, 3.0]], dtype=torch.float64, pad_value=-1.0,
                              min_width=4)
    assert values.dtype == torch.float64
    assert values.tolist() == [[1.5, -1.0, -1.0, -1.0], [2.0, 3.0, -1.0, -1.0]]
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False]]


def test_no_rows():
    values, mask = pad_ragged([])
    assert values.shape == mask.shape == (0, 1)
