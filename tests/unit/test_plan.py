"""The model on slow links: compression, the tau `--tau auto` would pick, where the server
links saturate, the servers that prevent it, `ember plan`'s options, and predicted time to
target beside bench rows."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from ember import cli
from ember.algorithms import period
from ember_lab.bench.predict import add_predictions
from ember_lab.perfmodel import (
    AUTO_MARGIN,
    MAX_TAU,
    WIRE_FRACTION,
    Network,
    closing_seconds,
    model_tau,
    parse_bandwidths,
    predict,
    shared_link_cycle,
    wire_fraction,
)
from ember_lab.plan import saturation, scale_report, servers_needed
from tests.unit.test_perfmodel import (
    MLP,  # the reference mlp: 2 ms a minibatch, 2.15 MB an exchange
    printed_rows,
)

GIGABIT = Network(bandwidth=125e6, latency=0.0005)
SLOW = Network(bandwidth=12.5e6)  # 100 Mbit/s, no latency: the wire is all of an exchange
WORKERS = [1, 2, 4, 8, 16, 32, 64]


@pytest.mark.parametrize(("compress", "fraction"), [("fp16", 0.5), ("bf16", 0.5), ("int8", 0.25)])
def test_compression_divides_the_network_bound_period(compress: str, fraction: float) -> None:
    packed = MLP.compressed(compress)
    # one worker: its own link's exchange bounds easgd-async at tau 1
    alone, small = predict("easgd-async", 1, MLP, SLOW), predict("easgd-async", 1, packed, SLOW)
    assert alone.t_comm == pytest.approx(MLP.exchange_bytes / 12.5e6)
    assert small.period == pytest.approx(alone.period * fraction, rel=2e-3)
    # eight workers: one server's link carries all of their exchanges
    crowd, packed_crowd = predict("async", 8, MLP, SLOW), predict("async", 8, packed, SLOW)
    assert crowd.bound == packed_crowd.bound == "network"
    assert packed_crowd.period == pytest.approx(crowd.period * fraction, rel=2e-3)
    assert packed_crowd.samples_per_second == pytest.approx(
        crowd.samples_per_second / fraction, rel=2e-3
    )


def test_int8_pays_a_float32_scale_per_4096_values() -> None:
    assert WIRE_FRACTION["int8"] == pytest.approx((4096 + 4) / (4 * 4096))
    assert MLP.compressed("int8").exchange_bytes == round(8 * 269_322 * (4096 + 4) / (4 * 4096))
    assert MLP.compressed("none") == MLP


def test_an_unknown_compression_is_named_with_the_choices() -> None:
    with pytest.raises(ValueError, match=r"compress 'int3': choose from none, fp16, bf16, int8"):
        wire_fraction("int3")


@pytest.fixture
def no_calibration(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ember plan` fails the test if it calibrates: its flags are checked first."""

    def calibrated(*_: object) -> None:
        raise AssertionError("calibrated before checking the flags")

    monkeypatch.setattr("ember_lab.bench.calibrate.calibrate", calibrated)


@pytest.mark.usefixtures("no_calibration")
def test_bad_compress_is_one_clear_error_before_any_calibration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["plan", "--compress", "int3", "--bandwidth", "1Gbit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ember: error: --compress 'int3': choose from none, fp16, bf16, int8"]


def test_a_list_of_link_rates_parses_in_order() -> None:
    assert parse_bandwidths("1Gbit,100Mbit") == [125e6, 12.5e6]
    assert parse_bandwidths(" 10GB/s ") == [10e9]
    for text in ("", ",", "1Gbit,fast"):
        with pytest.raises(ValueError, match="bandwidth"):
            parse_bandwidths(text)


