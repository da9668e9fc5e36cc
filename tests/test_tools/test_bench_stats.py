"""mmdinomamba.utils.bench_stats: the statistics of benchmark.py's alternating rounds."""
import math

from mmdinomamba.utils.bench_stats import (best_of, interval_text, median_interval, paired_ratio,
                                           round_order)


def test_round_order_reverses_every_other_round():
    """A B C, C B A, A B C, ...; the list given is not changed."""
    items = ['a', 'b', 'c']
    assert [round_order(items, i) for i in range(4)] == [
        ['a', 'b', 'c'], ['c', 'b', 'a'], ['a', 'b', 'c'], ['c', 'b', 'a']]
    assert items == ['a', 'b', 'c']


def test_median_interval_is_the_binomial_order_statistics_interval():
    """The median's 95% interval: the k-th smallest and largest of n rounds, k the largest with
    P(Binomial(n, 1/2) < k) <= 2.5% (so coverage >= 95%, and one step narrower falls short);
    the textbook values at n = 6, 10, 16 and 40; the values' order does not matter."""
    for n in range(1, 61):
        interval = median_interval([float(v) for v in range(n, 0, -1)])
        below = [sum(math.comb(n, i) for i in range(k)) / 2 ** n for k in range(n + 1)]
        if interval is None:
            assert below[1] > 0.025
            continue
        k = int(interval[0])  # the k-th smallest of 1..n is k
        assert interval[1] == n + 1 - k and 1 - 2 * below[k] >= 0.95 > 1 - 2 * below[k + 1]
    assert [median_interval(list(range(1, n + 1))) for n in (5, 6, 10, 16, 40)] == [
        None, (1, 6), (2, 9), (4, 13), (14, 27)]


def test_median_interval_widens_with_the_level():
    """A higher level needs more rounds and gives a wider interval from the same values."""
    values = list(range(1, 17))
    assert median_interval(values, level=0.5) == (7, 10)
    assert median_interval(values) == (4, 13)
    assert median_interval(values, level=0.999) == (2, 15)
    assert median_interval(list(range(1, 7)), level=0.99) is None


def test_paired_ratio_is_the_median_of_the_rounds_ratios():
    """ref's step time over name's in each round (faster -> above 1), their median, and no
    interval below 6 rounds."""
    times = {'ref': [2.0, 1.0, 3.0], 'model': [4.0, 1.0, 2.0]}
    ratio = paired_ratio(times, 'model', 'ref')
    assert ratio == dict(speed_ratio=1.0, speed_ratio_ci=None,
                         speed_ratio_rounds=[0.5, 1.0, 1.5])
    times = {'ref': [1.1, 1.2, 0.9, 1.05, 1.15, 1.3, 1.08, 1.12, 1.02], 'model': [1.0] * 9}
    ratio = paired_ratio(times, 'model', 'ref')
    assert ratio['speed_ratio'] == 1.1 and ratio['speed_ratio_ci'] == (1.02, 1.2)


def test_interval_text_formats_intervals_and_missing_ones():
    assert interval_text((1.0234, 1.2), 2) == '1.02-1.20'
    assert interval_text((0.5, 1.5), 3) == '0.500-1.500'
    assert interval_text(None, 2) == '-'


def test_best_of_keeps_the_fastest_run_and_the_highest_peak():
    """The fastest run's numbers, the highest peak of all runs, every run's img/s; a failed run
    (nan img/s, e.g. out of memory) is never the best unless all failed."""
    runs = [dict(imgs=3.0, mem=101.0, params=1.0), dict(imgs=5.0, mem=102.0, params=1.0),
            dict(imgs=float('nan'), mem=110.0, params=1.0)]
    best = best_of(runs)
    assert best['imgs'] == 5.0 and best['mem'] == 110.0 and best['params'] == 1.0
    assert best['imgs_runs'][:2] == [3.0, 5.0] and math.isnan(best['imgs_runs'][2])
    assert runs[1]['mem'] == 102.0  # the runs themselves are not changed
    assert math.isnan(best_of([dict(imgs=float('nan'), mem=1.0)])['imgs'])
