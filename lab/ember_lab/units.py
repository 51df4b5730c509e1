"""The units `ember plan` and the bench read link rates, latencies and counts in (a leaf).

imports: nothing of the lab; nothing of ember either
"""

from __future__ import annotations

import re

_UNITS = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_bandwidth(text: str) -> float:
    """'1Gbit', '100Mbit', '10GB/s', '125MB' -> bytes per second."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|b|byte)?(/s|ps)?\s*", text, re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"bandwidth {text!r}: give a number and a unit, e.g. 1Gbit or 100MB")
    value = float(match.group(1)) * _UNITS[match.group(2).lower()]
    unit = match.group(3) or "bit"
    is_bits = unit.lower() == "bit" or unit == "b"  # 'b' is bits, 'B' bytes
    return value / 8 if is_bits else value


def parse_bandwidths(text: str) -> list[float]:
    """'1Gbit,100Mbit' -> bytes per second of each link rate, in the order given."""
    rates = [parse_bandwidth(part) for part in text.split(",") if part.strip()]
    if not rates:
        raise ValueError(f"bandwidth {text!r}: give rates like 1Gbit or 1Gbit,100Mbit")
    return rates


def parse_latency(text: str) -> float:
    """'0.5ms', '50us', '0.001s', '2' (milliseconds) -> seconds."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(us|ms|s)?\s*", text)
    if not match:
        raise ValueError(f"latency {text!r}: give a number and a unit, e.g. 0.5ms or 50us")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2) or "ms"]
    return float(match.group(1)) * scale


def parse_counts(text: str) -> list[int]:
    """'1,2,4,...,64' -> [1, 2, 4, 8, 16, 32, 64]: '...' continues the last ratio (or step)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    counts: list[int] = []
    try:
        for index, part in enumerate(parts):
            if part != "...":
                counts.append(int(part))
                continue
            if len(counts) < 2 or index + 1 >= len(parts):
                raise ValueError
            last, before, stop = counts[-1], counts[-2], int(parts[index + 1])
            ratio = last / before if before and last % before == 0 and last > before else None
            value = last * int(ratio) if ratio else last + (last - before)
            while value < stop:
                counts.append(value)
                value = value * int(ratio) if ratio else value + (last - before)
    except ValueError:
        raise ValueError(f"{text!r}: give counts like 1,2,4 or 1,2,4,...,64") from None
    if not counts or min(counts) < 1 or sorted(counts) != counts:
        raise ValueError(f"{text!r}: give increasing counts >= 1, like 1,2,4,...,64")
    return counts
