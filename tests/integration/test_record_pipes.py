"""The local workers' record pipes: a worker killed in the middle of a record ends its own pipe
and no other's, and a worker's threads never interleave their records."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from ember.engines.recordpipes import RecordPipes, RecordSender
from ember.metrics.records import Note

FORK = mp.get_context("fork")
BIG = "x" * (1 << 20)  # far more than a pipe holds: its writer blocks until it is read


def _send(pipe: Connection, count: int, text: str = "") -> None:
    sender = RecordSender(pipe)
    for step in range(count):
        sender.send(Note(rank=step, text=text))  # the rank field numbers the records


def _start(pipes: RecordPipes, rank: int, target, *args) -> mp.process.BaseProcess:
    pipe = pipes.open(rank)
    process = FORK.Process(target=target, args=(pipe, *args), daemon=True)
    process.start()
    pipe.close()
    return process


def _collect(pipes: RecordPipes, until, seconds: float = 30.0) -> list[tuple[int, Any]]:
    got: list[tuple[int, Any]] = []
    deadline = time.monotonic() + seconds
    while not until(got) and time.monotonic() < deadline:
        got.extend(pipes.wait(0.2))
    return got


def test_a_worker_killed_while_writing_a_record_stops_only_its_own_pipe() -> None:
    pipes = RecordPipes(2, lambda: FORK.Pipe(duplex=False))
    started = [_start(pipes, 0, _send, 1, BIG)]  # blocks mid-record: nobody reads it yet
    try:
        time.sleep(0.5)
        stuck = started[0]
        assert stuck.is_alive() and stuck.pid is not None
        os.kill(stuck.pid, signal.SIGKILL)  # with part of its record in the pipe
        stuck.join(10)
        started.append(_start(pipes, 1, _send, 50))
        got = _collect(pipes, lambda got: sum(rank == 1 for rank, _ in got) == 50)
        assert [record.rank for rank, record in got if rank == 1] == list(range(50))
        got += _collect(pipes, lambda _: not pipes.is_open(0), seconds=5)
        assert not pipes.is_open(0)  # its end reached, the torn record dropped
        assert all(rank == 1 for rank, _ in got)
    finally:
        pipes.close_all()
        for process in started:
            if process.is_alive():
                process.kill()
            process.join(10)


def _two_threads(pipe: Connection) -> None:
    sender = RecordSender(pipe)

    def send(name: str) -> None:
        for step in range(5):
            sender.send(Note(rank=step, text=name + BIG[:100_000]))

    threads = [threading.Thread(target=send, args=(name,)) for name in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_records_sent_from_two_threads_arrive_whole_and_the_pipe_then_ends() -> None:
    pipes = RecordPipes(1, lambda: FORK.Pipe(duplex=False))
    worker = _start(pipes, 0, _two_threads)
    try:
        got = _collect(pipes, lambda _: not pipes.is_open(0))
        worker.join(10)
    finally:
        pipes.close_all()
        if worker.is_alive():
            worker.kill()
            worker.join(10)
    notes = [record for _, record in got if isinstance(record, Note)]
    assert sorted((r.text[0], r.rank) for r in notes) == [
        (name, step) for name in "ab" for step in range(5)
    ]
    assert len(notes) == len(got) and all(len(r.text) == 100_001 for r in notes)
