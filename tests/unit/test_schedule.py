"""The learning-rate schedules, written once for the servers and the workers, against the
schedulers of torch.optim.lr_scheduler that they name."""

from __future__ import annotations

import pytest
import torch

from ember.config.training import Schedule, check_scheduler
from ember.errors import ConfigError

TOTAL, LR = 40, 0.5


def _torch_lrs(make: object) -> list[float]:
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    scheduler = make(optimizer)  # type: ignore[operator]
    lrs = []
    for _ in range(TOTAL):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("cosine", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=TOTAL)),
        ("step", lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=TOTAL // 3, gamma=0.1)),
        ("onecycle", lambda o: torch.optim.lr_scheduler.OneCycleLR(o, LR, total_steps=TOTAL)),
        ("linear", lambda o: torch.optim.lr_scheduler.LinearLR(o, 1.0, 0.0, total_iters=TOTAL)),
    ],
)
def test_each_schedule_gives_the_learning_rates_of_the_torch_scheduler_it_names(
    name: str, make: object
) -> None:
    ours = [LR * Schedule(name, TOTAL).factor(step) for step in range(TOTAL)]
    assert ours == pytest.approx(_torch_lrs(make), rel=1e-6, abs=1e-9)


def test_warm_up_rises_linearly_then_leaves_the_schedule_as_it_is() -> None:
    schedule = Schedule("constant", TOTAL, warmup=4)
    assert [schedule.factor(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_an_unknown_schedule_is_one_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError) as refused:
        check_scheduler("cosine-annealing", 0)
    assert str(refused.value) == (
        "scheduler must be one of constant, step, cosine, onecycle, linear; got 'cosine-annealing'"
    )
