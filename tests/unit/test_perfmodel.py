"""The throughput model: the bounds it names, DeepSpark's tau trade-off, its parsers, and the
table and advice `ember plan` draws from it."""

from __future__ import annotations

import os
import re

import pytest

from ember_lab.bench.predict import add_predictions
from ember_lab.perfmodel import (
    Calibration,
    Network,
    evaluation_wait,
    parse_bandwidth,
    parse_counts,
    parse_latency,
    predict,
    time_to_target,
)
from ember_lab.plan import plan_report

# Figures of the reference mlp on a 2-core machine: 2 ms per batch, a 2.2 ms exchange.
MLP = Calibration(
    batch_size=64,
    t_comp=0.002,
    parameters=269_322,
    exchange_wall=0.0022,
    client_cpu=0.0009,
    server_cpu=0.0011,
    cores=2,
)
# The same, with the two-worker loops measured on this host
SHARED = Calibration(
    **{**MLP.__dict__, "on_host": {"async": (0.0025, 0.004), "bsp": (0.0026, 0.005)}}
)
# And easgd-async's loop at tau 1: 4 ms per minibatch, 1 ms more waiting per exchange
EXCHANGER = Calibration(**{**SHARED.__dict__, "on_host": {"easgd-async": (0.004, 0.001)}})
HERE = Network(cores=2)
GIGABIT = Network(bandwidth=125e6, latency=0.0005)


def test_single_runs_at_one_batch_per_compute_time() -> None:
    assert predict("single", 1, MLP, HERE).samples_per_second == pytest.approx(64 / 0.002)


def test_a_synchronous_exchange_adds_to_compute_and_overlap_hides_it() -> None:
    sync = predict("easgd", 1, MLP, GIGABIT, tau=4)
    overlapped = predict("easgd-async", 1, MLP, GIGABIT, tau=4)
    assert sync.period == pytest.approx(4 * MLP.t_comp + sync.t_comm)
    assert overlapped.period == pytest.approx(max(4 * MLP.t_comp, overlapped.t_comm))
    assert overlapped.samples_per_second > sync.samples_per_second


def test_throughput_rises_with_tau_until_compute_bounds_it() -> None:
    speeds = [predict("easgd-async", 2, MLP, GIGABIT, tau=t).samples_per_second for t in (1, 4, 64)]
    assert speeds[0] < speeds[1] < speeds[2]
    # compute-bound: 64 batches plus the exchanger thread's CPU, once per period
    ceiling = 2 * 64 * 64 / (64 * MLP.t_comp + MLP.client_cpu)
    assert speeds[2] == pytest.approx(ceiling)


def test_a_shared_server_link_bounds_many_workers_and_more_shards_lift_it() -> None:
    one = predict("async", 32, MLP, GIGABIT, servers=1)
    eight = predict("async", 32, MLP, GIGABIT, servers=8)
    assert one.bound == "network"
    # 32 workers each push 1.08 MB into one 125 MB/s link per step, and take as much out:
    # close to one minibatch per 1.08 MB each way, less what the queues leave idle
    full = 64 * 125e6 / (MLP.exchange_bytes / 2)
    assert 0.95 * full < one.samples_per_second < full
    assert eight.samples_per_second > 5 * one.samples_per_second
    # synchronous rounds: the workers compute, then every push goes in before a reply leaves,
    # the directions taking turns
    rounds = predict("bsp", 32, MLP, GIGABIT, servers=1)
    round_seconds = MLP.t_comp + 32 * MLP.exchange_bytes / 125e6
    assert rounds.samples_per_second == pytest.approx(32 * 64 / round_seconds)


def test_on_one_host_the_cores_bound_the_total() -> None:
    crowded = predict("easgd-async", 8, MLP, HERE, tau=64)
    assert crowded.bound == "cpu"
    assert crowded.samples_per_second < 2 * 64 / MLP.t_comp  # two cores, at most two batches


