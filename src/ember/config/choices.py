"""A field that takes one of a few names: its one error, offering the nearest name when there
is one ("did you mean easgd-async?"), in the words of the field as the caller spelt it.

imports: errors (a leaf under config)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from ember.errors import ConfigError


def did_you_mean(wrong: list[str], known: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The words offering the nearest of `known` for each name in `wrong` that has one, "did
    you mean X?" (naming which is for which when there are several); None when none is near."""
    known = list(known)
    near = {name: difflib.get_close_matches(name, known, 1, cutoff) for name in wrong}
    offers = [(name, match[0]) for name, match in near.items() if match]
    if len(offers) == 1 and len(wrong) == 1:
        return f"did you mean {offers[0][1]}?"
    if offers:
        return f"did you mean {', '.join(f'{m} for {n}' for n, m in offers)}?"
    return None


def not_one_of(name: str, value: object, allowed: Iterable[str]) -> ConfigError:
    """The error for `value` of field `name`, which takes one of `allowed`."""
    allowed = [str(a) for a in allowed]
    message = f"{name} must be one of {', '.join(allowed)}; got {value!r}"
    # nearer than a field name must be: a few short names are all alike ("gossip", "ssp")
    near = did_you_mean([value], allowed, 0.7) if isinstance(value, str) else None
    return ConfigError(f"{message}: {near}" if near else message)


def one_of(name: str, value: object, allowed: Iterable[str]) -> None:
    if value not in tuple(allowed):
        raise not_one_of(name, value, allowed)
