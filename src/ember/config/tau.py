"""What `tau` may say: a fixed communication period, or `auto` / `loss`, the policies that choose
it while a run trains (ember.algorithms.period; docs/tau.md). Checked before anything starts.
Leaf module: imports only ember.errors."""

from __future__ import annotations

from typing import Any

from ember.config.choices import not_one_of
from ember.errors import ConfigError

TAU_POLICIES = ("fixed", "auto", "loss")
ADAPTIVE_STRATEGIES = ("easgd-async",)  # whose workers may choose their periods alone
# whose rounds take one period for all workers, which rank 0 names under auto (diloco's
# AgreedPeriod, algorithms/agreed.py); the loss trigger is each worker's own, so not that
AGREED_STRATEGIES = ("diloco",)


def split_tau(values: dict[str, Any]) -> None:
    """`tau: auto` or `tau: loss` (a flag, a YAML file, `ember.fit`) sets tau_policy in
    `values`, leaving tau to its default as the starting period; any other text is an error."""
    tau = values.get("tau")
    if not isinstance(tau, str):
        return
    if tau not in TAU_POLICIES[1:]:
        raise ConfigError(f"tau must be an integer >= 1, auto or loss; got {tau!r}")
    policy = values.get("tau_policy")
    if policy not in (None, tau):
        raise ConfigError(f"tau {tau} contradicts tau_policy {policy!r}; give one of them")
    del values["tau"]
    values["tau_policy"] = tau


def check_tau_policy(policy: object, strategy: str) -> None:
    """The adaptive periods need workers that exchange when each alone decides (easgd-async),
    or, for auto, rounds whose period one worker names for all (diloco)."""
    if policy not in TAU_POLICIES:
        raise not_one_of("tau_policy", policy, TAU_POLICIES)
    if policy == "fixed" or strategy in ADAPTIVE_STRATEGIES:
        return
    if policy == "auto" and strategy in AGREED_STRATEGIES:
        return
    applies = f"tau {policy} applies to strategy {', '.join(ADAPTIVE_STRATEGIES)} only"
    if strategy == "diloco":
        raise ConfigError(
            f"tau {policy} applies to strategy easgd-async, and auto to diloco: diloco's"
            " workers exchange in rounds of one period, which rank 0 names under auto, and a"
            " loss trigger is each worker's own; use --tau auto or an integer"
        )
    if strategy == "easgd":
        raise ConfigError(
            f"{applies}: {strategy}'s workers exchange in rounds they must all agree on, so its"
            " tau is a fixed integer; use --strategy easgd-async for an adaptive one"
        )
    raise ConfigError(f"{applies}; strategy {strategy!r} has no tau")