def test_bsp_is_never_faster_than_async() -> None:
    for network in (HERE, GIGABIT):
        for n in (2, 8):
            bsp = predict("bsp", n, MLP, network).samples_per_second
            assert bsp <= predict("async", n, MLP, network).samples_per_second


def test_allreduce_per_process_traffic_follows_the_ring() -> None:
    two = predict("allreduce", 2, MLP, GIGABIT)
    many = predict("allreduce", 64, MLP, GIGABIT)
    wire_two = 4 * MLP.parameters / 125e6  # 2(n-1)/n = 1 of the parameters
    assert two.t_comm == pytest.approx(2 * 0.0005 + max(wire_two, MLP.client_cpu))
    assert many.t_comm > two.t_comm


def test_on_one_host_two_workers_run_at_the_measured_loop_figures() -> None:
    async_ = predict("async", 2, SHARED, HERE)
    assert async_.period == pytest.approx(0.0025 + 0.004)
    ssp = predict("ssp", 2, SHARED, HERE)  # waits like bsp
    assert ssp.period == pytest.approx(0.0026 + 0.005)
    # a round every 8 minibatches: the calibration's wait beyond the exchange (5 - 2.2 ms)
    # is the gap between two workers' minibatch times, and grows as sqrt(8) over eight; only
    # the minibatch that closes the round shares the cores with it (2.6 ms), the other seven
    # compute as alone (2 ms)
    easgd = predict("easgd", 2, SHARED, HERE, tau=8)
    rounds_step = 0.0026 + 7 * 0.002
    assert easgd.period == pytest.approx(rounds_step + 0.0022 + (0.005 - 0.0022) * 8**0.5)
    assert predict("easgd", 2, SHARED, HERE, tau=1).period == pytest.approx(0.0026 + 0.005)
    # asynchronous strategies wait for no round: their exchange costs the same at any period
    async_8 = predict("async", 2, SHARED, HERE, tau=8)
    assert async_8.period == pytest.approx(8 * 0.0025 + 0.004)
    # more processes than the calibration's three share the cores: every figure stretches
    crowded = predict("async", 5, SHARED, HERE)
    assert crowded.period >= 2 * async_.period
    # over a network, each process has its host: the figures measured alone apply
    assert predict("async", 2, SHARED, GIGABIT) == predict("async", 2, MLP, GIGABIT)


def test_easgd_async_on_one_host_pays_each_exchange_at_its_cost_under_load() -> None:
    # two workers on two cores: the tau-1 period (5 ms) is one minibatch (2 ms) plus the
    # exchange's cost to the cores, 3 ms: more than the 2 ms the exchange costs alone
    assert EXCHANGER.exchange_cpu_under_load() == pytest.approx(0.003)
    for tau in (1, 8, 32):
        p = predict("easgd-async", 2, EXCHANGER, HERE, tau=tau)
        assert p.bound == "cpu"
        assert p.period == pytest.approx(tau * 0.002 + 0.003)
    # cheaper under load than alone is not believed: the exchange costs at least its own CPU
    quick = Calibration(**{**MLP.__dict__, "on_host": {"easgd-async": (0.002, 0.0)}})
    assert quick.exchange_cpu_under_load() == pytest.approx(MLP.client_cpu + MLP.server_cpu)
    # with cores to spare the processes did not compete, and the figures alone apply
    roomy = Calibration(**{**EXCHANGER.__dict__, "cores": 8})
    assert roomy.exchange_cpu_under_load() == pytest.approx(MLP.client_cpu + MLP.server_cpu)


