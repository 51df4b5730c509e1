"""What a run's samples/s pays for beyond the steady rate the throughput model predicts: the
other workers' waits for worker 0's evaluations, and what a worker's loop does after its last
step. ember bench adds both to each row's predicted loop time (bench/predict.py)."""

from __future__ import annotations

from ember.config import ConsistencyKind, Strategy
from ember_lab.perfmodel.fragments import fragments_closing_seconds
from ember_lab.perfmodel.inputs import Calibration
from ember_lab.perfmodel.prediction import Prediction


def closing_seconds(prediction: Prediction, steps: int | None = None) -> float:
    """Seconds a worker's loop spends after its last step: easgd's final exchange (diloco's
    final push), owed when the worker stepped since its last one, so the servers hold what it
    learned (algorithms/easgd.py and diloco.py, finish), and before it easgd-async's wait for
    the exchange in flight. `steps` is a worker's local steps when its period is fixed, which
    places its last exchange; None for a period that adapts, whose last exchange began at a
    point spread evenly over the period, so that of an exchange of X seconds in a period of
    P, X^2 / 2P is left on average. The final exchanges of workers that end together queue on
    the server's link as exchanges back to back do (the network bound's cycle). The other
    strategies' last push goes with their last step; diloco's fragments each push their last
    steps (perfmodel/fragments.py)."""
    mode = Strategy(prediction.strategy)
    if not mode.periodic:
        return 0.0
    if prediction.fragments > 1:
        return fragments_closing_seconds(prediction)
    tau = max(1, round(prediction.tau))
    since = None if steps is None else steps % tau  # steps since the last exchange began
    if not mode.overlaps_exchange:  # a round of its own, unless the last step's was the last
        return 0.0 if since == 0 else max(0.0, prediction.period - prediction.compute)
    exchange = max(prediction.t_comm, prediction.bounds.get("network", 0.0))
    period = max(prediction.period, exchange)
    if exchange <= 0:
        return 0.0
    if since is None:
        return exchange**2 / (2 * period) + exchange
    if since == 0:  # the last step began the last exchange: only waiting for it is left
        return exchange
    return max(0.0, exchange - period * since / tau) + exchange


def evaluation_wait(strategy: str, evaluations: int, calibration: Calibration) -> float:
    """Seconds the other workers wait while worker 0 evaluates the test set `evaluations`
    times. A synchronous round (bsp, easgd, all-reduce) cannot close without worker 0, and
    under ssp the others run only `staleness` minibatches ahead, little beside an evaluation;
    asynchronous workers go on. The run's samples/s counts the slowest worker's loop, so it
    pays for these waits; the evaluations themselves are not training and are left out."""
    mode = Strategy(strategy)
    if mode is Strategy.SINGLE or mode.consistency is ConsistencyKind.ASYNC:
        return 0.0
    return evaluations * calibration.t_eval
