from __future__ import annotations

import pytest

from k25exp.stats import mean, median, percentile


def test_percentile_hand_computed():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == pytest.approx(2.5)
    assert percentile([1.0, 2.0, 3.0, 4.0], 90) == pytest.approx(3.7)  # pos 2.7: 3 + 0.7 * 1
    assert percentile([10.0, 20.0, 30.0, 40.0, 50.0], 90) == pytest.approx(46.0)  # pos 3.6
    assert percentile([10.0, 20.0, 30.0, 40.0, 50.0], 50) == 30.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([5.0], 90) == 5.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_median_and_mean():
    assert median([3.0, 1.0, 2.0]) == 2.0 and mean([1.0, 2.0, 6.0]) == 3.0
    with pytest.raises(ValueError):
        mean([])