def test_asynchronous_exchanges_queue_where_they_meet_on_a_server_link() -> None:
    one_way = MLP.exchange_bytes / 2 / 125e6  # a push, or a reply, alone on a 1 Gbit/s link
    bare = Network(bandwidth=125e6)
    assert shared_link_cycle(MLP, bare, 1, 1, 0.0) == pytest.approx(2 * one_way)
    # two workers: half the time the other's transfer is on a direction when one arrives,
    # with half of it left on average: a quarter of a transfer's wait, each direction
    assert shared_link_cycle(MLP, bare, 2, 1, 0.0) == pytest.approx(2.5 * one_way)
    # many: each direction of the server's link full, one push per worker per cycle
    assert shared_link_cycle(MLP, bare, 256, 1, 0.0) == pytest.approx(256 * one_way, rel=0.01)
    # time away from the link (compute, latency) thins the queue
    assert shared_link_cycle(MLP, bare, 2, 1, 1.0) < 1.0 + 2.02 * one_way
    # a synchronous round lets no reply out before every push is in
    bsp = predict("bsp", 2, MLP, bare)
    # a round: the workers compute, then every push and every reply takes its turn
    assert bsp.bounds["network"] == pytest.approx(MLP.t_comp + 4 * one_way)


def test_auto_tau_is_the_smallest_whose_compute_covers_what_an_exchange_takes() -> None:
    exchange = 2 * 0.0005 + MLP.exchange_bytes / 125e6  # 18.2 ms on one worker's own link
    assert model_tau(MLP, GIGABIT, workers=1) == math.ceil(exchange / MLP.t_comp) == 10
    # two workers meet on one server's link: an exchange takes longer
    shared = shared_link_cycle(MLP, GIGABIT, 2, 1, 0.0)
    assert model_tau(MLP, GIGABIT, workers=2) == math.ceil(shared / MLP.t_comp) == 12
    assert model_tau(MLP, GIGABIT, workers=1, margin=1.5) == math.ceil(1.5 * exchange / 0.002)
    assert model_tau(MLP, SLOW, workers=64) == MAX_TAU  # clamped
    # at the tau it names, easgd-async is compute-bound; one less, compute falls short of
    # the exchange (the exchanger's CPU aside, which the rule leaves as margin)
    for workers in (1, 2, 4):
        tau = model_tau(MLP, GIGABIT, workers)
        assert predict("easgd-async", workers, MLP, GIGABIT, tau).compute_bound
        exchange = max(predict("easgd-async", workers, MLP, GIGABIT, 1).bounds.values())
        assert (tau - 1) * MLP.t_comp < exchange <= tau * MLP.t_comp


def test_saturation_is_the_first_worker_count_a_server_link_bounds() -> None:
    # easgd-async at tau 32 computes 32 * 2 ms + 0.9 ms a period; one server's link cycles
    # n workers' exchanges in about n * 8.6 ms, clearly more than the compute from n = 8 on
    compute = 32 * MLP.t_comp + MLP.client_cpu
    expected = next(
        n for n in WORKERS if shared_link_cycle(MLP, GIGABIT, n, 1, 0.0) > 1.05 * compute
    )
    hit = saturation("easgd-async", MLP, GIGABIT, WORKERS, tau=32)
    assert hit is not None and (hit.workers, hit.bound) == (expected, "network") == (8, "network")
    assert saturation("bsp", MLP, GIGABIT, WORKERS).workers == 2  # type: ignore[union-attr]
    assert saturation("easgd-async", MLP, GIGABIT, [1, 2, 4], tau=32) is None


def test_servers_needed_to_keep_easgd_async_compute_bound() -> None:
    # 16 workers at tau 16: 32.9 ms of compute a period against about 16 * 8.6 ms / S of
    # each server's link
    compute = 16 * MLP.t_comp + MLP.client_cpu
    expected = next(s for s in range(1, 64) if shared_link_cycle(MLP, GIGABIT, 16, s, 0) <= compute)
    assert servers_needed(16, 16, MLP, GIGABIT) == expected == 5
    assert predict("easgd-async", 16, MLP, GIGABIT, 16, expected).compute_bound
    assert not predict("easgd-async", 16, MLP, GIGABIT, 16, expected - 1).compute_bound
    # at tau 8, 16.9 ms of compute is less than an exchange on the worker's own link
    assert servers_needed(16, 8, MLP, GIGABIT) is None
    # compressed to a quarter, fewer servers do
    assert servers_needed(16, 16, MLP.compressed("int8"), GIGABIT) == 2


