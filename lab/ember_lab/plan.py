"""What `ember plan` prints: ember_lab.perfmodel's predictions as a table, and advice drawn from it.

imports: perfmodel; and ember's public names
"""

from __future__ import annotations

from dataclasses import dataclass

from ember.config import DILOCO_TAU, Strategy
from ember_lab.perfmodel import (
    AUTO_MARGIN,
    FLOAT_BYTES,
    Calibration,
    Network,
    Prediction,
    evaluation_wait,
    model_tau,
    predict,
)

# every strategy a column; easgd-async has one per tau, after them
PLAN_STRATEGIES: tuple[Strategy, ...] = tuple(s for s in Strategy if s is not Strategy.EASGD_ASYNC)
EASGD_TAU = 8  # the synchronous easgd column's communication period
# the period of each column whose strategy exchanges every tau steps; 1 (n_push) for the rest
COLUMN_TAU = {Strategy.EASGD: EASGD_TAU, Strategy.DILOCO: DILOCO_TAU}
# diloco's Streaming column: the fragments it syncs in, a fragment's keys on servers of its own
PLAN_FRAGMENTS = 2
SERVER_COUNTS = (1, 2, 4, 8, 16, 32)
MISSING = "—"


@dataclass(frozen=True)
class Option:
    """One cell of the table: a strategy, its tau and its servers, with the prediction."""

    column: str  # the table's header for it
    prediction: Prediction

    def __str__(self) -> str:
        p = self.prediction
        mode = Strategy(p.strategy)
        text = p.strategy + (f" at tau {p.tau}" if mode.periodic else "")
        text += f" in {p.fragments} fragments" if p.fragments > 1 else ""
        if not mode.uses_server:  # the same at any server count
            return text
        return f"{text} with {p.servers} server{'s' if p.servers != 1 else ''}"


def columns(taus: list[int]) -> list[str]:
    fixed = [f"{s} tau={COLUMN_TAU[s]}" if s in COLUMN_TAU else str(s) for s in PLAN_STRATEGIES]
    streaming = f"diloco tau={DILOCO_TAU} fragments={PLAN_FRAGMENTS}"
    return [*fixed, streaming, *(f"easgd-async tau={t}" for t in taus)]