def test_synchronous_rows_wait_out_worker_zeros_evaluations() -> None:
    timed = Calibration(**{**SHARED.__dict__, "t_eval": 0.05})
    for strategy in ("bsp", "ssp", "easgd", "allreduce"):
        assert evaluation_wait(strategy, 6, timed) == pytest.approx(0.3)
    for strategy in ("single", "async", "easgd-async"):
        assert evaluation_wait(strategy, 6, timed) == 0.0
    # 2 epochs of 10 minibatches a worker, evaluating every 4: after minibatches 4, 8, 10
    # (the epoch's end), 12, 16 and 20
    samples = 2 * 20 * 64
    config = {"workers": 2, "servers": 1, "batch_size": 64, "epochs": 2, "eval_every": 4}
    rows = [
        {
            "task": "mlp",
            "system": "ember",
            "status": "ok",
            "samples": samples,
            "samples_per_second": 1000.0,
            "config": {**config, "strategy": strategy, "tau": 8, "n_push": 1},
        }
        for strategy in ("bsp", "async")
    ]
    add_predictions(rows, [{"mlp": timed}])
    here = Network(cores=os.cpu_count())
    loop = samples / predict("bsp", 2, timed, here).samples_per_second
    assert rows[0]["predicted_samples_per_second"] == pytest.approx(samples / (loop + 0.3))
    async_ = predict("async", 2, timed, here).samples_per_second
    assert rows[1]["predicted_samples_per_second"] == pytest.approx(async_)


def test_time_to_target_scales_with_the_divergence_penalty() -> None:
    p = predict("easgd-async", 4, MLP, GIGABIT, tau=8)
    assert time_to_target(p, 1e6, 2.0) == pytest.approx(2 * time_to_target(p, 1e6, 1.0))


def test_unknown_strategy_is_named() -> None:
    with pytest.raises(ValueError, match="'fast'"):
        predict("fast", 2, MLP, HERE)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1Gbit", 125e6), ("100Mbit", 12.5e6), ("10GB/s", 10e9), ("1gb", 125e6), ("125MB", 125e6)],
)
def test_bandwidth_units(text: str, expected: float) -> None:
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize(("text", "expected"), [("0.5ms", 5e-4), ("50us", 5e-5), ("1s", 1.0)])
def test_latency_units(text: str, expected: float) -> None:
    assert parse_latency(text) == pytest.approx(expected)


def test_counts_continue_the_last_ratio() -> None:
    assert parse_counts("1,2,4,...,64") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_counts("2,4,6,...,12") == [2, 4, 6, 8, 10, 12]
    assert parse_counts("3") == [3]


@pytest.mark.parametrize("text", ["", "0,1", "4,2", "1,...", "a,b", "1,2,...,x"])
def test_bad_counts_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_counts(text)


@pytest.mark.parametrize("text", ["fast", "0Gbit", "-1MB"])
def test_bad_bandwidth_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


RECOMMENDED = re.compile(
    r"- for (\d+) (workers?): (\S+)(?: at tau (\d+))?(?: in (\d+) fragments)?"
    r"(?: with (\d+) servers?)?"
    r" — the highest predicted samples/s in the table above \(([\d,]+)"
)


