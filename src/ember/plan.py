"""What `ember plan` prints: ember.perfmodel's predictions as a table, and advice drawn from it."""

from __future__ import annotations

from dataclasses import dataclass

from ember.config import AlgorithmKind, Strategy
from ember.perfmodel import Calibration, Network, Prediction, evaluation_wait, predict

# every strategy a column; easgd-async has one per tau, after them
PLAN_STRATEGIES: tuple[Strategy, ...] = tuple(s for s in Strategy if s is not Strategy.EASGD_ASYNC)
EASGD_TAU = 8  # the synchronous easgd column's communication period
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
        text = p.strategy + (f" at tau {p.tau}" if mode.algorithm is AlgorithmKind.EASGD else "")
        if not mode.uses_server:  # the same at any server count
            return text
        return f"{text} with {p.servers} server{'s' if p.servers != 1 else ''}"


def columns(taus: list[int]) -> list[str]:
    easgd = [f"easgd tau={EASGD_TAU}" if s is Strategy.EASGD else str(s) for s in PLAN_STRATEGIES]
    return [*easgd, *(f"easgd-async tau={t}" for t in taus)]


def row_options(
    workers: int, servers: int, c: Calibration, network: Network, taus: list[int]
) -> list[Option | None]:
    """The cells of one table row; None where a column does not apply: `single` beyond one
    worker, `allreduce` on one (a ring of one is `single`), and the strategies without servers
    in a row of more than one server."""
    cells: list[Option | None] = []
    runs: list[tuple[Strategy, int]] = [
        (s, EASGD_TAU if s is Strategy.EASGD else 1) for s in PLAN_STRATEGIES
    ]
    runs += [(Strategy.EASGD_ASYNC, t) for t in taus]
    for column, (strategy, tau) in zip(columns(taus), runs, strict=True):
        alone = {Strategy.SINGLE: workers > 1, Strategy.ALLREDUCE: workers == 1}.get(strategy)
        if alone or (not strategy.uses_server and servers > 1):
            cells.append(None)
            continue
        cells.append(Option(column, predict(strategy, workers, c, network, tau, servers)))
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
        f"{network.bandwidth * 8 / 1e9:g} Gbit/s links, {network.latency * 1e3:g} ms latency,"
        " a host per worker and per server"
        if network.bandwidth is not None
        else f"all on this host, {network.cores or c.cores} cores"
    )
    lines = [
        f"calibrated here: {c.t_comp * 1e3:.2f} ms per batch of {c.batch_size};"
        f" one exchange of {c.exchange_bytes / 1e6:.2f} MB takes {c.exchange_wall * 1e3:.2f} ms"
        f" ({c.server_cpu * 1e3:.2f} ms of server CPU)",
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
            text = [
                MISSING
                if o is None
                else f"{_samples(o.prediction.samples_per_second)} ({o.prediction.bound})"
                for o in cells
            ]
            table.append("| " + " | ".join([str(n), str(servers), *text]) + " |")
            shown += [o for o in cells if o is not None]
        recommended.append(advice(n, shown, single))
    note = (
        "A larger tau lets workers drift apart, so time to target is also divided by d, the"
        " extra samples a row needs (`ember bench` measures d)."
    )
    return "\n".join([*lines, *table, "", "recommended:", *recommended, "", note])