def fragment_servers(servers: int, fragments: int) -> int:
    """The servers a fragmented diloco runs on in a row of `servers`: that many when the
    fragments divide them, else the next multiple of the fragments (a fragment per server
    group: fragment f is the keys of servers [f S/F, (f+1) S/F))."""
    return -(-servers // fragments) * fragments


def row_options(
    workers: int, servers: int, c: Calibration, network: Network, taus: list[int]
) -> list[Option | None]:
    """The cells of one table row; None where a column does not apply: `single` beyond one
    worker, `allreduce` on one (a ring of one is `single`), and the strategies without servers
    in a row of more than one server."""
    cells: list[Option | None] = []
    runs = [(s, COLUMN_TAU.get(s, 1), 1) for s in PLAN_STRATEGIES]
    runs += [(Strategy.DILOCO, DILOCO_TAU, PLAN_FRAGMENTS)]
    runs += [(Strategy.EASGD_ASYNC, t, 1) for t in taus]
    for column, (strategy, tau, fragments) in zip(columns(taus), runs, strict=True):
        alone = {Strategy.SINGLE: workers > 1, Strategy.ALLREDUCE: workers == 1}.get(strategy)
        if alone or (not strategy.uses_server and servers > 1):
            cells.append(None)
            continue
        on = fragment_servers(servers, fragments)
        prediction = predict(strategy, workers, c, network, tau, on, fragments)
        cells.append(Option(column, prediction))
    return cells


def server_counts(workers: int, c: Calibration, network: Network, taus: list[int]) -> list[int]:
    """The server counts the table shows for `workers` workers: 1, and the fewest servers whose
    best cell comes within 5% of the best at any count, when more than one."""

    def best(servers: int) -> float:
        cells = row_options(workers, servers, c, network, taus)
        return max(o.prediction.samples_per_second for o in cells if o is not None)

    options = [s for s in SERVER_COUNTS if s <= workers]
    top = max(best(s) for s in options)
    fewest = next(s for s in options if best(s) >= 0.95 * top)
    return [1] if fewest == 1 else [1, fewest]


def _cell(option: Option, servers: int) -> str:
    """Predicted samples/s (what bounds it), and the servers when not the row's."""
    p = option.prediction
    on = f" on {p.servers} servers" if p.servers != servers else ""
    return f"{_samples(p.samples_per_second)} ({p.bound}){on}"


def _samples(value: float) -> str:
    return f"{value:,.0f}"


def advice(workers: int, options: list[Option], single: float) -> str:
    """Why the fastest of the printed options for `workers` workers is recommended."""
    # sorted() is stable: of equal figures, the one printed first leads
    ranked = sorted(options, key=lambda o: -o.prediction.samples_per_second)
    best, speed = ranked[0], ranked[0].prediction.samples_per_second
    why = [_samples(speed)]
    if best.prediction.strategy != Strategy.SINGLE:
        why[0] += f", {speed / single:.1f}x single's"
    if len(ranked) > 1:
        runner_up = ranked[1]
        why.append(f"against {_samples(runner_up.prediction.samples_per_second)} for {runner_up}")
    line = (
        f"- for {workers} worker{'s' if workers != 1 else ''}: {best} — the highest predicted"
        f" samples/s in the table above ({'; '.join(why)})"
    )
    smaller = [
        o
        for o in options
        if o.prediction.strategy == best.prediction.strategy == Strategy.EASGD_ASYNC
        and o.prediction.servers == best.prediction.servers
        and o.prediction.tau < best.prediction.tau
        and o.prediction.samples_per_second >= 0.9 * speed
    ]
    if smaller:
        near = min(smaller, key=lambda o: o.prediction.tau)
        line += (
            f"; tau {near.prediction.tau} comes within 10%"
            f" ({_samples(near.prediction.samples_per_second)}) and lets workers drift apart less"
        )
    return line


def plan_report(
    calibration: Calibration, network: Network, workers: list[int], taus: list[int]
) -> str:
    """The table `ember plan` prints: predicted samples/s per strategy, tau and server count,
    and for each worker count the fastest of its rows, with the figures that make it so."""
    c = calibration
    single = predict(Strategy.SINGLE, 1, c, network).samples_per_second
    where = (
        f"{link_label(network.bandwidth)} links, {network.latency * 1e3:g} ms latency,"
        " a host per worker and per server"
        if network.bandwidth is not None
        else f"all on this host, {network.cores or c.cores} cores"
    )
    lines = [
        f"calibrated here: {c.t_comp * 1e3:.2f} ms per batch of {c.batch_size} on {c.device}"
        + (f" in {c.precision}" if c.precision != "32" else "")
        + ";"
        f" one exchange of {2 * FLOAT_BYTES * c.parameters / 1e6:.2f} MB takes"
        f" {c.exchange_wall * 1e3:.2f} ms ({c.server_cpu * 1e3:.2f} ms of server CPU)"
        + (f"; compressed to {c.exchange_bytes / 1e6:.2f} MB" if c.compression != 1 else ""),
        f"predicted for: {where}",
        f"single: {_samples(single)} samples/s",
        "",
        "predicted samples/s (what bounds it) per worker and server count: a row at more servers"
        " appears where they raise the best figure by more than 5%; single runs on 1 worker,"
        f" allreduce on more, and neither on a server ({MISSING} where a column does not apply)",
    ]
    if c.t_eval > 0:
        waiting = ", ".join(s for s in PLAN_STRATEGIES if evaluation_wait(s, 1, c) > 0)
        lines.insert(
            2,
            f"worker 0 evaluates the test set in {c.t_eval * 1e3:.0f} ms; in {waiting} the other"
            " workers wait that long at each evaluation (not in the table)",
        )
    headers = ["workers", "servers", *columns(taus)]
    table = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    recommended = []
    for n in workers:
        shown: list[Option] = []
        for servers in server_counts(n, c, network, taus):
            cells = row_options(n, servers, c, network, taus)
            text = [MISSING if o is None else _cell(o, servers) for o in cells]
            table.append("| " + " | ".join([str(n), str(servers), *text]) + " |")
            shown += [o for o in cells if o is not None]
        recommended.append(advice(n, shown, single))
    note = (
        "A larger tau lets workers drift apart, so time to target is also divided by d, the"
        " extra samples a row needs (`ember bench` measures d)."
    )
    return "\n".join([*lines, *table, "", "recommended:", *recommended, "", note])


# ---- scale on paper: where the server links saturate, and the servers that prevent it ----------
MAX_SERVERS = 1024  # the most servers scale_report searches


def link_label(bandwidth: float) -> str:
    bits = bandwidth * 8
    return f"{bits / 1e9:g} Gbit/s" if bits >= 1e9 else f"{bits / 1e6:g} Mbit/s"


def saturation(
    strategy: str, c: Calibration, network: Network, workers: list[int], tau: int = 1
) -> Prediction | None:
    """The prediction at the fewest of `workers` at which one server's link (network) or CPU
    (server) sets the period, or None when none of them does."""
    for n in workers:
        p = predict(strategy, n, c, network, tau, 1)
        if p.bound in ("network", "server"):
            return p
    return None


def servers_needed(workers: int, tau: int, c: Calibration, network: Network) -> int | None:
    """The fewest servers at which easgd-async at `tau` is compute-bound, or None when no
    count is: then the worker's own link takes longer than tau minibatches."""

    def enough(servers: int) -> bool:
        return predict(Strategy.EASGD_ASYNC, workers, c, network, tau, servers).compute_bound

    if not enough(MAX_SERVERS):
        return None
    low, high = 1, MAX_SERVERS  # more servers never lengthen the period: search by halves
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle) else (middle + 1, high)
    return low


