"""A worker range's member reads the epoch's rows piece by piece from the servers' queue
(ps/pieces.py), not from a shard cut for it: whoever is in trains the rows, and a member
that leaves or dies leaves them to the others.

A piece is a run of rows of the epoch's seeded order (MemoryPieces: batches of rows held in
memory; streamed.py: rows read from disk when the piece is dealt), so only its number crosses
the wire. The next piece is asked for while the current one trains
(one request in flight, on a connection of its own: the Optimizer's may be its exchanger
thread's), and the request that asks for it says the current one started; the one after says
it finished. A member told to leave finishes the piece it is in first (`between_pieces`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from functools import lru_cache, partial
from typing import Protocol

import numpy as np
import torch

from ember.data.batches import Batch, MemoryBatches
from ember.errors import EmberError
from ember.ps.piece_protocol import Dealt, Take
from ember.ps.pieces import Geometry, Key
from ember.wire import ClientConnection

# Between asking again while the run has fewer than MIN members, or its last pieces are held
# elsewhere: from the first to the most, doubling. Members start within milliseconds of each
# other, and the first to ask waited a whole 0.1 s for the others before.
FIRST_WAIT_SECONDS, WAIT_SECONDS = 0.005, 0.1
PIECES_PER_MEMBER = 8  # an epoch's pieces for each member at the run's MAX, at least
BATCHES_PER_PIECE = 16  # at most: a piece request (a round trip to shard 0) per this many steps


def piece_batches(batches: int, members: int) -> int:
    """Batches in a piece of an epoch of `batches` batches dealt to up to `members` members:
    as many as keep the dealing's cost (a request a piece, the servers' bookkeeping) a small
    part of a step's, while each member still gets PIECES_PER_MEMBER pieces an epoch, which
    even out when the members end it and bound what a dead member's piece trains twice."""
    return max(1, min(BATCHES_PER_PIECE, batches // (PIECES_PER_MEMBER * max(1, members))))


class PieceRows(Protocol):
    """Where a member's dealt pieces' rows come from: `rows` rows an epoch, cut by the same
    rule in every member, so a piece's number says which rows it holds."""

    rows: int
    batch_size: int

    def piece_rows(self, members: int) -> int:
        """Rows of a piece when up to `members` members share an epoch."""
        ...

    def cut(self, key: Key, geometry: Geometry) -> list[Callable[[], Batch]]:
        """The piece's batches, each gathered when it is called (at its step)."""
        ...


class MemoryPieces:
    """Rows held in memory, dealt as runs of batches of each epoch's seeded permutation."""

    def __init__(self, rows: MemoryBatches, seed: int) -> None:
        self.source, self.seed = rows, seed
        self.rows, self.batch_size = rows.rows, rows.batch_size

    def piece_rows(self, members: int) -> int:
        return self.batch_size * piece_batches(self.rows // self.batch_size, members)

    def cut(self, key: Key, geometry: Geometry) -> list[Callable[[], Batch]]:
        # Gathered as it is trained: a piece's batches gathered at once (3 MiB at batch size
        # 64) had left cache by their step, which ran 5-8% slower.
        return [partial(self.source.rows_of, rows) for rows in self.batch_rows(key, geometry)]

    def batch_rows(self, key: Key, geometry: Geometry) -> list[torch.Tensor]:
        """The piece's row numbers cut into batches of the run's size, the last taking those
        left over."""
        epoch, piece = key
        start = piece * geometry.piece_rows
        rows = _order(self.seed, epoch, geometry.rows)[start : start + geometry.rows_of(piece)]
        return batch_cuts(rows, self.batch_size)


def batch_cuts(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """`rows` cut into batches of `size`, the last taking those left over."""
    starts = range(0, max(1, len(rows) // size) * size, size)
    ends = [*starts[1:], len(rows)]
    return [rows[a:b] for a, b in zip(starts, ends, strict=True)]


class PieceSource:
    """Epoch batches a member leases from the run's queue on shard 0's primary."""

    def __init__(
        self,
        rows: PieceRows,
        epochs: int,
        members: int,
        server: str,
        secret: bytes,
        who: tuple[int, int],
        timeout: float,
        wait_limit: float,
    ) -> None:
        self.source, self.batch_size = rows, rows.batch_size
        self.geometry = Geometry(rows.rows, rows.piece_rows(members), epochs)
        self.between_pieces = True  # the batch served last ended its piece
        self.server, self.secret, self.timeout = server.split(",")[0], secret, timeout
        self.worker, self.incarnation = who
        self.wait_limit = wait_limit  # how long the last pieces may be held elsewhere
        self._connection: ClientConnection | None = None
        self._seq = 0
        self._awaiting = False  # a request sent, its reply not read
        # the member's own steps done (its Optimizer's, once connected): said when it starts
        # or gives back a piece, so that the servers count what it trained of one it lost
        self.steps: Callable[[], int | None] = lambda: None

    @property
    def steps_per_epoch(self) -> int:
        """Batches of an epoch: a member's share of them depends on who else is in."""
        return max(1, self.geometry.rows // self.batch_size)

    def epoch(self, epoch: int) -> Iterator[tuple[Key, Batch]]:
        """Epoch `epoch`'s pieces as this member is dealt them (one given back from an
        earlier epoch may come first): each batch of each piece, with the piece's key."""
        current: Key | None = None
        dealt = self._ask(epoch, take=True)
        waited_since, wait = None, FIRST_WAIT_SECONDS
        try:
            while True:
                if dealt.wait:
                    waited_since = waited_since or time.monotonic()
                    self._check_wait(waited_since)
                    time.sleep(wait)
                    wait = min(2 * wait, WAIT_SECONDS)
                    dealt, current = self._ask(epoch, take=True, finished=current), None
                    continue
                if dealt.piece is None:
                    break
                waited_since, wait = None, FIRST_WAIT_SECONDS
                piece = dealt.piece
                self._send(epoch, take=True, started=piece, finished=current, step=self.steps())
                current = piece
                cuts = self.source.cut(piece, self.geometry)
                for index, batch in enumerate(cuts, 1):
                    self.between_pieces = index == len(cuts)
                    yield piece, batch()
                dealt = self._reply()
        finally:
            self._close_epoch(epoch, current)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- inside --------------------------------------------------------------------------------
    def _close_epoch(self, epoch: int, current: Key | None) -> None:
        """The loop is done with the epoch (or left it early): what it served is finished,
        and a piece leased ahead that it never served goes back, as does one it left
        half-trained (whose rows are then trained twice in part)."""
        ahead = self._reply().piece if self._awaiting else None
        if current is not None and not self.between_pieces:  # left inside it: not finished
            self._ask(epoch, take=False, returned=current, step=self.steps())
            current = None
        if current is not None or ahead is not None:
            self._ask(epoch, take=False, finished=current, returned=ahead)

    def _ask(self, epoch: int, **fields: Key | bool | int | None) -> Dealt:
        self._send(epoch, **fields)
        return self._reply()

    def _send(self, epoch: int, **fields: Key | bool | int | None) -> None:
        if self._connection is None:
            self._connection = ClientConnection(self.server, self.secret, self.timeout, watch=True)
        if self._awaiting:
            self._reply()
        self._seq += 1
        request = Take(
            worker=self.worker,
            incarnation=self.incarnation,
            seq=self._seq,
            epoch=epoch,
            geometry=self.geometry,
            batch=self.batch_size,
            **fields,  # type: ignore[arg-type]
        )
        self._connection.send(request.header())
        self._awaiting = True

    def _reply(self) -> Dealt:
        assert self._connection is not None
        header, _ = self._connection.recv()
        self._awaiting = False
        return Dealt.from_header(header)

    def _check_wait(self, since: float) -> None:
        if time.monotonic() - since > self.wait_limit:
            raise EmberError(
                f"worker {self.worker}: the run's last pieces have been held by other members "
                f"for {self.wait_limit:.0f} s (servers at {self.server})"
            )


@lru_cache(maxsize=2)  # this epoch's, and an earlier one's for a piece given back
def _order(seed: int, epoch: int, rows: int) -> torch.Tensor:
    """The epoch's rows in the order its pieces cut them: fixed by the seed and the epoch
    alone, whoever trains them."""
    rng = np.random.default_rng([seed, 0x91ECE, epoch])
    return torch.from_numpy(rng.permutation(rows))
