"""The few statistics the scripts print."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) with linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def spread(ms: list[float], bound_ms: float | None = None) -> str:
    """Milliseconds summed up: how many, median, p95, p99, max (and how many over ``bound_ms``)."""
    if not ms:
        return "no samples"
    text = f"n={len(ms):<5} median {percentile(ms, 0.5):7.2f}  p95 {percentile(ms, 0.95):7.2f}"
    text += f"  p99 {percentile(ms, 0.99):7.2f}  max {max(ms):7.2f} ms"
    return text + (f"  (over {bound_ms:g} ms: {sum(m > bound_ms for m in ms)})" if bound_ms is not None else "")