def scale_report(c: Calibration, network: Network, workers: list[int], taus: list[int]) -> str:
    """For one link rate: where each strategy saturates one server's links, and how many servers
    keep easgd-async compute-bound at each worker count and tau."""
    if network.bandwidth is None:
        return ""
    rate = link_label(network.bandwidth)
    wire = c.exchange_bytes / network.bandwidth
    lines = [
        f"### at scale on {rate} links, {network.latency * 1e3:g} ms latency",
        "",
        f"An exchange puts {c.exchange_bytes / 1e6:.2f} MB on a worker's link"
        f" ({c.compression:.3g}x float32's bytes): {wire * 1e3:,.1f} ms at {rate}, against"
        f" {c.t_comp * 1e3:.2f} ms of compute per minibatch. One server's link carries every"
        " worker's exchanges.",
        "",
        f"Where each strategy saturates one server (of {', '.join(map(str, workers))} workers):",
        "",
        "| strategy | saturates at | bound there | samples/s there | samples/s at 1 worker |",
        "|---|---|---|---|---|",
    ]
    runs = [(str(s), COLUMN_TAU.get(s, 1)) for s in PLAN_STRATEGIES]
    runs += [(str(Strategy.EASGD_ASYNC), t) for t in taus]
    for strategy, tau in runs:
        if strategy in (Strategy.SINGLE, Strategy.ALLREDUCE):
            continue  # no server to saturate
        label = strategy + (f" tau={tau}" if Strategy(strategy).periodic else "")
        first = predict(strategy, 1, c, network, tau, 1).samples_per_second
        hit = saturation(strategy, c, network, workers, tau)
        if hit is None:
            cells = [f"not up to {workers[-1]} workers", MISSING, MISSING]
        else:
            cells = [f"{hit.workers} workers", hit.bound, _samples(hit.samples_per_second)]
        lines.append("| " + " | ".join([label, *cells, _samples(first)]) + " |")
    lines += [
        "",
        "Servers that keep easgd-async compute-bound (none: the worker's own link takes longer"
        " than tau minibatches at any server count), and the tau `--tau auto` would pick:",
        "",
        "| workers | " + " | ".join(f"tau={t}" for t in taus) + " | tau auto, 1 server |"
        " tau auto samples/s |",
        "|" + "---|" * (len(taus) + 3),
    ]
    for n in workers:
        needed = [servers_needed(n, t, c, network) for t in taus]
        auto = model_tau(c, network, n, 1, margin=AUTO_MARGIN)
        speed = predict(Strategy.EASGD_ASYNC, n, c, network, auto, 1).samples_per_second
        cells = ["none" if s is None else str(s) for s in needed]
        lines.append("| " + " | ".join([str(n), *cells, str(auto), _samples(speed)]) + " |")
    return "\n".join(lines)