def printed_rows(text: str) -> dict[tuple[int, int], dict[str, float]]:
    """{(workers, servers): {column: predicted samples/s}} of the table, cells that apply only."""
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[:2] == ["workers", "servers"]
    rows = {}
    for line in lines[1:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[(int(cells[0]), int(cells[1]))] = {
            column: float(cell.split()[0].replace(",", ""))
            for column, cell in zip(header[2:], cells[2:], strict=True)
            if cell != "—"
        }
    return rows


@pytest.mark.parametrize(
    ("network", "workers"), [(HERE, [1, 2, 4]), (GIGABIT, [1, 4, 16]), (Network(cores=8), [1, 8])]
)
def test_plan_recommends_for_each_worker_count_the_fastest_row_it_prints(
    network: Network, workers: list[int]
) -> None:
    text = plan_report(MLP, network, workers, [1, 4, 16, 32])
    rows = printed_rows(text)
    advice = [m.groups() for line in text.splitlines() if (m := RECOMMENDED.match(line))]
    assert [int(n) for n, *_ in advice] == workers
    for n, noun, strategy, tau, fragments, servers, figure in advice:
        assert noun == ("worker" if n == "1" else "workers")
        column = strategy if tau is None else f"{strategy} tau={tau}"
        column += f" fragments={fragments}" if fragments else ""
        # a fragmented diloco's cell may run on more servers than its row's, and says so
        row = next(
            cells
            for (w, s), cells in rows.items()
            if w == int(n)
            and (s == int(servers or 1) or fragments)
            and cells.get(column) == float(figure.replace(",", ""))
        )
        assert row[column] == float(figure.replace(",", ""))
        shown = [speed for (w, _), cells in rows.items() if w == int(n) for speed in cells.values()]
        assert row[column] == max(shown)


def test_plan_recommends_single_for_one_worker_when_it_is_predicted_fastest() -> None:
    text = plan_report(MLP, HERE, [1], [1, 16])
    line = next(line for line in text.splitlines() if line.startswith("- for 1 worker:"))
    single = predict("single", 1, MLP, HERE).samples_per_second
    easgd_async = predict("easgd-async", 1, MLP, HERE, tau=16).samples_per_second
    diloco = predict("diloco", 1, MLP, HERE, tau=200).samples_per_second
    streamed = predict("diloco", 1, MLP, HERE, 200, 2, fragments=2).samples_per_second
    # one exchange in 200 minibatches comes closest, and closer still overlapped
    assert single > streamed > diloco > easgd_async
    assert line.startswith("- for 1 worker: single — the highest predicted samples/s")
    runner_up = "diloco at tau 200 in 2 fragments with 2 servers"
    assert f"({single:,.0f}; against {streamed:,.0f} for {runner_up})" in line


def test_plan_shows_the_rows_at_the_servers_it_recommends_for_a_busy_server() -> None:
    text = plan_report(MLP, GIGABIT, [32], [1, 4, 16, 64, 128])
    servers = {s for w, s in printed_rows(text) if w == 32}
    assert 1 in servers and len(servers) == 2
    more = max(servers)
    assert f" with {more} servers — the highest" in text
    # the smallest tau within 10% of the fastest at those servers is named beside it
    speeds = {
        t: predict("easgd-async", 32, MLP, GIGABIT, t, more).samples_per_second
        for t in (1, 4, 16, 64, 128)
    }
    fastest = max(speeds, key=lambda t: speeds[t])
    near = min(t for t in speeds if speeds[t] >= 0.9 * speeds[fastest])
    assert near < fastest
    assert f"; tau {near} comes within 10% ({speeds[near]:,.0f})" in text


def test_plan_report_says_how_long_an_evaluation_keeps_synchronous_workers_waiting() -> None:
    assert "evaluates the test set" not in plan_report(MLP, GIGABIT, [2], [8])
    timed = Calibration(**{**MLP.__dict__, "t_eval": 0.064})
    text = plan_report(timed, GIGABIT, [2], [8])
    waiting = "in bsp, ssp, easgd, allreduce, diloco the other"
    assert f"evaluates the test set in 64 ms; {waiting}" in text


def test_an_encrypted_wire_costs_each_end_its_cipher_on_the_bytes_it_moves() -> None:
    per_byte = 1 / 1e9  # sealing and opening at 1 GB/s, both ends together
    sealed = MLP.encrypted(per_byte)
    added = per_byte * MLP.exchange_bytes / 2  # each end seals half and opens half
    assert sealed.client_cpu == pytest.approx(MLP.client_cpu + added)
    assert sealed.server_cpu == pytest.approx(MLP.server_cpu + added)
    # on a link faster than the cipher, an exchange takes the cipher's time, not the wire's
    fast = Network(bandwidth=10e9 / 8, latency=0.0)
    plain = predict("easgd", 1, MLP, fast, tau=1)
    costly = predict("easgd", 1, sealed, fast, tau=1)
    assert costly.t_comm == pytest.approx(plain.t_comm + 2 * added)
    assert costly.samples_per_second < plain.samples_per_second


def test_the_cipher_probe_names_the_ciphers_it_knows() -> None:
    from ember.config import RunConfig
    from ember_lab.bench.cipher_probe import cipher_cpu_per_byte

    with pytest.raises(ValueError, match="choose curve or aead"):
        cipher_cpu_per_byte(RunConfig(), "rot13")
