"""torchft's deterministic DiLoCo regression cases, re-created against ember's diloco.

The peer: pytorch/torchft, `torchft/diloco_regression_test.py` (DiLoCoMockedUpdateTest), which
tests the Streaming DiLoCo of `torchft/local_sgd.py`. Its cases, kept here: a mock model of two
1 x 1 weights starting at 1 whose gradient is always 2, inner SGD at lr 1, outer SGD at lr 2,
sync every 6 steps in 2 fragments (one fragment every 3 steps), fragment sync delay 0 or 1,
mixing alpha 0, 0.5 or 1, two replicas, the parameters checked after each of 15 steps at
rtol = atol = 1e-5; and a replica failing at step 2, both replicas then ending with equal
global parameters. torchft's `fragment_sync_delay` and `fragment_update_alpha` are ember's
`--fragment-sync-delay` and `--mixing-alpha`, its outer SGD ember's outer step with
`--outer-momentum 0` (p -= lr x the round's mean), its inner one ember's local optimizer, sgd
with `--momentum 0`.

The expected values come from `_reference`, torchft's algorithm re-stated in numpy from
local_sgd.py: DiLoCo's `_step_post_hook` and `_StreamingDiLoCoFragment`'s `prepare_sync`,
`perform_sync` and `_merge_parameters` (lerp from the new global towards the local parameters
at the sync, by alpha).

Differences from the peer, and why:
- torchft compares each run with a fixture file an earlier run of the same code wrote (its
  closed-form `_validate_parameter_updates` runs only while writing one); ember's tests keep no
  recorded output of the code under test, so every case is checked against the re-statement:
  each replica's parameters and the global ones (torchft's fragments' `original_parameters`,
  ember's `start_params`) after every step.
- Replicas are ember workers on threads against in-process servers, one server a fragment
  (ember's fragments are key ranges of servers), whose BSP rounds and outer step stand for
  torchft's allreduce and outer optimizers: no lighthouse, manager, quorum or CUDA case (a
  fragmented diloco worker computes on the CPU), and so no skips.
- torchft picks a sync's fragment by its manager's step, ember by the local step: both sync
  layer 0 first (taken after step 3 - delay, merged after step 3), layer 1 three steps later.
- torchft's history is taken before each step until its manager reaches step 7; ember's after
  its start and after each of its 15 steps: the same 16 states. ember's workers then push the
  steps since each fragment's last sync (`finish`), after everything checked.
- The failure: torchft's replica 1 raises after its manager's step 2, its second committed
  sync (local step 6), is restarted and heals from replica 0's state, which it then mirrors.
  ember's worker 1 dies at the same point with no goodbye and no final push (its requests
  raise from then on; the raise stands for torchft's count of injected failures), and its
  next incarnation registers, pulls the global parameters and resumes at the step of the
  fragment synced longest ago (3), as a restarted ember worker does. It replays steps 4 to 6,
  so its next sync of fragment 1 holds 9 steps where worker 0's holds 6: the global
  parameters end equal on both workers, as torchft asserts, but not at torchft's values, and
  torchft's recorded histories of that case do not hold for ember from step 12 (worker 0) and
  from the failure on (worker 1). The test checks each worker's parameters after every step
  against the re-statement with that restart instead.
- Beyond the peer: the same mixing with whole-model diloco (one fragment, no delay), and
  ember's own rule when neither option is set (the in-flight steps kept, merged a stagger
  later), which torchft's alpha 0 would not match.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from ember.algorithms import FlatModel, WorkerContext, local_optimizer, make_update_rule
from ember.algorithms.diloco import make_diloco
from ember.config import RunConfig
from tests.conftest import SECRET, on_threads, running_servers

pytestmark = pytest.mark.timeout(60)
SYNC_EVERY, FRAGMENTS, LAYERS, REPLICAS, STEPS = 6, 2, 2, 2, 15
INNER_LR, OUTER_LR, GRADIENT = 1.0, 2.0, 2.0
TOLERANCE: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-5}
FAILS_AFTER, RESUMES_AT = 6, 3  # torchft's manager step 2; the fragment synced longest ago


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class MockLayer(torch.nn.Module):
    """torchft's MockLinear: one 1 x 1 weight starting at 1, never called; its gradient is
    set to 2 before every step."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(1, 1))


def _mock_model() -> torch.nn.Module:
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList([MockLayer() for _ in range(LAYERS)])
    return model


class InjectedFailure(Exception):
    """A worker killed: what it would have sent next never leaves it."""