def test_scale_report_states_saturation_and_servers_per_link() -> None:
    text = scale_report(MLP, GIGABIT, WORKERS, [8, 16, 32])
    assert "### at scale on 1 Gbit/s links, 0.5 ms latency" in text
    lines = text.splitlines()
    row = next(line for line in lines if line.startswith("| easgd-async tau=32 |"))
    assert row.startswith("| easgd-async tau=32 | 8 workers | network |")
    sixteen = next(line for line in lines if line.startswith("| 16 | "))
    cells = [cell.strip() for cell in sixteen.strip("|").split("|")]
    needed = [servers_needed(16, t, MLP, GIGABIT) for t in (8, 16, 32)]
    assert cells[:4] == ["16", "none", str(needed[1]), str(needed[2])]
    assert cells[4] == str(model_tau(MLP, GIGABIT, 16, margin=AUTO_MARGIN))
    assert scale_report(MLP, Network(cores=2), WORKERS, [8]) == ""


def test_plan_prints_a_scale_table_per_link_rate(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ember_lab.bench.calibrate.calibrate", lambda *_: MLP)
    monkeypatch.setattr("ember.worker.spec.load_data", lambda *_: None)
    argv = ["plan", "--bandwidth", "1Gbit,100Mbit", "--workers", "1,2,4", "--taus", "8,32"]
    assert cli.main([*argv, "--compress", "int8"]) == 0
    out = capsys.readouterr().out
    assert out.count("### at scale on") == 2
    assert out.index("1 Gbit/s links") < out.index("### at scale on 100 Mbit/s links")
    assert "compressed to 0.54 MB" in out


def _rows(network_speed: float) -> list[dict[str, object]]:
    base = {"workers": 2, "servers": 1, "batch_size": 64, "epochs": 1, "eval_every": 0}
    single = {"strategy": "single", "workers": 1, "tau": 1, "n_push": 1}
    easgd = {"strategy": "easgd-async", "tau": 8, "n_push": 1}
    common = {"task": "mlp", "system": "ember", "status": "ok", "repeat": 0}
    return [
        {**common, "strategy": "single", "samples_to_target": 30_000, "divergence": 1.0,
         "samples_per_second": 30_000.0, "time_to_target": 1.0, "config": {**base, **single}},
        {**common, "strategy": "easgd-async", "samples_to_target": 45_000, "divergence": 1.5,
         "samples_per_second": network_speed, "time_to_target": 2.0,
         "config": {**base, **easgd}},
        {**common, "strategy": "async", "samples_to_target": None, "divergence": None,
         "samples_per_second": 1.0, "time_to_target": None,
         "config": {**base, "strategy": "async", "tau": 1, "n_push": 1}},
    ]  # fmt: skip


def test_bench_rows_get_predicted_time_to_target_from_their_divergence() -> None:
    rows = _rows(20_000.0)
    add_predictions(rows, [{"mlp": MLP}], network=SLOW)
    speed = predict("easgd-async", 2, MLP, SLOW, tau=8).samples_per_second
    single, easgd, async_ = rows
    assert easgd["predicted_samples_per_second"] == pytest.approx(speed)
    assert easgd["predicted_time_to_target"] == pytest.approx(1.5 * 30_000 / speed)
    assert easgd["time_to_target_error"] == pytest.approx(1.5 * 30_000 / speed / 2.0 - 1)
    assert single["predicted_time_to_target"] == pytest.approx(30_000 / (64 / 0.002))
    # a row that never reached the target has no predicted time for it
    assert async_["predicted_time_to_target"] is None
    assert async_["predicted_samples_per_second"] is not None


def test_bench_rows_are_predicted_on_their_link_and_with_their_compression() -> None:
    here, slow = _rows(1.0), _rows(1.0)
    add_predictions(here, [{"mlp": MLP}])  # the keyword left out: all on this host
    add_predictions(slow, [{"mlp": MLP}], network=SLOW)
    assert slow[1]["predicted_samples_per_second"] < here[1]["predicted_samples_per_second"]
    packed = _rows(1.0)
    packed[1]["config"] = {**packed[1]["config"], "compress": "int8"}  # type: ignore[dict-item]
    add_predictions(packed, [{"mlp": MLP}], network=SLOW)
    compressed = predict("easgd-async", 2, MLP.compressed("int8"), SLOW, tau=8)
    assert packed[1]["predicted_samples_per_second"] == pytest.approx(compressed.samples_per_second)


def test_a_row_with_a_codec_the_model_does_not_know_is_left_unpredicted() -> None:
    rows = _rows(1.0)
    rows[1]["config"] = {**rows[1]["config"], "compress": "int4"}  # type: ignore[dict-item]
    add_predictions(rows, [{"mlp": MLP}], network=SLOW)
    assert rows[1]["predicted_samples_per_second"] is None
    assert rows[1]["predicted_time_to_target"] is None
    assert rows[0]["predicted_samples_per_second"] is not None


def test_the_model_picks_tau_with_the_same_margin_and_range_as_tau_auto() -> None:
    assert AUTO_MARGIN == period.MARGIN
    assert (period.TAU_MIN, period.TAU_MAX) == (1, MAX_TAU)


def test_the_model_counts_int8_bytes_as_the_codec_writes_them() -> None:
    from ember.ps.codec import BLOCK
    from ember_lab.perfmodel import INT8_CHUNK

    assert INT8_CHUNK == BLOCK


def test_plan_takes_the_links_latency_and_charges_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ember_lab.bench.calibrate.calibrate", lambda *_: MLP)
    monkeypatch.setattr("ember.worker.spec.load_data", lambda *_: None)
    argv = ["plan", "--bandwidth", "100Mbit", "--workers", "1", "--taus", "1"]
    printed = {}
    for latency in ("1ms", "0ms"):
        assert cli.main([*argv, "--latency", latency]) == 0
        printed[latency] = capsys.readouterr().out
    assert "100 Mbit/s links, 1 ms latency" in printed["1ms"]
    # one worker's bsp pays the latency twice a step: 2 ms more than without it
    plans = {k: v.split("### at scale")[0] for k, v in printed.items()}  # the table, not scale
    bsp = {k: printed_rows(v)[(1, 1)]["bsp"] for k, v in plans.items()}
    at = {k: predict("bsp", 1, MLP, Network(12.5e6, s)) for k, s in (("1ms", 1e-3), ("0ms", 0.0))}
    assert at["1ms"].period - at["0ms"].period == pytest.approx(2e-3)
    assert bsp == {k: round(p.samples_per_second) for k, p in at.items()}


def test_a_fixed_rows_loop_pays_for_the_last_exchanges_its_phase_leaves() -> None:
    rows = _rows(20_000.0)
    easgd = rows[1]
    samples = easgd["samples"] = 2 * 64 * 1004  # 1004 local steps: 4 past the last exchange
    add_predictions(rows, [{"mlp": MLP}], network=SLOW)
    at_8 = predict("easgd-async", 2, MLP, SLOW, tau=8)
    ending = closing_seconds(at_8, steps=1004)
    assert ending > closing_seconds(at_8, steps=1000) > 0
    expected = samples / (samples / at_8.samples_per_second + ending)
    assert easgd["predicted_samples_per_second"] == pytest.approx(expected)
    assert easgd["predicted_time_to_target"] == pytest.approx(
        1.5 * 30_000 / at_8.samples_per_second
    )


def test_an_adaptive_row_is_predicted_over_the_periods_it_ran() -> None:
    rows = _rows(20_000.0)
    easgd = rows[1]
    easgd["config"] = {**easgd["config"], "tau_policy": "auto"}
    samples = easgd["samples"] = 2 * 64 * 1000  # 1000 local steps a worker
    # worker 0 ran 100 steps at 8, then 128; worker 1 200 steps at 8, then 128
    easgd["tau_choices"] = {"0": [[0, 8], [100, 128]], "1": [[0, 8], [200, 128]]}
    easgd["bytes_per_sample"] = 1.0  # ignored: the choices are known
    add_predictions(rows, [{"mlp": MLP}], network=SLOW)

    def seconds_per_step(tau: int) -> float:
        return 2 * 64 / predict("easgd-async", 2, MLP, SLOW, tau=tau).samples_per_second

    def with_closing(seconds: float, most_run: int) -> float:
        """The samples/s of a loop of `seconds` over both workers' steps, and the last
        exchanges after it, at the tau the run ran most steps at."""
        ending = closing_seconds(predict("easgd-async", 2, MLP, SLOW, tau=most_run))
        return samples / (seconds / 2 + ending)

    # a span at a tau too short to cover the exchange runs as long as the exchange takes,
    # since the period puts off the next exchange rather than wait for the last
    covered = model_tau(MLP, SLOW, 2, 1)
    assert 8 < covered < 128
    seconds = 300 * seconds_per_step(covered) + 1700 * seconds_per_step(128)
    assert easgd["predicted_samples_per_second"] == pytest.approx(with_closing(seconds, 128))
    # loss records a period when it ends: [100, 40] is a period of 40 from step 60
    easgd["config"] = {**easgd["config"], "tau_policy": "loss"}
    easgd["tau_choices"] = {"0": [[0, 8], [100, 40]], "1": [[0, 8], [200, 160]]}
    add_predictions(rows, [{"mlp": MLP}], network=SLOW)
    seconds = 100 * seconds_per_step(8) + 940 * seconds_per_step(40)
    seconds += 960 * seconds_per_step(160)
    assert easgd["predicted_samples_per_second"] == pytest.approx(with_closing(seconds, 160))
    easgd["config"] = {**easgd["config"], "tau_policy": "auto"}
    # without its choices, at the mean period its bytes say it ran
    del easgd["tau_choices"]
    easgd["bytes_per_sample"] = MLP.exchange_bytes / (32 * 64)
    add_predictions(rows, [{"mlp": MLP}], network=SLOW)
    at_32 = predict("easgd-async", 2, MLP, SLOW, tau=32)
    seconds = samples / at_32.samples_per_second + closing_seconds(at_32)
    assert easgd["predicted_samples_per_second"] == pytest.approx(samples / seconds)
    # the time to target, reached before the last exchanges, is at the loop's own speed
    assert easgd["predicted_time_to_target"] == pytest.approx(
        1.5 * 30_000 / at_32.samples_per_second
    )


def test_plan_calibrates_on_the_device_and_precision_it_is_given(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[tuple[str, str]] = []

    def calibrated(config, _dataset):  # as measured on that device, in that precision
        asked.append((config.device, config.precision))
        return replace(MLP, device=config.device, precision=config.precision)

    monkeypatch.setattr("ember_lab.bench.calibrate.calibrate", calibrated)
    monkeypatch.setattr("ember.worker.spec.load_data", lambda *_: None)
    argv = ["plan", "--workers", "1,2", "--taus", "8", "--device", "cpu"]
    assert cli.main([*argv, "--precision", "bf16-mixed"]) == 0
    assert asked == [("cpu", "bf16-mixed")]
    assert " ms per batch of 64 on cpu in bf16-mixed;" in capsys.readouterr().out


@pytest.mark.usefixtures("no_calibration")
def test_plan_on_cuda_without_cuda_is_one_error_before_any_calibration(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ember.config.run.cuda_count", lambda: 0)
    assert cli.main(["plan", "--device", "cuda"]) == 2
    assert capsys.readouterr().err.startswith("ember: error: device 'cuda' needs CUDA")
