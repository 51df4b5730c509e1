"""A diloco run whose period does not fit it hears so before it trains, and a model that
trained and then fell back to chance is flagged in the summary, not only a NaN loss."""

from __future__ import annotations

import pytest

from ember.config.tau import diloco_period_warning
from ember.metrics import collapse


def test_too_few_outer_rounds_get_a_period_that_makes_five() -> None:
    said = diloco_period_warning(200, 315)  # a user's run: 315 steps a worker, the default
    assert said is not None
    assert "1.6 outer rounds of a worker's 315 steps" in said
    assert said.endswith("set tau to 63 (5 rounds)")


def test_a_period_under_fifty_steps_is_called_unstable() -> None:
    said = diloco_period_warning(16, 7000)
    assert said is not None and said.startswith("diloco at tau 16: periods under 50 steps")
    assert said.endswith("set tau to 50 or more")


def test_a_run_too_short_for_stable_rounds_is_told_to_train_longer() -> None:
    said = diloco_period_warning(200, 150)
    assert said is not None and "this run is too short for its rounds" in said


@pytest.mark.parametrize(("tau", "steps"), [(200, 1404), (200, 800), (50, 200)])
def test_a_period_that_fits_is_not_warned_of(tau: int, steps: int) -> None:
    assert diloco_period_warning(tau, steps) is None


def _scores(accuracy: float, loss: float) -> dict[str, float]:
    return {"test_accuracy": accuracy, "test_loss": loss}


def test_accuracy_back_at_chance_after_it_was_far_above_is_a_collapse() -> None:
    history = [_scores(0.91, 0.31), _scores(0.98, 0.07)]
    found = collapse(history, _scores(0.0974, 2.30), classes=10)
    assert found is not None
    assert found["best_test_accuracy"] == 0.98 and found["test_accuracy"] == 0.0974
    assert "at chance (0.10)" in found["said"]


@pytest.mark.parametrize(
    ("final", "history"),
    [
        (_scores(0.7845, 0.71), [_scores(0.95, 0.2)]),  # worse, not at chance
        (_scores(0.12, 2.2), [_scores(0.15, 2.25)]),  # never far above chance
        (_scores(0.0974, 2.3), []),  # nothing seen to fall from
    ],
)
def test_a_model_that_never_rose_or_kept_most_of_it_is_not(final, history) -> None:
    assert collapse(history, final, classes=10) is None


def test_a_loss_three_times_its_first_evaluation_is_a_collapse_without_accuracy() -> None:
    history = [{"test_loss": 0.5}, {"test_loss": 0.2}]
    found = collapse(history, {"test_loss": 1.6}, classes=1)
    assert found is not None and found["first_test_loss"] == 0.5
    assert collapse(history, {"test_loss": 1.4}, classes=1) is None
