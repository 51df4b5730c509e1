"""The parameter server: a store with an injected update rule, and its clients.

Map:
- ParameterServer -> server.py: one key-range shard: a request loop and a table from
  operation to handler
- Op, Register, Exchange, Done, Promote, Joined, Answer -> protocol.py: every request and
  reply as a class, encoded by `header()` and decoded, every field checked, by `from_header`
- ShardSpec, Shard, UpdateRule, shard_ranges -> shard.py: a shard's key range, the rule it is
  updated by, and the Shard: its parameters, rule state, step, round and clock table, and the
  only methods that write them
- PushPull -> pushpull.py: pushes and pulls held, streamed chunk by chunk, and answered
- Fold -> fold.py: contribute-then-commit of a payload's chunks, streamed or whole
- Replies -> replies.py: reply buffers, and the keys replies in flight still read
- codec.py: the identity, fp16, bf16 and int8 encodings of float32 vectors (a leaf: numpy
  and errors only)
- ShardLink, Views -> compress.py: a worker's error feedback and mirror per shard, a server's
  per-worker views; CodedExchanges -> coded.py: the server's encoded replies
- PSClient, ExchangeResult -> client.py: push/pull/exchange across shards, failing over to a
  shard's replica or restart, striped over the lanes --wire-lanes says
- fetch_state, control -> snapshot.py: one request to every shard, outside any membership
- Replication, Replicator, Role -> replica.py: a primary's copies to its backup, their apply
  on the backup, and promotion
- ClockTable -> clocks.py: per-worker clocks, incarnations and liveness of one shard, pruned
  and bounded
- clockrows.py: the clock table as int64 rows in a payload frame, and their checks
- Consistency, BulkSynchronous, StaleSynchronous, Asynchronous, make_consistency -> consistency.py

imports: errors, wire
"""

from ember.ps.client import ExchangeResult, PSClient
from ember.ps.consistency import (
    Asynchronous,
    BulkSynchronous,
    Consistency,
    StaleSynchronous,
    make_consistency,
)
from ember.ps.server import ParameterServer
from ember.ps.shard import ShardSpec, UpdateRule, shard_ranges
from ember.ps.snapshot import control, fetch_state

__all__ = [
    "Asynchronous",
    "BulkSynchronous",
    "Consistency",
    "ExchangeResult",
    "PSClient",
    "ParameterServer",
    "ShardSpec",
    "StaleSynchronous",
    "UpdateRule",
    "control",
    "fetch_state",
    "make_consistency",
    "shard_ranges",
]
