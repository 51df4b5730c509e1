"""Streaming DiLoCo in the throughput model: diloco with `--fragments F` (algorithms/streaming.py).

Every stagger = tau / F local steps one fragment, 1/F of the parameters on S / F of the servers,
syncs in a BSP round of its own. The exchanger thread runs the round while the worker computes
the next stagger's steps, and the result is merged a stagger later, the worker waiting there only
if it is not back. So a stagger costs the longer of its compute (plus the exchanger's CPU, which
comes out of compute's cores) and the round's own time, instead of their sum; and the link
carries a fragment's bytes per stagger, the same bytes per tau steps as whole-model diloco but
spread over the period."""

from __future__ import annotations

import math
from dataclasses import replace

from ember.config import Strategy
from ember_lab.perfmodel.inputs import Calibration
from ember_lab.perfmodel.prediction import Prediction


def fragment_calibration(c: Calibration, fragments: int) -> Calibration:
    """The figures of an exchange of one fragment: 1/F of the parameters, so 1/F of the bytes
    and of each end's CPU per exchange. What a synchronous round waits beyond its exchange
    (the workers' jitter, on_host's blocked time less the exchange) does not shrink with it."""
    share = 1 / fragments
    on_host = dict(c.on_host)
    for name, (step, blocked) in c.on_host.items():
        if not Strategy(name).overlaps_exchange:
            on_host[name] = (step, blocked - c.exchange_wall * (1 - share))
    return replace(
        c,
        parameters=math.ceil(c.parameters * share),
        exchange_wall=c.exchange_wall * share,
        client_cpu=c.client_cpu * share,
        server_cpu=c.server_cpu * share,
        codec_cpu=c.codec_cpu * share,
        on_host=on_host,
    )


def fragments_prediction(
    round_: Prediction, part: Calibration, tau: float, servers: int, fragments: int
) -> Prediction:
    """Predicted samples/s of diloco synced in `fragments` fragments, from `round_`: predict()'s
    whole-model diloco at tau / F steps on 1/F of the parameters (`part`, from
    fragment_calibration) and S / F servers; the round is overlapped by the next stagger's
    compute. The Prediction's period, compute and tau are a whole period's (F staggers);
    t_comm is one fragment's round beyond its compute, what the merge may wait for."""
    stagger = tau / fragments
    compute, bounds = round_.compute, round_.bounds
    beyond = max(0.0, bounds["worker"] - compute)  # the round's wait, exchange and turns
    # the exchanger's CPU is taken from the cores the worker computes on
    candidates = {"worker": max(compute + part.client_cpu + part.codec_cpu, beyond)}
    if "network" in bounds:  # the link's turns of one round, while the steps go on
        candidates["network"] = max(0.0, bounds["network"] - compute)
    for name in ("server", "cpu"):  # what a stagger's round costs them does not overlap
        if name in bounds:
            candidates[name] = bounds[name]
    bound = max(candidates, key=lambda k: candidates[k])
    period = candidates[bound]
    n = round_.workers
    throughput = n * stagger * part.batch_size / period if period > 0 else float("inf")
    return Prediction(
        Strategy.DILOCO.value,
        n,
        servers,
        tau,
        throughput,
        period * fragments,
        max(beyond, candidates.get("network", 0.0)),
        bound,
        compute * fragments,
        {name: value * fragments for name, value in candidates.items()},
        fragments,
    )


def fragments_closing_seconds(prediction: Prediction) -> float:
    """What a worker of a fragmented run does after its last step: wait for the fragment in
    flight, then push each fragment's last steps without a pull, one after another; a push
    alone moves half a round's bytes."""
    return prediction.t_comm * (1 + prediction.fragments / 2)
