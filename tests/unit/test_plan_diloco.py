"""diloco in the throughput model and `ember plan`: its rounds cost what synchronous easgd's do,
a push and a pull of every parameter per tau minibatches, all workers waiting for the round."""

from __future__ import annotations

import pytest

from ember.config import DILOCO_TAU
from ember_lab.perfmodel import Network, closing_seconds, predict
from ember_lab.plan import plan_report
from tests.unit.test_perfmodel import MLP, SHARED, printed_rows

NETWORKS = [Network(cores=2), Network(bandwidth=12.5e6), Network(bandwidth=125e6, latency=5e-4)]


@pytest.mark.parametrize("network", NETWORKS)
@pytest.mark.parametrize(("workers", "tau", "servers"), [(2, 8, 1), (4, 200, 2), (16, 50, 1)])
def test_a_diloco_round_is_predicted_as_a_synchronous_easgd_round(
    network: Network, workers: int, tau: int, servers: int
) -> None:
    for calibration in (MLP, SHARED, MLP.compressed("int8")):
        diloco = predict("diloco", workers, calibration, network, tau, servers)
        easgd = predict("easgd", workers, calibration, network, tau, servers)
        assert diloco.samples_per_second == pytest.approx(easgd.samples_per_second)
        assert (diloco.bound, diloco.t_comm) == (easgd.bound, easgd.t_comm)
        assert closing_seconds(diloco, 1001) == pytest.approx(closing_seconds(easgd, 1001))


def test_a_longer_period_amortizes_the_round_on_a_slow_link() -> None:
    slow = Network(bandwidth=12.5e6)
    speeds = [predict("diloco", 2, MLP, slow, tau).samples_per_second for tau in (1, 8, 200)]
    assert speeds == sorted(speeds) and speeds[-1] > 10 * speeds[0]


def test_plan_has_a_diloco_column_at_its_default_tau() -> None:
    rows = printed_rows(plan_report(MLP, Network(bandwidth=12.5e6), [2], [1, 8]))
    expected = predict("diloco", 2, MLP, Network(bandwidth=12.5e6), DILOCO_TAU)
    assert rows[(2, 1)][f"diloco tau={DILOCO_TAU}"] == round(expected.samples_per_second)
