"""The errors of the Kafka sink, each under fanout's hierarchy.

::

    SinkWriteError
    ├── KafkaFencedError      another writer took over a transactional id (fatal)
    ├── KafkaBadRecordError   a record the topic cannot take, no dead-letter target
    ├── KafkaMarkerError      a partition marker fanout cannot trust (fatal, before writing)
    └── EpochFencedError      a task of a query a checkpoint reset replaced (fatal, before writing)
    TransientSinkError
    └── KafkaAbortedError     a partition's transaction was aborted; replay the batch
"""

from __future__ import annotations

from fanout.errors import SinkWriteError, TransientSinkError


class KafkaFencedError(SinkWriteError):
    """A partition's producer was fenced: a newer producer with the same
    ``transactional.id`` took over, so this attempt is a zombie. Its transaction is
    aborted by the broker; retrying in this process would only fence the other writer."""


class KafkaBadRecordError(SinkWriteError):
    """A record the topic cannot take (null key where a key is required, over the size
    limit, rejected by the broker) and no ``dead_letter`` target is configured."""


class KafkaMarkerError(SinkWriteError):
    """A partition's marker says something no run of this sink can have written: a batch
    past the one being written (another pipeline or sink shares the marker identity, or
    the ledger lost marks), a batch half committed under fanout 0.1's marker names, or one
    half committed with its markers in another topic than ``marker_topic`` names now.
    Raised on the driver before any partition writes: skipping on such a marker would lose
    rows, writing over it could duplicate them."""


class KafkaAbortedError(TransientSinkError):
    """A partition's transaction was aborted (an abortable broker error, retries of a
    retriable one exhausted, or a veto from a ``fanout_partition_commit`` hook). Nothing of
    it is visible to ``read_committed`` readers; fanout retries the batch, and the
    partitions that committed are skipped through their markers."""


class EpochFencedError(SinkWriteError):
    """A task (or driver) of a replaced epoch -- a checkpoint reset started a new one --
    found its partition's marker closed by the new epoch's start (:mod:`fanout_kafka.fence`):
    it writes nothing, since the new epoch writes the batch. Not transient."""