@dataclass
class FailingContext(WorkerContext):
    """A worker's context whose clients send nothing once `failed` is set: every push and
    the goodbye raise instead, as if the process had died (torchft's EventInjector)."""

    failed: threading.Event = field(default_factory=threading.Event)

    def client(self, servers: list[str] | None = None, differences: bool = False) -> Any:
        client = super().client(servers, differences)
        for name in ("push", "done"):
            setattr(client, name, self._unless_failed(getattr(client, name)))
        return client

    def _unless_failed(self, request: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.failed.is_set():
                raise InjectedFailure(f"worker {self.rank} was killed")
            return request(*args, **kwargs)

        return guarded


def _reference(
    delay: int, alpha: float | None, fragments: int = FRAGMENTS, restart: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """torchft's DiLoCo (local_sgd.py) on the mock model: the replicas' parameters, indexed
    [step, replica, layer], and the global ones, [step, layer], after each step 0 to STEPS.

    Fragment f is the layers np.array_split gives it. The n-th sync takes fragment
    (n - 1) mod fragments's pseudo-gradients, global - local, after step n * stagger - delay
    and applies them `delay` steps later: the outer step on their mean, then each replica's
    fragment lerped from the new global towards its own. Beyond torchft: a delay of a whole
    stagger (pushed after step n * stagger, ember's default), alpha None for ember's own
    merge, global + (local - local as pushed), and `restart`: replica 1 dies after step
    FAILS_AFTER and comes back on the global parameters at step RESUMES_AT, replaying the
    steps since (their syncs already held), as ember restarts a worker."""
    stagger = SYNC_EVERY // fragments
    owned = np.array_split(np.arange(LAYERS), fragments)
    local, global_ = np.ones((REPLICAS, LAYERS)), np.ones(LAYERS)
    locals_, globals_ = [local.copy()], [global_.copy()]
    # at most one sync in flight: (the step it is merged after, keys, pseudo-gradients, local)
    in_flight: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []

    def merge(keys: np.ndarray, pseudo: np.ndarray, pushed: np.ndarray) -> None:
        global_[keys] -= OUTER_LR * pseudo.mean(axis=0)
        if alpha is None:
            local[:, keys] = global_[keys] + (local[:, keys] - pushed)
        else:
            local[:, keys] = global_[keys] + alpha * (local[:, keys] - global_[keys])

    for step in range(1, STEPS + 1):
        if restart and step == FAILS_AFTER + 1:  # back, with the steps since replayed
            local[1] = global_ - (FAILS_AFTER - RESUMES_AT) * INNER_LR * GRADIENT
        local -= INNER_LR * GRADIENT
        if in_flight and in_flight[0][0] == step:
            merge(*in_flight.pop()[1:])
        if (step + delay) % stagger == 0:
            keys = owned[(step - 1) // stagger % fragments]
            in_flight.append((step + delay, keys, global_[keys] - local[:, keys], local[:, keys]))
            if delay == 0:
                merge(*in_flight.pop()[1:])
        locals_.append(local.copy())
        globals_.append(global_.copy())
    return np.array(locals_), np.array(globals_)


def _config(delay: int | None, alpha: float | None, fragments: int = FRAGMENTS) -> RunConfig:
    return RunConfig(
        strategy="diloco", workers=REPLICAS, servers=fragments, tau=SYNC_EVERY,
        fragments=fragments, fragment_sync_delay=delay, mixing_alpha=alpha,
        lr=INNER_LR, momentum=0.0, outer_lr=OUTER_LR, outer_momentum=0.0,
        worker_timeout=10, request_timeout=20,
    ).validate()  # fmt: skip


@dataclass
class Trail:
    """What a worker saw: its parameters and its global ones (the fragments as last merged)
    after each step, from `first` on."""

    first: int = 0
    local: list[np.ndarray] = field(default_factory=list)
    global_: list[np.ndarray] = field(default_factory=list)


def _train(algorithm: Any, config: RunConfig, first: int, last: int, trail: Trail) -> None:
    """Run `algorithm` from step `first` up to (not including) `last`, recording the trail."""
    flat = FlatModel(_mock_model(), flat_grads=False)
    resumed = algorithm.start(flat, local_optimizer(flat.module, config))
    assert resumed == first
    trail.first = first
    trail.local.append(flat.params_np.copy())
    trail.global_.append(algorithm.start_params.copy())
    for step in range(first, last):
        for parameter in flat.module.parameters():
            parameter.grad = torch.full_like(parameter, GRADIENT)
        algorithm.after_backward(step)
        trail.local.append(flat.params_np.copy())
        trail.global_.append(algorithm.start_params.copy())


def _run(config: RunConfig, fail: bool = False) -> list[list[Trail]]:
    """Both workers against in-process servers: each worker's trails (two for a worker that
    died after step FAILS_AFTER and was restarted)."""
    trails: list[list[Trail]] = [[] for _ in range(REPLICAS)]
    start = FlatModel(_mock_model(), flat_grads=False).params_np.copy()
    with running_servers(
        start, make_update_rule(config), "bsp", config.servers, expected_workers=REPLICAS
    ) as servers:
        addresses = [s.address for s in servers]

        def context(rank: int, incarnation: int = 0) -> FailingContext:
            return FailingContext(
                config, rank, REPLICAS, addresses, SECRET, incarnation=incarnation
            )

        def work(rank: int) -> None:
            if fail and rank == 1:
                _fail_and_restart(config, context, trails[rank])
                return
            trails[rank].append(Trail())
            algorithm = make_diloco(context(rank))
            _train(algorithm, config, 0, STEPS, trails[rank][0])
            algorithm.finish()

        on_threads(work, REPLICAS)
    return trails


def _fail_and_restart(config: RunConfig, context: Any, trails: list[Trail]) -> None:
    """Worker 1 killed after step FAILS_AFTER, then its next incarnation to the end."""
    first_life, second_life = Trail(), Trail()
    trails.extend([first_life, second_life])
    dying = context(1)
    algorithm = make_diloco(dying)
    _train(algorithm, config, 0, FAILS_AFTER, first_life)
    dying.failed.set()
    with pytest.raises(InjectedFailure):
        algorithm.finish()  # its final push and goodbye never leave: the exchanger ends
    again = make_diloco(context(1, incarnation=1))
    _train(again, config, RESUMES_AT, STEPS, second_life)
    again.finish()


def _check(
    trail: Trail, locals_: np.ndarray, globals_: np.ndarray, replica: int, since: int = 0
) -> None:
    """The trail against the re-statement's replica `replica`, after each step from `since`."""
    for offset, (local, global_) in enumerate(zip(trail.local, trail.global_, strict=True)):
        step = trail.first + offset
        if step < since:
            continue
        said = f"replica {replica} after step {step}"
        np.testing.assert_allclose(local, locals_[step, replica], **TOLERANCE, err_msg=said)
        np.testing.assert_allclose(global_, globals_[step], **TOLERANCE, err_msg=said)


@pytest.mark.parametrize("alpha", [0, 0.5, 1])
@pytest.mark.parametrize("delay", [0, 1])
def test_diloco_mocked_updates(delay: int, alpha: float) -> None:
    trails = _run(_config(delay, alpha))
    locals_, globals_ = _reference(delay, alpha)
    for replica, (trail,) in enumerate(trails):
        assert len(trail.local) == STEPS + 1
        _check(trail, locals_, globals_, replica)


def test_diloco_mocked_failure_recovery() -> None:
    trails = _run(_config(delay=0, alpha=0), fail=True)
    (survivor,), (first_life, second_life) = trails
    np.testing.assert_allclose(survivor.global_[-1], second_life.global_[-1], **TOLERANCE)
    locals_, globals_ = _reference(0, 0, restart=True)
    _check(survivor, locals_, globals_, replica=0)
    _check(first_life, locals_, globals_, replica=1)
    # the steps it replays (4 to 6) trail the survivor's; from step 7 the two are level
    _check(second_life, locals_, globals_, replica=1, since=FAILS_AFTER + 1)
    assert len(first_life.local) == FAILS_AFTER + 1
    assert len(second_life.local) == STEPS - RESUMES_AT + 1


@pytest.mark.parametrize("alpha", [0, 0.5, 1])
def test_whole_model_diloco_mixes_by_the_same_rule(alpha: float) -> None:
    trails = _run(_config(delay=None, alpha=alpha, fragments=1))
    locals_, globals_ = _reference(0, alpha, fragments=1)
    for replica, (trail,) in enumerate(trails):
        _check(trail, locals_, globals_, replica)


def test_without_the_options_ember_keeps_its_own_rule_a_stagger_later() -> None:
    trails = _run(_config(delay=None, alpha=None))
    stagger = SYNC_EVERY // FRAGMENTS
    locals_, globals_ = _reference(stagger, None)
    for replica, (trail,) in enumerate(trails):
        _check(trail, locals_, globals_, replica)
    dropping, _ = _reference(stagger, 0)  # the same schedule, the in-flight steps dropped
    assert not np.allclose(locals_, dropping, **TOLERANCE)
