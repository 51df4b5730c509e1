"""A worker range's member reads the epoch's rows piece by piece from the servers' queue
(ps/pieces.py), not from a shard cut for it: whoever is in trains the rows, and a member
that leaves or dies leaves them to the others.

A piece is one batch of rows of the epoch's seeded order, so only its number crosses the
wire. The next piece is asked for while the current one trains (one request in flight, on a
connection of its own: the Optimizer's may be its exchanger thread's), and the request that
asks for it says the current one started; the one after says it finished.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import lru_cache

import numpy as np
import torch

from ember.data.batches import Batch, MemoryBatches
from ember.errors import EmberError
from ember.ps.piece_protocol import Dealt, Take
from ember.ps.pieces import Geometry, Key
from ember.wire import ClientConnection

WAIT_SECONDS = 0.1  # between asking again while the last pieces are held elsewhere


class PieceSource:
    """Epoch batches a member leases from the run's queue on shard 0's primary."""

    def __init__(
        self,
        rows: MemoryBatches,
        epochs: int,
        seed: int,
        server: str,
        secret: bytes,
        who: tuple[int, int],
        timeout: float,
        wait_limit: float,
    ) -> None:
        self.source, self.seed = rows, seed
        self.geometry = Geometry(rows.rows, rows.batch_size, epochs)
        self.server, self.secret, self.timeout = server.split(",")[0], secret, timeout
        self.worker, self.incarnation = who
        self.wait_limit = wait_limit  # how long the last pieces may be held elsewhere
        self._connection: ClientConnection | None = None
        self._seq = 0
        self._awaiting = False  # a request sent, its reply not read

    @property
    def steps_per_epoch(self) -> int:
        """Pieces of an epoch: a member's share of them depends on who else is in."""
        return self.geometry.pieces

    def epoch(self, epoch: int) -> Iterator[tuple[Key, Batch]]:
        """Epoch `epoch`'s pieces as this member is dealt them (one given back from an
        earlier epoch may come first): each piece's key and its batch."""
        current: Key | None = None
        dealt = self._ask(epoch, take=True)
        waited_since = None
        try:
            while True:
                if dealt.wait:
                    waited_since = waited_since or time.monotonic()
                    self._check_wait(waited_since)
                    time.sleep(WAIT_SECONDS)
                    dealt, current = self._ask(epoch, take=True, finished=current), None
                    continue
                if dealt.piece is None:
                    break
                waited_since = None
                piece = dealt.piece
                self._send(epoch, take=True, started=piece, finished=current)
                current = piece
                yield piece, self.batch(piece)
                dealt = self._reply()
        finally:
            self._close_epoch(epoch, current)

    def batch(self, key: Key) -> Batch:
        epoch, piece = key
        start = piece * self.geometry.piece_rows
        rows = _order(self.seed, epoch, self.geometry.rows)
        return self.source.rows_of(rows[start : start + self.geometry.rows_of(piece)])

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # ---- inside --------------------------------------------------------------------------------
    def _close_epoch(self, epoch: int, current: Key | None) -> None:
        """The loop is done with the epoch (or left it early): what it served is finished,
        and a piece leased ahead that it never served goes back."""
        returned = None
        if self._awaiting:
            returned = self._reply().piece
        if current is not None or returned is not None:
            self._ask(epoch, take=False, finished=current, returned=returned)

    def _ask(self, epoch: int, **fields: Key | bool | None) -> Dealt:
        self._send(epoch, **fields)
        return self._reply()

    def _send(self, epoch: int, **fields: Key | bool | None) -> None:
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
