"""What a run's optimizer and learning-rate schedule may be, where each runs, and the schedule's
arithmetic, shared by the workers' torch optimizers and the servers' NumPy rules.

imports: errors (under config only the leaves objects.py and choices.py: the server process
reads it without torch)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ember.config.choices import not_one_of
from ember.config.objects import OBJECT_PREFIX
from ember.errors import ConfigError

# Optimizers a server applies over its key-range shard (algorithms/rules.py): elementwise, so a
# shard's update is the whole model's restricted to its keys.
SERVER_OPTIMIZERS = ("sgd", "adam", "adamw")
# Names the workers' side takes besides any torch.optim class (Adam, RMSprop, ...), lower-cased.
WORKER_OPTIMIZERS = ("sgd", "adam", "adamw", "rmsprop", "adagrad", "adamax", "nadam", "radam")
# Optimizers that need whole-tensor norms or the whole model: never on a key-range shard.
WHOLE_TENSOR = ("lamb", "lars", "lbfgs", "adafactor", "muon", "shampoo")
SCHEDULERS = ("constant", "step", "cosine", "onecycle", "linear")
# "32": float32 throughout; "bf16-mixed" and "16-mixed": the forward pass under autocast to
# bfloat16 or float16 (16-mixed with a gradient scaler), with float32 parameters, gradients,
# exchanges and servers (so --compress is independent of it)
PRECISIONS = ("32", "bf16-mixed", "16-mixed")
ONECYCLE_PCT, ONECYCLE_DIV, ONECYCLE_FINAL_DIV = 0.3, 25.0, 1e4  # torch's OneCycleLR defaults
STEP_GAMMA, STEP_COUNT = 0.1, 3  # "step": lr x 0.1 at each third of training


WORKER_STRATEGIES = "single, easgd, easgd-async, allreduce and diloco"


def check_optimizer(name: str, strategy: str, on_servers: bool) -> None:
    """One clear error, before anything starts, for an optimizer the strategy cannot run."""
    if name.startswith(OBJECT_PREFIX):
        if on_servers:
            raise ConfigError(
                f"an optimizer object runs on the workers, and strategy {strategy!r} runs its"
                f" optimizer on the parameter servers, which take {', '.join(SERVER_OPTIMIZERS)}"
                f" by name; strategies {WORKER_STRATEGIES} take any"
            )
        return
    lowered = name.lower()
    if on_servers and lowered not in SERVER_OPTIMIZERS:
        why = (
            "it needs whole-tensor norms, which a key-range shard does not hold"
            if lowered in WHOLE_TENSOR
            else "the servers apply only elementwise optimizers over their shards"
        )
        raise ConfigError(
            f"optimizer {name!r} cannot run on the parameter servers of strategy {strategy!r}"
            f" ({why}); the servers take {', '.join(SERVER_OPTIMIZERS)}, and strategies single,"
            " easgd, easgd-async and allreduce run any torch.optim optimizer on the workers"
        )
    if not name or not name.replace("_", "").isalnum():
        raise ConfigError(f"optimizer must be a torch.optim class name, got {name!r}")


# What optimizer_args may set for an optimizer the servers run (algorithms/rules.py)
SERVER_ARGS = {"sgd": (), "adam": ("betas", "eps"), "adamw": ("betas", "eps")}


def check_optimizer_args(args: object, optimizer: str, on_servers: bool) -> None:
    """Keyword arguments for the optimizer's constructor: a mapping of names to JSON-able
    values (they travel in the run's configuration), never the parameters or the lr."""
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise ConfigError(f"optimizer_args must be a mapping of keyword: value, got {args!r}")
    for taken in ("params", "lr", "weight_decay"):
        if taken in args:
            raise ConfigError(
                f"optimizer_args must not set {taken!r}: the run sets it (--lr, --weight-decay)"
            )
    name = optimizer.lower()
    if name.startswith(OBJECT_PREFIX) and args:
        raise ConfigError("optimizer_args go with an optimizer by name; an object has its own")
    allowed = SERVER_ARGS.get(name, ()) if on_servers or name == "sgd" else None
    extra = sorted(set(args) - set(allowed)) if allowed is not None else []
    if extra:
        where = "the servers' " if on_servers else "ember's momentum "
        raise ConfigError(
            f"optimizer_args: {where}{name} takes {', '.join(allowed or ()) or 'no arguments'}"
            f" (momentum and nesterov are fields of their own); got {', '.join(extra)}"
        )


def check_scheduler(name: str, warmup_steps: int, on_servers: bool = False) -> None:
    if name.startswith(OBJECT_PREFIX):
        if on_servers:
            raise ConfigError(
                "a schedule object steps a torch optimizer on the workers; the parameter servers"
                f" take the schedules {', '.join(SCHEDULERS)} by name"
            )
    elif name not in SCHEDULERS:
        raise not_one_of("scheduler", name, SCHEDULERS)
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ConfigError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise not_one_of("precision", precision, PRECISIONS)


@dataclass(frozen=True)
class Schedule:
    """The learning rate's factor at each optimizer step of `total`, counted from 0: the
    closed forms of torch's schedulers (CosineAnnealingLR to 0, StepLR, OneCycleLR's
    defaults, a linear decay to 0), times a linear warm-up over the first `warmup` steps."""

    name: str = "constant"
    total: int = 0  # optimizer steps in the run; 0 when unknown (the schedule is constant)
    warmup: int = 0

    def factor(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        total = self.total
        if self.name == "constant" or total <= 0:
            return warm
        t = min(step, total)
        if self.name == "cosine":
            base = 0.5 * (1 + math.cos(math.pi * t / total))
        elif self.name == "linear":
            base = max(0.0, 1 - t / total)
        elif self.name == "step":
            base = STEP_GAMMA ** (t // max(1, total // STEP_COUNT))
        else:
            base = _one_cycle(t, total)
        return warm * base


def _one_cycle(step: int, total: int) -> float:
    """OneCycleLR(max_lr=lr, total_steps=total) with its defaults, as a factor of lr."""
    start, low = 1 / ONECYCLE_DIV, 1 / ONECYCLE_DIV / ONECYCLE_FINAL_DIV
    peak = float(ONECYCLE_PCT * total) - 1
    if step <= peak:
        return _cos_between(start, 1.0, step / peak if peak > 0 else 1.0)
    return _cos_between(1.0, low, (step - peak) / (total - 1 - peak))


def _cos_between(begin: float, end: float, fraction: float) -> float:
    return end + (begin - end) / 2 * (math.cos(math.pi * min(1.0, fraction)) + 1)


CONSTANT = Schedule()  # the learning rate as given, every step
