"""fanout: one Spark Structured Streaming query, exactly-once into many sinks.

The public API is what ``__all__`` lists; everything else is importable but not promised.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fanout.contract.batch import Batch, BatchInfo, IdempotencyKey, txn_app_id
from fanout.contract.options import SinkOption
from fanout.contract.partitions import StableColumns
from fanout.contract.sink import Guarantee, PartlyHeld, Reads, Sink, SinkContext, SinkResult
from fanout.errors import (
    BackfillError,
    BatchFailedError,
    CheckpointError,
    CheckpointResetError,
    CheckpointRollbackError,
    CompactionError,
    ConfigurationError,
    DeadLetterMovedError,
    DuplicatePluginError,
    DuplicateSinkTypeError,
    FanoutError,
    LagLimitError,
    LedgerError,
    MissedBatchesError,
    PartitioningError,
    PluginError,
    PluginLoadError,
    RenamedSinkError,
    RouteError,
    SchemaMismatchError,
    SinkError,
    SinkRecordsGoneError,
    SinkResultError,
    SinksBehindError,
    SinkTimeoutError,
    SinkTypeError,
    SinkUnreachableError,
    SinkWriteError,
    SpoolError,
    StopRequestedError,
    TargetLostError,
    TransientSinkError,
    UnknownSinkTypeError,
    UnmarkedBatchError,
    ZombieBatchError,
    is_stop_refusal,
)
from fanout.hooks.specs import hookimpl
from fanout.version import __version__

if TYPE_CHECKING:
    from fanout.fan_out import FanOut


def __getattr__(name: str) -> object:
    # FanOut pulls in the dispatcher, the ledger and delta-rs; plugin modules that only
    # need `Sink` and `hookimpl` should not pay for that at import time.
    if name == "FanOut":
        from fanout.fan_out import FanOut

        return FanOut
    raise AttributeError(f"module 'fanout' has no attribute {name!r}")


__all__ = [
    "BackfillError",
    "Batch",
    "BatchFailedError",
    "BatchInfo",
    "CheckpointError",
    "CheckpointResetError",
    "CheckpointRollbackError",
    "CompactionError",
    "ConfigurationError",
    "DeadLetterMovedError",
    "DuplicatePluginError",
    "DuplicateSinkTypeError",
    "FanOut",
    "FanoutError",
    "Guarantee",
    "IdempotencyKey",
    "LagLimitError",
    "LedgerError",
    "MissedBatchesError",
    "PartitioningError",
    "PartlyHeld",
    "PluginError",
    "PluginLoadError",
    "Reads",
    "RenamedSinkError",
    "RouteError",
    "SchemaMismatchError",
    "Sink",
    "SinkContext",
    "SinkError",
    "SinkOption",
    "SinkRecordsGoneError",
    "SinkResult",
    "SinkResultError",
    "SinkTimeoutError",
    "SinkTypeError",
    "SinkUnreachableError",
    "SinkWriteError",
    "SinksBehindError",
    "SpoolError",
    "StableColumns",
    "StopRequestedError",
    "TargetLostError",
    "TransientSinkError",
    "UnknownSinkTypeError",
    "UnmarkedBatchError",
    "ZombieBatchError",
    "__version__",
    "hookimpl",
    "is_stop_refusal",
    "txn_app_id",
]
