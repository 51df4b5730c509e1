"""The parameter server: a store with an injected update rule, and its clients.

Map:
- ParameterServer, UpdateRule, ShardSpec, shard_ranges -> server.py: one key-range shard
- PSClient, ExchangeResult, fetch_state, control -> client.py: push/pull/exchange across shards,
  failing over to a shard's replica or restart
- Replicator, Replicated -> replica.py: a primary's copies to its backup, and promotion
- ClockTable -> clocks.py: per-worker clocks, incarnations and liveness of one shard
- Consistency, BulkSynchronous, StaleSynchronous, Asynchronous, make_consistency -> consistency.py
"""

from ember.ps.client import ExchangeResult, PSClient, control, fetch_state
from ember.ps.consistency import (
    Asynchronous,
    BulkSynchronous,
    Consistency,
    StaleSynchronous,
    make_consistency,
)
from ember.ps.server import ParameterServer, ShardSpec, UpdateRule, shard_ranges

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
