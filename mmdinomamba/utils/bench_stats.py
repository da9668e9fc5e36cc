"""Statistics of repeated speed measurements on a noisy machine.

``tools/analysis/benchmark.py`` times two or more candidates (models, or one model with a switch
on and off) in alternating rounds in one process. A slow spell of a shared machine then falls on
the candidates of one round alike, so the per-round *ratio* is what carries the comparison:

- :func:`round_order` alternates the order within a round (A B, B A, ...), so that no candidate
  always runs first or always after the same other one;
- :func:`paired_ratio` takes the ratio of each round's step times and their median;
- :func:`median_interval` gives that median's distribution-free confidence interval (the
  binomial order-statistics interval: no assumption on how the ratios are distributed, only that
  the rounds are independent), so a goal such as ">= 1.0 x" is established where the whole
  interval lies above it;
- :func:`best_of` reduces repeated separate runs to the fastest one (noise only slows a run);
- :func:`interval_text` formats an interval or a range for the tables.
"""
import math
import statistics


def round_order(items: list, index: int) -> list:
    """The order of round ``index`` (from 0) of alternating runs.

    Args:
        items: the candidates, in their order for even rounds.
        index: the round's number, from 0.

    Returns:
        ``items`` as given in even rounds, reversed in odd ones (A B, B A, A B, ...: a trend
        within a round, or a cost of coming first or after one particular other, falls on every
        item alike over two rounds).
    """
    return items if index % 2 == 0 else items[::-1]


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of the population ``values`` are
    drawn from (independent rounds).

    The interval is the k-th smallest and k-th largest value, with k the largest count for which
    fewer than k of n values fall below the median with probability at most (1 - level) / 2
    (``Binomial(n, 1/2)``); its coverage is at least ``level``.

    Args:
        values: one value per independent round, in any order.
        level: the confidence level.

    Returns:
        ``(low, high)``, or None when n is too small for any such k (n < 6 at 95%).
    """
    n, tail = len(values), (1 - level) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1)
    while k < n // 2:
        nxt = below + math.comb(n, k) / 2 ** n
        if nxt > tail:
            break
        k, below = k + 1, nxt
    if k == 0:
        return None
    ordered = sorted(values)
    return ordered[k - 1], ordered[n - k]


def paired_ratio(times: dict, name: str, ref: str) -> dict:
    """The speed ratio of ``name`` to ``ref`` from step times measured in the same rounds.

    Args:
        times: per candidate, its step time (s) in each round, rounds in the same order for all.
        name: the candidate whose speed is compared.
        ref: the candidate it is compared with.

    Returns:
        ``speed_ratio_rounds``: each round's ratio (``ref``'s step time over ``name``'s);
        ``speed_ratio``: their median; ``speed_ratio_ci``: its 95% confidence interval
        (:func:`median_interval`; None below 6 rounds).
    """
    ratios = [r / t for r, t in zip(times[ref], times[name])]
    return dict(speed_ratio=statistics.median(ratios), speed_ratio_ci=median_interval(ratios),
                speed_ratio_rounds=ratios)


def interval_text(interval: tuple[float, float] | None, digits: int) -> str:
    """``lo-hi`` of an interval (:func:`median_interval`'s, or the rounds' range) with
    ``digits`` decimals, or ``-`` for None (too few rounds for :func:`median_interval`)."""
    return '-' if interval is None else f'{interval[0]:.{digits}f}-{interval[1]:.{digits}f}'


def best_of(runs: list[dict]) -> dict:
    """One result from repeated runs of a case.

    Args:
        runs: one result per run, each with ``imgs`` (img/s; nan when the run failed, e.g. out of
            memory) and ``mem`` (peak memory).

    Returns:
        The run with the highest img/s (noise on a shared machine only slows a run down), its
        ``mem`` replaced by the highest peak memory of all runs and ``imgs_runs`` listing every
        run's img/s.
    """
    best = dict(max(runs, key=lambda r: r['imgs'] if r['imgs'] == r['imgs'] else -1.0))
    best['mem'] = max(r['mem'] for r in runs)
    best['imgs_runs'] = [r['imgs'] for r in runs]
    return best
