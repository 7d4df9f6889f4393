"""A measured curve read between its points: the cost model's rates by size and shape."""

from __future__ import annotations

import itertools
import math


def interpolate(points: list, x: float, *, extend: bool = False) -> float:
    """Linear between sorted ``(x, y)`` points; below the first, its ``y``; beyond the last, its
    ``y``, or with ``extend`` along the last two points' slope (never downward)."""
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if not extend:
        return points[-1][1]
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + max(y1 - y0, 0.0) * (x - x1) / (x1 - x0)


def at_size(rates: dict[str, float], nbytes: float, unit: int = 1) -> float:
    """A rate measured per size (keys: sizes in ``unit`` bytes) at ``nbytes``: log-linear between the measured sizes,
    the nearest one outside them."""
    points = sorted((math.log(int(size) * unit), rate) for size, rate in rates.items())
    return interpolate(points, math.log(max(nbytes, 1.0)))
