"""Streaming DiLoCo (diloco with --fragments) in the throughput model and `ember plan`: a
fragment's round moves 1/F of the parameters every tau / F steps, overlapped with compute."""

from __future__ import annotations

import pytest

from ember.config import DILOCO_TAU
from ember_lab.bench.predict import add_predictions
from ember_lab.perfmodel import Network, closing_seconds, predict
from ember_lab.perfmodel.fragments import fragment_calibration
from ember_lab.plan import plan_report
from tests.unit.test_perfmodel import MLP, SHARED, printed_rows

SLOW = Network(bandwidth=12.5e6, latency=5e-4)  # 100 Mbit/s
NETWORKS = [Network(cores=2), SLOW, Network(bandwidth=125e6, latency=5e-4)]


def test_a_fragment_moves_its_share_of_the_bytes_and_of_each_ends_cpu() -> None:
    part = fragment_calibration(SHARED, 4)
    assert part.exchange_bytes == pytest.approx(SHARED.exchange_bytes / 4, rel=1e-4)
    assert part.client_cpu == pytest.approx(SHARED.client_cpu / 4)
    assert part.server_cpu == pytest.approx(SHARED.server_cpu / 4)
    # a round's wait for the slower worker is not the exchange's, and does not shrink
    step, blocked = SHARED.on_host["bsp"]
    assert part.on_host["bsp"] == (step, pytest.approx(blocked - SHARED.exchange_wall * 3 / 4))


@pytest.mark.parametrize("network", NETWORKS)
def test_one_fragment_is_whole_model_diloco(network: Network) -> None:
    for calibration in (MLP, SHARED):
        one = predict("diloco", 2, calibration, network, 200, 2, fragments=1)
        assert one == predict("diloco", 2, calibration, network, 200, 2)


def test_on_a_slow_link_fragments_overlap_the_round_with_compute() -> None:
    # diloco's one server's link against a fragment's server's link, one fragment at a time
    whole = predict("diloco", 2, MLP, SLOW, 40, 1)
    streamed = predict("diloco", 2, MLP, SLOW, 40, 2, fragments=2)
    assert whole.period > whole.compute + whole.t_comm  # compute, then the round
    # a stagger costs the longer of its compute and its round, not their sum
    stagger_compute = streamed.compute / 2
    stagger_round = streamed.t_comm
    assert streamed.period == pytest.approx(2 * max(stagger_compute, stagger_round), rel=1e-6)
    assert streamed.samples_per_second > whole.samples_per_second
    assert (streamed.tau, streamed.fragments, streamed.servers) == (40, 2, 2)


def test_when_the_link_is_the_bound_fragments_move_the_same_bytes_per_period() -> None:
    crawl = Network(bandwidth=1e5)  # each round far longer than any compute
    # one server's link (diloco's) against a fragment's server's link at a time
    whole = predict("diloco", 2, MLP, crawl, 200, 1)
    streamed = predict("diloco", 2, MLP, crawl, 200, 2, fragments=2)
    assert streamed.bound == "network"
    # the compute no longer adds to it: the round's time alone, within its latencies
    rounds = whole.period - whole.compute
    assert streamed.period == pytest.approx(rounds, rel=0.01)


def test_on_a_fast_link_fragments_run_at_compute_speed_plus_the_exchangers_cpu() -> None:
    fast = Network(bandwidth=12.5e9)
    streamed = predict("diloco", 2, MLP, fast, 200, 2, fragments=2)
    assert streamed.bound == "worker"
    part = fragment_calibration(MLP, 2)
    assert streamed.period == pytest.approx(2 * (100 * MLP.t_comp + part.client_cpu))


def test_fragments_apply_to_diloco_only() -> None:
    with pytest.raises(ValueError, match="fragments apply to diloco only, not 'easgd'"):
        predict("easgd", 2, MLP, SLOW, 8, 2, fragments=2)


def test_a_fragmented_run_ends_waiting_for_its_round_in_flight_then_its_last_pushes() -> None:
    streamed = predict("diloco", 2, MLP, SLOW, 200, 2, fragments=2)
    assert closing_seconds(streamed, 1404) == pytest.approx(2 * streamed.t_comm)


def test_plan_has_a_streaming_diloco_column_on_a_server_per_fragment() -> None:
    text = plan_report(MLP, SLOW, [2], [1, 8])
    column = f"diloco tau={DILOCO_TAU} fragments=2"
    expected = predict("diloco", 2, MLP, SLOW, DILOCO_TAU, 2, fragments=2)
    assert printed_rows(text)[(2, 1)][column] == round(expected.samples_per_second)
    assert " on 2 servers |" in next(line for line in text.splitlines() if line.startswith("| 2"))


def test_bench_predicts_a_fragments_row_with_its_fragments() -> None:
    config = {
        "strategy": "diloco", "workers": 2, "servers": 2, "fragments": 2, "tau": 200,
        "batch_size": 64, "epochs": 1, "eval_deferred": True, "compress": "none",
    }  # fmt: skip
    record = {"task": "mlp", "system": "ember", "status": "ok", "config": config}
    add_predictions([record], [{"mlp": MLP}], network=SLOW)
    expected = predict("diloco", 2, MLP, SLOW, 200, 2, fragments=2)
    assert record["predicted_samples_per_second"] == pytest.approx(expected.samples_per_second)
