"""What `tau` may say: a fixed communication period, or `auto` / `loss`, the policies that choose
it while a run trains (ember.algorithms.period; docs/tau.md). Checked before anything starts.
Imports only ember.errors and the leaf config/choices.py."""

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


DILOCO_MIN_ROUNDS = 4  # fewer outer rounds leave the workers' mean far from any worker's model
DILOCO_STABLE_TAU = 50  # shorter periods: the outer momentum amplifies a few batches' change


def diloco_period_warning(tau: int, steps: int) -> str | None:
    """What a diloco run of `steps` steps a worker at a fixed period `tau` should hear before
    it trains (docs/diloco.md), or None: too few outer rounds to end near the workers' own
    models (315 steps at tau 200 ended at 0.78 where tau 63 reached 0.98), or a period short
    enough for the outer momentum to throw the model off (MNIST at tau 16 collapsed to chance);
    with the period to set instead."""
    if tau < DILOCO_STABLE_TAU:
        return (
            f"diloco at tau {tau}: periods under {DILOCO_STABLE_TAU} steps are unstable, the"
            " outer momentum amplifying a few batches' change (MNIST at tau 16 collapsed to"
            f" chance; docs/diloco.md); set tau to {DILOCO_STABLE_TAU} or more"
        )
    rounds = steps / tau
    if rounds >= DILOCO_MIN_ROUNDS:
        return None
    said = (
        f"diloco at tau {tau} makes {rounds:.1f} outer rounds of a worker's {steps} steps;"
        f" with fewer than {DILOCO_MIN_ROUNDS} the final model, the workers' mean, ends far"
        " from what each worker reached (docs/diloco.md)"
    )
    suggested = steps // (DILOCO_MIN_ROUNDS + 1)
    if suggested >= DILOCO_STABLE_TAU:
        return f"{said}; set tau to {suggested} ({DILOCO_MIN_ROUNDS + 1} rounds)"
    return f"{said}; train more epochs (or use easgd-async): this run is too short for its rounds"
