"""The local launcher's torch work, done by forks of the fork server, against the same work
done in-process: the same starting parameters, the same evaluation, errors raised as
themselves, and each child's peak memory counted in the run's."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from ember.config import RunConfig
from ember.data.host import HostData, host_data
from ember.engines import modelwork
from ember.engines.forking import start_forkserver, stop_forkserver
from ember.engines.modelwork import Forked, InProcess
from ember.engines.phases import PeakMemory
from ember.engines.process import reap
from ember.errors import ConfigError, EmberError

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def host() -> Iterator[HostData]:
    start_forkserver()
    data = host_data("synthetic-lr", seed=3, synthetic_samples=3000, synthetic_features=20)
    try:
        yield data
    finally:
        data.close()
        stop_forkserver()


def test_a_fork_works_out_what_the_launcher_would(host: HostData, tmp_path: Path) -> None:
    config = RunConfig(data="synthetic-lr", model="tests.bn_models:bn_mlp", seed=3).validate()
    dataset, memory = host.files.dataset(), PeakMemory()
    forked, here = Forked(host.files, memory=memory), InProcess()
    initial, parameters = forked.initial(config, dataset)
    expected, expected_parameters = here.initial(config, dataset)
    assert np.array_equal(initial, expected) and parameters == expected_parameters
    assert initial.size == parameters + 2 * (128 + 128 + 1)  # BatchNorm's buffers follow
    params = initial + np.linspace(-0.1, 0.1, initial.size, dtype=np.float32)
    params[parameters:] = np.abs(params[parameters:])  # a variance is never negative
    figures = forked.evaluate(config, dataset, params, tmp_path / "forked")
    assert figures == pytest.approx(
        here.evaluate(config, dataset, params, tmp_path / "here"), rel=1e-6
    )
    assert (tmp_path / "forked" / "model.safetensors").read_bytes() == (
        tmp_path / "here" / "model.safetensors"
    ).read_bytes()
    assert len(memory.peaks) == 2 and all(peak > 10 << 20 for peak in memory.peaks.values())


def test_an_error_in_the_fork_is_raised_in_the_launcher_as_itself(host: HostData) -> None:
    config = RunConfig(data="synthetic-lr", model="no_such_module_ember_test:make").validate()
    with pytest.raises(ConfigError, match="'no_such_module_ember_test:make' cannot be imported"):
        Forked(host.files).initial(config, host.files.dataset())
    good = RunConfig(data="synthetic-lr", model="logreg").validate()
    wrong_size = np.zeros(3, dtype=np.float32)  # not a ConfigError: named with its trace
    with pytest.raises(Exception, match="working out the final evaluation failed: ValueError"):
        Forked(host.files).evaluate(good, host.files.dataset(), wrong_size, None)


def _hang(seconds: float) -> None:
    time.sleep(seconds)


def test_a_fork_that_hangs_is_an_error_naming_it_after_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(modelwork, "ANSWER_SECONDS", 0.5)
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    process = context.Process(target=_hang, args=(30.0,), daemon=True)
    process.start()
    started = time.monotonic()
    try:
        with pytest.raises(
            EmberError, match=rf"the final evaluation \(pid {process.pid}\) did not"
        ):
            modelwork._receive(ours, process, "the final evaluation")
        assert time.monotonic() - started < 10
        assert process.is_alive()  # hung, not dead: only the deadline tells
    finally:
        reap([process])
        ours.close()
        theirs.close()
