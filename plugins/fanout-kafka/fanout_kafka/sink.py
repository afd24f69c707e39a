"""The Kafka sink: every micro-batch lands in a topic exactly once, through transactions.

Design decisions:

- Rows are hash-partitioned into a fixed number of Spark partitions (``partitions``) by
  the key columns, or by the whole row when keyless, so partition membership is a function
  of the row and a replayed batch rebuilds the same partitions.
- Each partition is one transaction of its own producer, ``<prefix>-<partition>``, which
  also commits the partition's marker; a replay skips partitions whose marker is past the
  batch (:mod:`fanout_kafka.transaction`).
- Records are encoded and checked before a transaction begins: bad input fails the batch
  (or is dead-lettered) with nothing sent, and transactions stay short, which keeps the
  last stable offset (what ``read_committed`` readers wait for) moving.
- Partition failures come back as data, not as Spark task failures: the driver sees every
  partition's fate and raises one error naming the sink, the batch and each cause.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fanout.contract.batch import Batch, txn_app_id
from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.sink import Guarantee, PartlyHeld, SinkContext
from fanout.deadletters.held import refused_rows_held
from fanout.errors import (
    ConfigurationError,
    SchemaMismatchError,
    SinkError,
    SinkWriteError,
    TransientSinkError,
)
from fanout.ledger.gaps import ledger_note, skip_command
from fanout.observe.secrets import redact
from fanout.partitioned.membership import (
    WHOLE_ROW,
    CommittedPartition,
    PartitionPlan,
    check_hashable,
)
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.sink import PartitionedSink, PartitionInput
from fanout.routes.route import route_of
from fanout_kafka.abandoned import end_abandoned_transactions, fence_legacy_transactions
from fanout_kafka.declaration import OPTIONS
from fanout_kafka.driver_admins import ADMINS, admin_config
from fanout_kafka.errors import KafkaAbortedError, KafkaBadRecordError, KafkaFencedError
from fanout_kafka.fence import ScopeFence
from fanout_kafka.json_types import unwritable
from fanout_kafka.markers import default_transactional_id_prefix, legacy_transactional_id_prefix
from fanout_kafka.membership import forget_elsewhere_checks, read_committed, record_span
from fanout_kafka.options import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    TopicSpec,
    check_header_columns,
    check_producer_settings,
    check_topic_name,
    client_batch_size,
    client_max_message_bytes,
    columns,
    parse_create_topic,
    secret_values,
)
from fanout_kafka.records import RECORD_BATCH_HEADER_BYTES, Encoder, batch_headers
from fanout_kafka.renewal import (
    KAFKA_OFFSETS_RETENTION_MINUTES,
    UNREPORTED_RENEWAL_S,
    renew_markers,
    renewal_interval_s,
    retention_minutes,
    say_unusable_retention,
)
from fanout_kafka.reruns import new_attempt
from fanout_kafka.rivals import speculation_of
from fanout_kafka.settings import WriterSettings, producer_config, scope_of
from fanout_kafka.task import KafkaPartitionWriter
from fanout_kafka.turns import needs_turns, turn_file

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("fanout_kafka")

MARKER_RETENTION_WARN_MINUTES = 7 * 24 * 60
"""Below a week of marker retention (Kafka's default), ``open()`` warns."""

_FAILURE_ORDER = (
    "fenced",
    "timeout",
    "fatal",
    "bad_record",
    "error",
    "abortable",
    "retriable",
    "aborted",
)


def _topic_limit(cluster: Any, topic: str, spec: TopicSpec | None = None) -> int:
    """A topic's record batch limit: its ``max.message.bytes`` (for a topic still to be
    created, the one ``spec`` creates it with), else the broker's ``message.max.bytes``,
    else Kafka's default."""
    if cluster.partitions(topic) is None:
        topic_limit = spec.config.get("max.message.bytes") if spec is not None else None
    else:
        topic_limit = cluster.topic_config(topic, "max.message.bytes")
    limit = topic_limit or cluster.broker_config("message.max.bytes")
    return int(limit) if limit else KAFKA_DEFAULT_MAX_MESSAGE_BYTES


class KafkaSink(PartitionedSink):
    """Writes every micro-batch to a Kafka topic exactly once, for ``read_committed``
    readers.

    :param name: the sink name.
    :param bootstrap_servers: the brokers (``host:port,host:port`` or a list); required.
    :param topic: the target topic; required.
    :param key: the key column, or columns (key = JSON array of their values); records
        are keyless when omitted. A null key column is a bad record.
    :param value: ``"json"`` (the default: the whole row as JSON) or the name of a string
        or binary column, sent as is (null: a tombstone).
    :param headers: ``True`` (default): ``fanout.pipeline``, ``fanout.sink`` and
        ``fanout.batch_id`` on every record; ``False``: none; a list of columns: those
        headers plus one per column.
    :param producer: librdkafka settings passed through (SASL, SSL, compression, linger,
        batch size...). Settings that break transactions are rejected.
    :param transactional_id_prefix: default ``fanout/<pipeline>/<sink>``; partition ``p``
        uses ``<prefix>-<p>``. Unique per sink across every pipeline of a cluster. (The
        default was ``fanout-<pipeline>-<sink>``, ambiguous: a sink on the default fences
        those former ids once per ``open()``, :mod:`fanout_kafka.abandoned`.)
    :param marker_topic: the one-partition topic holding the markers (created if missing).
    :param partitions: the fixed number of write partitions (= producers per batch). Keep
        it fixed for a sink: markers are per partition index.
    :param transaction_timeout_ms: the transactions' timeout (at most the broker's
        ``transaction.max.timeout.ms``).
    :param dead_letter: records the topic cannot take go there instead of failing the
        batch: ``"kafka:<topic>"`` (written in the partition's transaction) or a Delta
        table path (written once the partition committed, which names them in a journal:
        :mod:`fanout_kafka.journal`).
    :param create_topic: create missing topics (target and dead-letter): ``True`` (broker
        defaults) or ``{partitions: N, replication_factor: R, config: {...}}``. They are
        created at the sink's first write, not at ``open()``: a run the lost-target check
        refuses creates none, so its retry finds the topic missing and is refused again.
    :param order_by: column(s) ordering the records of a partition (per-key order within
        a batch); without it Spark's shuffle order is kept.
    :param open_timeout_s: how long ``open()`` waits for the brokers.
    :param max_record_bytes: the record size limit, for a record's size as librdkafka
        counts it (key, value, headers with their length varints, 36 bytes of framing);
        default: the topic's ``max.message.bytes`` (or the broker's ``message.max.bytes``,
        or Kafka's default) less the 61-byte record batch header, capped by the producer's
        own ``message.max.bytes``.

    Executor-side extension points: the per-partition commit hooks
    ``fanout_partition_commit`` and ``fanout_partition_committed`` (plugins), through the
    partitioned-sink kit this sink is built on (:mod:`fanout.partitioned.sink`).
    """

    guarantees: ClassVar[tuple[Guarantee, ...]] = ("transactional",)
    read_only_check: ClassVar[bool] = True  # open(checking): no topic created
    batch_removable: ClassVar[bool] = False  # a topic keeps what it committed
    topic_id_refresh_s: ClassVar[float] = 3600.0
    """How often a run commits its topic's id again (:meth:`_record_topic_id`): the broker
    forgets a group's offset ``offsets.retention.minutes`` after its last commit."""
    marker_renewal_s: ClassVar[float | None] = None
    """How long after a renewal of the marker groups a batch renews them again
    (:mod:`fanout_kafka.renewal`); ``None``: half the brokers' ``offsets.retention.minutes``
    (:func:`fanout_kafka.renewal.renewal_interval_s`)."""
    renewal_retry_s: ClassVar[float] = 60.0
    """How long after a renewal that failed a batch tries it again (at most the renewal
    interval): not every batch, as a renewal fences and commits every marked writer again
    (a principal that lost WRITE on one id would otherwise cost that at every batch)."""
    options = OPTIONS

    def __init__(
        self,
        name: str,
        *,
        bootstrap_servers: str | Sequence[str] | None = None,
        topic: str | None = None,
        key: str | Sequence[str] | None = None,
        value: str = "json",
        headers: bool | Sequence[str] = True,
        producer: Mapping[str, Any] | None = None,
        transactional_id_prefix: str | None = None,
        marker_topic: str = "__fanout_markers",
        partitions: int = 4,
        transaction_timeout_ms: int = 60_000,
        dead_letter: str | None = None,
        create_topic: bool | Mapping[str, Any] = False,
        order_by: str | Sequence[str] | None = None,
        open_timeout_s: float = 10.0,
        max_record_bytes: int | None = None,
    ) -> None:
        super().__init__(name)
        if isinstance(bootstrap_servers, list | tuple):
            bootstrap_servers = ",".join(bootstrap_servers)
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.key = key
        self.value = value
        self.headers = headers
        if producer is not None and not isinstance(producer, Mapping):
            raise ConfigurationError(
                f"Kafka sink {name!r}: option 'producer' must be a mapping of librdkafka "
                f"settings ({{'linger.ms': 20, ...}}), got {type(producer).__name__}"
            )
        self.producer = dict(producer or {})
        self.transactional_id_prefix = transactional_id_prefix
        self.marker_topic = marker_topic
        self.partitions = partitions
        self.transaction_timeout_ms = transaction_timeout_ms
        self.dead_letter = dead_letter
        self._dead: DeadLetterTarget | None = None  # resolved by fanout, given at open()
        self._end_turns: str | None = None  # Tansu's transaction ends take turns (open())
        self._unsettled = True  # an earlier attempt may have left transactions open
        self._to_create: list[tuple[str, str]] = []  # (topic, option): at the first write
        self.create_topic = create_topic
        self.order_by = order_by
        self.open_timeout_s = open_timeout_s
        self.max_record_bytes = max_record_bytes
        self._max_batch_bytes: int | None = None  # the topics' record batch limit (open())
        self.pipeline: str | None = None  # set by open()
        self._ledger: str | None = None  # the ledger as commands name it, set by open()
        self._derived_prefix = False  # transactional_id_prefix is the default (open())
        self._legacy_prefix: str | None = None  # the former default, to fence (open())
        self._prefix_unchecked = True  # the recorded prefix not read yet (open())
        self._held_admin: dict[str, Any] | None = None  # open() to close()
        self._speculation: bool | None = None  # spark.speculation, at the first batch
        # (monotonic time, id) of the topic id's last commit in this open(): None before
        self._topic_id_recorded: tuple[float, str | None] | None = None
        # per scope, (monotonic time, span) of the partition span's last commit (open())
        self._spans: dict[str, tuple[float, int]] = {}
        # per scope, the monotonic time of this open()'s last complete renewal of its
        # marker groups, of its last renewal that failed, and of its last warning of one
        self._renewed: dict[str, float] = {}
        self._renewal_failed: dict[str, float] = {}
        self._renewal_warned: dict[str, float] = {}
        self._offsets_retention: str | None = None  # the brokers' (open()), None: unknown
        # the names the pipeline configures, until the first write in a scope asked for a
        # vanished name's batch at the topic's end (fanout_kafka.renamed): open()
        self._vanished_unasked: tuple[str, ...] = ()

    # -- lifecycle ------------------------------------------------------------------------

    def open(self, context: SinkContext) -> None:
        """Check the options, reach the brokers (within ``open_timeout_s``), check the
        topic and a dead-letter topic, check or create the marker topic (with
        ``context.checking``, ``fanout validate``: only check, telling ``context.would``
        which it would create), and resolve the record size limit. No producer is made:
        transactions are initialised (and fenced) at the first batch.

        A missing topic or dead-letter topic that ``create_topic`` allows is created at
        the first write (:meth:`_create_missing_topics`), not here: ``open()`` runs before
        the run's lost-target check (:meth:`holds_batch`), and a topic it created would
        make the retry of a refused run find one, which the markers (they outlive the
        topic) then say holds the batches. Its record size limit is the one it will be
        created with."""
        from fanout_kafka.admin import Cluster

        super().open(context)
        self.pipeline = context.pipeline
        self._ledger = context.ledger
        self._dead = context.dead_letters
        self._topic_id_recorded = None
        self._spans = {}
        self._renewed = {}
        self._renewal_failed = {}
        self._renewal_warned = {}
        self._offsets_retention = None
        self._prefix_unchecked = True
        self._check_options()
        assert isinstance(self.bootstrap_servers, str) and isinstance(self.topic, str)
        if self.transactional_id_prefix is None or self._derived_prefix:
            self._derived_prefix = True
            self.transactional_id_prefix = default_transactional_id_prefix(
                context.pipeline, self.name
            )
            # the former default's ids: fenced before the first batch's markers are read
            self._legacy_prefix = legacy_transactional_id_prefix(context.pipeline, self.name)
        self._check_producer_config()
        with Cluster(self.name, self.bootstrap_servers, self.producer,
                     self.open_timeout_s) as cluster:  # fmt: skip
            self._check_brokers(cluster, context)
        # a topic created at the first write holds no batch of a vanished name
        created = any(option == "topic" for _, option in self._to_create)
        self._vanished_unasked = () if context.checking or created else tuple(context.sinks)
        if self.headers is False and context.sinks and not context.checking:
            log.warning(
                "sink %r writes its records to topic %r without fanout's headers (headers: "
                "false), so they do not name it: renamed (or removed) after it committed its "
                "first batch of an epoch and before that batch's ledger mark (a crash between "
                "the two), the sink that takes its place cannot find that batch in the topic "
                "and writes it again (docs/architecture.md §8.3). Rename it only when `fanout "
                "status` shows its last batch marked, or set headers: true",
                self.name, self.topic,
            )  # fmt: skip
        if self._held_admin is None:  # the driver's marker reads use it from now on
            self._held_admin = admin_config(self.producer, self.bootstrap_servers)
            ADMINS.hold(self._held_admin)
        if context.readiness and context.last_mark is not None:  # fanout validate
            self._warn_markers_gone(context, context.last_mark)

    def _warn_markers_gone(self, context: SinkContext, last_mark: tuple[int, int]) -> None:
        """``fanout validate``: warn when no marker group of the ledger's current epoch is
        left (:func:`fanout_kafka.readiness.markers_gone`)."""
        from fanout_kafka.readiness import markers_gone

        gone = markers_gone(admin_config(self.producer, str(self.bootstrap_servers)),
                            marker_topic=self.marker_topic, pipeline=context.pipeline,
                            sink=self.name, partitions=self.partitions, last_mark=last_mark,
                            topic=str(self.topic), timeout_s=self.open_timeout_s)  # fmt: skip
        if gone is not None:
            context.warn("its marker groups hold its last marked batch", gone)

    def _check_brokers(self, cluster: Any, context: SinkContext) -> None:
        """:meth:`open`'s checks against the brokers: reachable, the topics (the marker
        topic created), the transaction timeout, the record size limits."""
        assert isinstance(self.bootstrap_servers, str) and isinstance(self.topic, str)
        cluster.connect()
        turns = needs_turns(cluster.cluster_id)
        self._end_turns = turn_file(self.bootstrap_servers) if turns else None
        self._unsettled = True  # a driver killed before this one left them so, perhaps
        forget_elsewhere_checks(self.name)
        if self._end_turns is not None:
            log.info(
                "sink %r: the broker is Tansu (cluster id %r): this sink's tasks commit and "
                "abort their transactions one at a time (a race in Tansu, fanout_kafka.turns)",
                self.name, cluster.cluster_id,
            )  # fmt: skip
        spec = self._topic_spec
        markers = TopicSpec(1, spec.replication_factor if spec else -1)
        topics = [
            (self.topic, "topic", spec, None),
            (self.marker_topic, "marker_topic", markers, 1),
        ]
        if self._dead_topic is not None:
            topics.append((self._dead_topic, "dead_letter", spec, None))
        self._to_create = []
        for topic, option, topic_spec, partitions in topics:
            if context.checking:  # fanout validate: create nothing, say what would be
                change = cluster.check_topic(topic, option, topic_spec, partitions=partitions)
                if change is not None:
                    context.would(change)
            elif option == "marker_topic":  # fanout's own records, not a target
                cluster.ensure_topic(topic, option, topic_spec, partitions=partitions)
            elif cluster.check_topic(topic, option, topic_spec) is not None:
                self._to_create.append((topic, option))
        self._check_transaction_timeout(cluster)
        if context.checking and context.readiness:  # fanout validate (not recover): what
            # a run would fail on only mid-stream
            self._check_readiness(cluster, [(topic, option) for topic, option, _, _ in topics])
        self._warn_marker_retention(cluster)
        broker_limit = _topic_limit(cluster, self.topic, spec)
        if self.max_record_bytes is None:
            # the broker counts a record with its batch's header; librdkafka without it
            self.max_record_bytes = min(
                broker_limit - RECORD_BATCH_HEADER_BYTES, client_max_message_bytes(self.producer)
            )
        self._cap_batch_size(cluster, broker_limit)
        log.info(
            "sink %r: Kafka topic %r on %s, %d transactional partition(s) %s-<p>, markers in "
            "%r, records up to %d bytes",
            self.name, self.topic, self.bootstrap_servers, self.partitions,
            self.transactional_id_prefix, self.marker_topic, self.max_record_bytes,
        )  # fmt: skip

    def _check_readiness(self, cluster: Any, topics: list[tuple[str, str]]) -> None:
        """``fanout validate``'s checks beyond a run's ``open()``
        (:mod:`fanout_kafka.readiness`): the topics' partitions have leaders, the
        principal's rights on them and on its marker groups where the broker says, and a
        transactional producer of the sink's prefix initialises."""
        from fanout_kafka.markers import marker_group
        from fanout_kafka.readiness import (
            check_group_rights,
            check_partitions,
            check_topic_rights,
            check_transactions,
        )

        for topic, option in topics:
            check_partitions(cluster, topic, option)
        check_topic_rights(cluster, self.producer, topics)
        pipeline = str(self.pipeline)
        check_group_rights(cluster, self.producer, marker_group(pipeline, self.name, 0),
                           f"fanout/{pipeline}")  # fmt: skip
        check_transactions(
            self.name, str(self.bootstrap_servers), self.producer,
            str(self.transactional_id_prefix), self.transaction_timeout_ms,
            self.open_timeout_s, self._end_turns,
        )  # fmt: skip

    def _cap_batch_size(self, cluster: Any, topic_limit: int) -> None:
        """Resolve the record batch limit of the topics the producers write batches to
        (the target's, and a dead-letter topic's); their ``batch.size`` is capped to it
        (:func:`fanout_kafka.settings.producer_config`), saying so when it is."""
        limits = {self.topic: topic_limit}
        if self._dead_topic is not None:
            limits[self._dead_topic] = _topic_limit(cluster, self._dead_topic, self._topic_spec)
        topic, limit = min(limits.items(), key=lambda item: item[1])
        self._max_batch_bytes = limit
        wanted = client_batch_size(self.producer)
        if wanted > limit:
            log.info(
                "sink %r: producer batch.size %d capped to %d, the max.message.bytes of topic "
                "%r: the broker refuses a larger record batch whole, records that fit with it",
                self.name, wanted, limit, topic,
            )  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        """Pickles without what :meth:`check_replay` read (the driver's, for one attempt,
        holding a weak reference: the kit's)."""
        return super().__getstate__()

    def close(self) -> None:
        """Release the driver's admin client (:mod:`fanout_kafka.driver_admins`)."""
        held, self._held_admin = self._held_admin, None
        if held is not None:
            ADMINS.release(held)

    # -- the partitioned-sink kit ---------------------------------------------------------

    def partition_input(self, batch: Batch) -> PartitionInput:
        """The batch, hashed by the key columns (the whole row when keyless), ordered by
        ``order_by`` within each partition; committed partitions are skipped on a replay."""
        df = batch.df
        self._check_columns(df.schema, batch.batch_id)
        keys = self._key_columns
        order = columns(self.name, "order_by", self.order_by) or ()
        same = [(c, c) for c in df.columns]
        return PartitionInput(
            df, list(keys or df.columns), keyed=bool(keys), sort=order, renamed=same
        )

    def shares_tasks(self) -> bool:
        """Yes: :meth:`partition_input` is the batch's own columns (it says ``renamed``)."""
        return True

    def committed_partitions(
        self, batch: Batch, plan: PartitionPlan
    ) -> Sequence[CommittedPartition]:
        """The partitions whose markers hold the batch (:mod:`fanout_kafka.membership`).
        On Tansu, first the transactions an unfinished attempt left open are ended, so the
        markers they held back are applied (:mod:`fanout_kafka.abandoned`). Once per
        ``open()`` of a sink on the default ``transactional_id_prefix``, the former
        default's ids are initialised first (fencing an older version's producers), and
        at the first batch of each ``open()`` and scope, and again once that renewal is
        half the brokers' ``offsets.retention.minutes`` old, the markers found are
        committed again, so the retention counts from then (:mod:`fanout_kafka.renewal`).

        Read once per attempt: by the kit's :meth:`check_replay` when it runs (refusing a
        replay whose topic, encoding, dead-letter target or route differs from what the
        committed partitions recorded, :mod:`fanout_kafka.target`, while nothing of the
        attempt is written), whose input, plan and read the write then takes, else by the
        write."""
        return self._read_markers(batch, plan)

    def holds_batch(self, pipeline: str, epoch: int, batch_id: int) -> bool | PartlyHeld | None:
        """Whether the partitions' markers on the marker topic say they committed the batch
        (or a later one): the markers of its ``partitions``, then of those beyond for as
        long as each has one (one admin request per partition,
        :mod:`fanout_kafka.membership`), and the partition count the holding partitions'
        plan offsets recorded. All of the batch's partitions: ``True``; some:
        :class:`fanout.PartlyHeld`; none: ``False``.

        The marker groups outlive the topic: a topic missing now holds no batch
        (``False``). ``create_topic`` creates it at the first write, after this check, so
        a run refused for it leaves it missing and its retry is refused again. Whether the
        topic there is the one the markers were written to: :meth:`target_replaced`.

        The markers are offsets of member-less groups, which the broker forgets
        ``offsets.retention.minutes`` after their last commit (7 days by default): with the
        topic there and no marker of the epoch left at all, the sink cannot tell a batch
        never written from one whose markers expired (an idle pipeline's restart), so it
        says so (``None``) instead of "none".

        Every partition holding the batch is the whole batch only once the letters their
        journals name are in the dead-letter target (a Delta table: the tasks park them
        after their commits): a lost mark recorded while they are not would make the
        replay, which parks them, skip the sink. Else :class:`fanout.PartlyHeld` with
        ``letters``."""
        if self._topic_missing():
            return False
        config = admin_config(self.producer, str(self.bootstrap_servers))
        return self._markers_hold(config, pipeline, epoch, batch_id, self.name)

    def records_gone(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Why the sink's markers of ``epoch`` are gone while the topic is there: no
        partition marker of the epoch is left at all (:meth:`holds_batch`'s ``None``:
        the groups deleted, or expired ``offsets.retention.minutes`` after their last
        commit), so the sink cannot tell which of the epoch's batches the topic holds
        (``batch_id`` is not read: the markers go together). ``None``: a marker of the
        epoch is there, or the topic is missing (a lost target). Asked at a replayed
        batch's check (:mod:`fanout.steps.replay`) once ``holds_batch`` said ``None``;
        after a ``False`` (the run's lost-target check, a new epoch's start) markers of the
        epoch are there, or the topic is missing: ``None``, as before. One metadata request
        and one marker read."""
        if self._topic_missing():
            return None
        config = admin_config(self.producer, str(self.bootstrap_servers))
        if self._markers_hold(config, pipeline, epoch, batch_id, self.name) is not None:
            return None
        from fanout.contract.batch import pipeline_scope
        from fanout_kafka.markers import marker_group

        group = marker_group(pipeline_scope(pipeline, epoch), self.name, 0)
        return (
            f"no partition marker of epoch {epoch} is left on marker topic "
            f"{self.marker_topic!r} (groups like {group!r}: deleted, or expired "
            "offsets.retention.minutes after their last commit) while topic "
            f"{str(self.topic)!r} is there"
        )

    def holds_batch_of(
        self, sink_name: str, pipeline: str, epoch: int, batch_id: int
    ) -> bool | PartlyHeld | None:
        """:meth:`holds_batch` by the markers of sink ``sink_name`` on this sink's marker
        topic (:meth:`fanout.Sink.holds_batch_of`: a sink renamed between a crash and its
        replay), counted for this topic only when that sink's topic-id group recorded this
        topic (:mod:`fanout_kafka.topic_id`, committed after a run's first batch): recorded
        for another topic, or no marker of the epoch under that name, ``False`` (it wrote
        elsewhere, or is of another type); markers that hold it and no topic id recorded,
        ``None`` (cannot tell which topic they are of)."""
        from fanout.contract.batch import pipeline_scope
        from fanout_kafka.topic_id import recorded_for

        if self._topic_missing():
            return False
        config = admin_config(self.producer, str(self.bootstrap_servers))
        held = self._markers_hold(config, pipeline, epoch, batch_id, sink_name)
        if held is None or held is False:
            return False
        scope = pipeline_scope(pipeline, epoch)
        ours = recorded_for(config, self.marker_topic, scope, sink_name, str(self.topic),
                            self.open_timeout_s)  # fmt: skip
        return held if ours else ours

    def fence_earlier_epochs(self, pipeline: str, epoch: int) -> None:
        """Close scope ``epoch - 1`` of ``pipeline`` to its tasks still running
        (:meth:`fanout.Sink.fence_earlier_epochs`; :mod:`fanout_kafka.fence`): each
        partition's transactional id of the scope's partition span is initialised (its
        producers fenced, a transaction left open aborted) and its marker committed back
        with the fence bit, which a task starting later reads after its own
        ``init_transactions`` and refuses on. Earlier epochs were closed by the start of
        ``epoch - 1``. Only at a new epoch's start: no request per batch."""
        self._scope_fence(pipeline, epoch).close(self.partitions)

    def lift_epoch_fence(self, pipeline: str, epoch: int) -> bool | None:
        """The start of ``epoch`` was refused: open scope ``epoch - 1`` again (its markers
        committed back to their real offsets, :meth:`fanout.Sink.lift_epoch_fence`).
        ``None``: each partition's real offset is committed back whether it was fenced
        or not, so it does not tell whether there was a fence."""
        self._scope_fence(pipeline, epoch).open(self.partitions)
        return None

    def _scope_fence(self, pipeline: str, epoch: int) -> ScopeFence:
        """The fence of scope ``epoch - 1`` (closed by the start of ``epoch``)."""
        from fanout.contract.batch import pipeline_scope

        if self.transactional_id_prefix is None or self.bootstrap_servers is None:
            raise ConfigurationError(f"Kafka sink {self.name!r}: fenced before open()")
        return ScopeFence(
            sink=self.name,
            scope=pipeline_scope(pipeline, epoch - 1),
            epoch=epoch,
            bootstrap_servers=str(self.bootstrap_servers),
            producer=dict(self.producer),
            prefix=self.transactional_id_prefix,
            marker_topic=self.marker_topic,
            transaction_timeout_ms=self.transaction_timeout_ms,
            timeout_s=self.open_timeout_s,
            end_turns=self._end_turns,
        )

    def target_replaced(self, pipeline: str, epoch: int, batch_id: int) -> str | None:
        """Why the topic is not the one the epoch's batches were written to: its id
        (KIP-516) is not the one recorded for the epoch (:mod:`fanout_kafka.topic_id`: the
        id is recorded once per run, so ``batch_id`` is not read) and it holds no record:
        deleted and created again since, whatever the markers say. One offset read, one
        describe request, and two list-offsets requests when the id differs. ``None``: the
        same id; another id on a topic holding records (restored from a mirror, the
        refusal's own way on: its markers answer); no recorded id (an older fanout, or one
        the broker forgot with the markers) or none from the broker (before Kafka 2.8, or a
        missing topic: :meth:`holds_batch`'s ``False``)."""
        from fanout.contract.batch import pipeline_scope

        config = admin_config(self.producer, str(self.bootstrap_servers))
        return self._topic_replaced(config, pipeline_scope(pipeline, epoch))

    def _markers_hold(
        self,
        config: dict[str, Any],
        pipeline: str,
        epoch: int,
        batch_id: int,
        name: str,
        timeout_s: float = 60.0,
    ) -> bool | PartlyHeld | None:
        """What the partitions' markers say of the batch (:meth:`holds_batch`), and, when
        every partition holds it, whether the letters they named reached the dead-letter
        target (:meth:`_letters_waiting`); the markers read within ``timeout_s``."""
        from fanout.contract.batch import pipeline_scope
        from fanout_kafka.markers import marker_group, span_group
        from fanout_kafka.membership import held_partitions

        scope = pipeline_scope(pipeline, epoch)
        committed, count = held_partitions(
            config,
            self.marker_topic,
            lambda p: marker_group(scope, name, p),
            batch_id,
            self.partitions,
            timeout_s,
            span_group=span_group(scope, name),
        )
        if committed is None:  # a later batch committed: this one did, whole
            return True
        if committed == 0 and count == 0:
            if name != self.name:  # another sink's: none of the epoch under that name
                return None
            log.info(
                "sink %r: no partition marker of epoch %s is left on marker topic %r (none "
                "committed, or offsets.retention.minutes expired them): cannot tell whether "
                "topic %r holds batch %s", name, epoch, self.marker_topic, self.topic, batch_id,
            )  # fmt: skip
            return None
        if committed == 0:
            return False
        if count is not None and committed >= count:
            waiting = self._letters_waiting(pipeline, epoch, batch_id, count, name)
            return PartlyHeld(committed, count, letters=waiting) if waiting else True
        return PartlyHeld(committed, count)

    def _letters_waiting(
        self, pipeline: str, epoch: int, batch_id: int, partitions: int, name: str
    ) -> int:
        """How many letters the batch's committed partitions named in their journals that
        the dead-letter target (not a topic: a topic's are in the transactions) does not
        hold: the task parks them after its commit, and one killed in between leaves them
        to the batch's replay. A target that cannot say what it holds (no ``read_rows``),
        or whose read fails, holds none. The letters are counted from the partitions'
        refused groups, read in one request round, and a journal (one consumer for all)
        only where its commit recorded no count (:mod:`fanout_kafka.letters`); the target
        is read only when they named letters. Such a journal gone counts as one letter
        waiting (logged)."""
        from fanout.contract.batch import BatchInfo
        from fanout_kafka.letters import named_letters

        if self._dead is None or self._dead_topic is not None:
            return 0
        batch = Batch(None, BatchInfo(pipeline, batch_id, epoch=epoch), name,
                      txn_app_id(pipeline, name, epoch))  # fmt: skip
        settings = self.settings(batch)
        found = named_letters(settings, batch_id, partitions)
        named = found.counted
        if not named and not found.unknown:
            return 0
        kept = refused_rows_held(self._dead, pipeline, name, (epoch, batch_id),
                                 secrets=self.secret_values(), logger=log)  # fmt: skip
        if not found.unknown:
            return max(named - kept, 0)
        self._log_journals_gone(settings, pipeline, epoch, batch_id, found.unknown)
        return max(named - kept, 0) + len(found.unknown)

    def _log_journals_gone(
        self,
        settings: WriterSettings,
        pipeline: str,
        epoch: int,
        batch_id: int,
        gone: Sequence[tuple[int, int]],
    ) -> None:
        """Say which partitions' letters cannot be counted, and what the user can do."""
        where = self._dead.describe() if self._dead is not None else "?"
        parts = ", ".join(f"{p} (offset {position})" for p, position in gone)
        log.warning(
            "sink %r, batch %d: the letters journal of partition(s) %s on marker topic %r is "
            "gone (the topic's retention or compaction removed it; the partitions' offsets "
            "still point at it), and their commits recorded no letter count (fanout before "
            "a count for a Delta table): cannot tell whether they set rows of this batch aside "
            "for %s. Counted as one waiting letter each, so the batch reads as held in part: "
            "a new epoch is refused and `fanout recover` records no lost mark. A replay "
            "cannot write them either (it rebuilds them from the journal). Every partition "
            "committed its rows to %r: if you accept that those partitions' refused rows of "
            "batch %d may be missing from %s, record the batch for this sink with `%s`%s "
            "and restart the query.",
            self.name, batch_id, parts, settings.marker_topic, redact(where, self.secret_values()),
            self.topic, batch_id, redact(where, self.secret_values()),
            skip_command(self._ledger, pipeline, self.name, batch_id, epoch),
            ledger_note(self._ledger),
        )  # fmt: skip

    def _topic_replaced(self, config: dict[str, Any], scope: str) -> str | None:
        """Why the topic was deleted and created again since: its id is not the one
        recorded in ``scope`` (one offset read, one describe request) and it holds no
        record. One under another id that holds records was restored from a mirror (the
        refusal's own way on): ``None``, its markers answer."""
        from fanout_kafka.topic_id import holds_records, topic_replaced

        topic = str(self.topic)
        replaced, now, group = topic_replaced(config, self.marker_topic, scope, self.name,
                                              topic, self.open_timeout_s)  # fmt: skip
        if replaced and holds_records(ADMINS.client(config), topic, self.open_timeout_s):
            log.info(
                "sink %r: topic %r has id %s now, not the one recorded when its marked "
                "batches were written (group %r), but holds records (restored from a "
                "mirror?): its markers answer", self.name, topic, now, group,
            )  # fmt: skip
            return None
        if not replaced:
            return None
        log.warning(
            "sink %r: topic %r has id %s now, not the one recorded when its marked "
            "batches were written (group %r): it was deleted and created again since",
            self.name, topic, now, group,
        )  # fmt: skip
        return (
            f"topic {topic!r} has id {now} now, not the one recorded when its marked batches "
            f"were written (group {group!r} on marker topic {self.marker_topic!r}), and holds "
            "no record"
        )

    def _record_topic_id(self, batch: Batch) -> None:
        """After the first batch's partitions of an ``open()``, and after a batch every
        :attr:`topic_id_refresh_s` since: commit the topic's id (:mod:`fanout_kafka.topic_id`)
        for the next run's lost-target check. Committed again so the broker does not forget
        it while the markers, committed every batch, are kept: a run longer than
        ``offsets.retention.minutes`` (7 days by default) left none, and the next run did
        not see a topic re-created before it. An id other than the one this run recorded
        (the topic re-created during the run) is not committed: the old one refuses the
        next run. A failure is logged and tried again after the next batch."""
        from confluent_kafka import KafkaException

        from fanout_kafka.topic_id import described_topic_id, record_topic_id, topic_id_group

        config = admin_config(self.producer, str(self.bootstrap_servers))
        admin, topic = ADMINS.client(config), str(self.topic)
        group = topic_id_group(scope_of(batch.txn_app_id, self.name), self.name, topic)
        try:
            # a describe that failed is tried again: the old id left would refuse the
            # next run after an accepted re-creation; the batch committed, so no raise
            now = described_topic_id(admin, topic, self.open_timeout_s)
            kept = None if self._topic_id_recorded is None else self._topic_id_recorded[1]
            if kept is not None and now is not None and now != kept:
                log.warning(
                    "sink %r, batch %d: topic %r has id %s now, not %s, recorded after this "
                    "run's first batch: it was deleted and created again during the run; the "
                    "old id is kept in group %r, so the next run's lost-target check refuses it",
                    self.name, batch.batch_id, topic, now, kept, group,
                )  # fmt: skip
            now = kept or now
            if now is not None:
                record_topic_id(admin, self.marker_topic, group, topic, now, self.open_timeout_s)
        except (KafkaException, TimeoutError) as exc:
            log.warning(
                "sink %r, batch %d: cannot record the id of topic %r in group %r (tried "
                "again after the next batch): %s",
                self.name, batch.batch_id, topic, group, exc,
            )  # fmt: skip
            return
        self._topic_id_recorded = (time.monotonic(), now)

    def _topic_missing(self) -> bool:
        """Whether the topic does not exist (one metadata request)."""
        from fanout_kafka.admin import Cluster

        if self.topic is None or self.bootstrap_servers is None:
            return False
        servers = str(self.bootstrap_servers)
        with Cluster(self.name, servers, self.producer, self.open_timeout_s) as cluster:
            cluster.connect()
            return cluster.partitions(self.topic) is None

    def _read_markers(self, batch: Batch, plan: PartitionPlan) -> list[CommittedPartition]:
        settings = replace(self.settings(batch), plan=plan)
        span = self._partition_span(settings, plan.partitions, batch.batch_id)
        if self._prefix_unchecked:
            self._fence_former_prefix(settings, span, batch.batch_id)
            self._prefix_unchecked = False  # once per open()
        if self._unsettled and self._end_turns is not None:
            end_abandoned_transactions(settings, span, batch.batch_id)
        self._renew_markers(settings, span, batch.batch_id)
        self._unsettled = True  # until every partition of this attempt reports
        return read_committed(settings, batch.batch_id, span)

    def _renew_markers(self, settings: WriterSettings, span: int, batch_id: int) -> None:
        """Commit the scope's marker groups again (:func:`fanout_kafka.renewal.
        renew_markers`) at the first batch of this ``open()`` in the scope, and at a
        later batch once the last complete renewal is :attr:`marker_renewal_s` old (by
        default half the brokers' ``offsets.retention.minutes``, hourly when they do not
        report it): no request in the other batches. A renewal that failed (for some
        writer, reading the markers, or raising) is tried again at the first batch
        :attr:`renewal_retry_s` later; its failures are warned at most once per scope and
        interval (at debug level between)."""
        interval = self._renewal_interval_s()
        scope = settings.scope
        last = self._renewed.get(scope)
        now = time.monotonic()  # before the commits: the retention counts from after it
        if last is not None and now - last < interval:
            return
        failed = self._renewal_failed.get(scope)
        if failed is not None and now - failed < min(self.renewal_retry_s, interval):
            return
        warned = self._renewal_warned.get(scope)
        warn = warned is None or now - warned >= interval
        complete = False
        try:
            complete = renew_markers(settings, span, batch_id, warn=warn).complete
        finally:
            if complete:
                self._renewed[scope] = now
                self._renewal_failed.pop(scope, None)
            else:  # counted from its end: a try that waited out its timeout is not retried at once
                self._renewal_failed[scope] = time.monotonic()
                if warn:
                    self._renewal_warned[scope] = now

    def _renewal_interval_s(self) -> float:
        """:attr:`marker_renewal_s`, else half the brokers' ``offsets.retention.minutes``;
        when they do not report it, hourly (:data:`fanout_kafka.renewal.
        UNREPORTED_RENEWAL_S`: theirs may be shorter than the default assumed), or on Tansu
        (which keeps offsets for ever) half Kafka's default."""
        if self.marker_renewal_s is not None:
            return self.marker_renewal_s
        tansu = self._end_turns is not None  # set by open() for a broker it knows as Tansu
        unreported = KAFKA_OFFSETS_RETENTION_MINUTES * 30.0 if tansu else UNREPORTED_RENEWAL_S
        return renewal_interval_s(self._offsets_retention, unreported_s=unreported)

    def _fence_former_prefix(self, settings: WriterSettings, span: int, batch_id: int) -> None:
        """Fence the ids of the former default prefix (a sink on the default,
        :func:`fanout_kafka.abandoned.fence_legacy_transactions`) and of the prefix the
        sink last recorded in its scope when it is not the one it uses now
        (``transactional_id_prefix`` changed since), then record this one
        (:mod:`fanout_kafka.former_ids`): one offset read, one record read when one was
        recorded, one record and one commit when it changed; once per ``open()``. In a new
        epoch's scope with no record yet, the newest earlier epoch's record is read too (a
        prefix changed together with a checkpoint reset, or two).

        A record naming the prefix in use says a run of this sink fenced the former
        default's ids already (it records only after that fence passed): the brokers
        refusing the principal every one of them is then warned, not refused.

        :raises fanout.TransientSinkError: when the record cannot be read or written, or
            the ids cannot be fenced.
        """
        from confluent_kafka import KafkaException

        from fanout_kafka.former_ids import newest_earlier_record, record_prefix, recorded_prefix

        prefix = settings.transactional_id_prefix
        former_span = span
        try:
            here = former = recorded_prefix(settings, self.open_timeout_s)
            epoch = settings.info.epoch if settings.info is not None else 0
            if here is None and epoch > 0:  # a new epoch's first: the newest earlier record
                found = newest_earlier_record(settings, epoch, self.open_timeout_s)
                former = None if found is None else found[1]
                if found is not None and former != prefix:
                    before = replace(settings, scope=found[0])
                    former_span = max(span, self._recorded_span(before))  # its ids, not ours
        except (KafkaException, TimeoutError) as exc:
            self._prefix_unrecorded(settings, exc, batch_id)
            here = former = None
            readable = False
        else:
            readable = True
        if self._legacy_prefix is not None:
            fence_legacy_transactions(settings, self._legacy_prefix, span, batch_id,
                                      fenced_before=former == prefix)  # fmt: skip
            self._legacy_prefix = None  # once per open()
        if not readable:
            return
        try:
            if former is not None and former != prefix:
                log.info(
                    "sink %r: transactional_id_prefix was %r in the last run (now %r): its "
                    "ids fenced before the markers are read", self.name, former, prefix,
                )  # fmt: skip
                fence_legacy_transactions(settings, former, former_span, batch_id)
            if here != prefix:
                record_prefix(settings, self.open_timeout_s)
        except (KafkaException, TimeoutError) as exc:
            self._prefix_unrecorded(settings, exc, batch_id)

    def _prefix_unrecorded(
        self, settings: WriterSettings, exc: BaseException, batch_id: int
    ) -> None:
        """The prefix record could not be read or written (``exc``): warned when the brokers
        refuse the rights (a record on the marker topic: needed nowhere else without Delta
        dead letters; refusing would stop every run's first batch), else refused.

        :raises fanout.TransientSinkError: unless the rights were refused.
        """
        from fanout_kafka.former_ids import rights_refused

        if rights_refused(exc):
            log.warning(
                "sink %r: cannot read or record its transactional_id_prefix on marker "
                "topic %r (%s): a prefix changed between a crash and its replay is not "
                "fenced; grant the sink's principal READ and WRITE on that topic, or "
                "change the prefix only after a clean stop", self.name,
                settings.marker_topic, redact(str(exc), self.secret_values()),
            )  # fmt: skip
            return
        raise TransientSinkError(
            f"cannot read or record the sink's transactional_id_prefix on marker topic "
            f"{settings.marker_topic!r} (read before the markers): "
            f"{redact(str(exc), self.secret_values())}",
            sink=self.name, batch_id=batch_id,
        ) from exc  # fmt: skip

    def _recorded_span(self, settings: WriterSettings) -> int:
        """The partition span recorded in ``settings.scope`` (0 when none: one request)."""
        from fanout_kafka.markers import span_group
        from fanout_kafka.membership import read_offsets

        config = admin_config(self.producer, str(self.bootstrap_servers))
        group = span_group(settings.scope, settings.sink)
        (span,) = read_offsets(config, settings.marker_topic, [group], self.open_timeout_s)
        return max(span, 0)

    def _partition_span(self, settings: WriterSettings, partitions: int, batch_id: int) -> int:
        """The partitions whose markers the driver reads (and whose transactional ids it
        ends on Tansu) each, marker or not: the most the sink has written a batch of the
        scope in, ``partitions`` recorded first when it is more (:func:`fanout_kafka.
        membership.record_span`: before this attempt writes, so a replay with fewer
        partitions finds the markers of these, also past a partition that never had rows).
        Read and committed on the first batch of each ``open()`` (and of each scope),
        read and committed again after an hour (the broker forgets a group's offset
        ``offsets.retention.minutes`` after its last commit; read again, so that a larger
        span another driver recorded meanwhile is kept) or when ``partitions`` grew: no
        request in the other batches.

        :raises fanout.TransientSinkError: when it cannot be read or committed.
        """
        from confluent_kafka import KafkaException

        known = self._spans.get(settings.scope)
        now = time.monotonic()
        if known is not None and known[1] >= partitions:
            if now - known[0] < self.topic_id_refresh_s:
                return known[1]
        config = admin_config(self.producer, str(self.bootstrap_servers))
        first = None
        if self._vanished_unasked:
            first = partial(self._refuse_vanished_writer, config, settings, batch_id)
        try:
            span = record_span(config, settings, max(partitions, known[1] if known else 0),
                               first=first)  # fmt: skip
        except (KafkaException, TimeoutError) as exc:
            raise TransientSinkError(
                f"cannot record the sink's partition count on marker topic "
                f"{settings.marker_topic!r} (read before any partition writes): {exc}",
                sink=self.name, batch_id=batch_id,
            ) from exc  # fmt: skip
        self._spans[settings.scope] = (now, span)
        return span

    def _refuse_vanished_writer(
        self, config: dict[str, Any], settings: WriterSettings, batch_id: int
    ) -> None:
        """At the sink's first write in its scope (no partition span recorded there yet,
        :func:`fanout_kafka.membership.record_span`), before anything is written: refuse
        batch ``batch_id`` when the topic's end holds records of it (or a later batch) by
        a sink of the pipeline it no longer configures whose markers in the scope hold it,
        whole or part: that sink renamed to this one (or removed) after it committed the
        batch and before its ledger mark, in its very first batch, so the ledger never
        named it and the run's start check did not ask (:mod:`fanout_kafka.renamed`). Not
        asked again in this ``open()`` once it passes. A name found whose markers do not hold
        the batch is read past (the read again without it). A read error worth trying again
        (:func:`fanout_kafka.renamed.read_error_is_transient`) is tried up to
        :data:`~fanout_kafka.renamed.READ_ATTEMPTS` times, then refused
        (:class:`fanout.TransientSinkError`); any other refuses at once
        (:class:`fanout.SinkWriteError`): the batch is not written blindly. Cannot tell, a
        warning and the batch written: the read not ended within ``open_timeout_s`` (a
        topic whose other writers wrote more since the batch's planning than can be read
        in that time), or refused its rights
        (:func:`fanout_kafka.renamed.read_error_is_unauthorized`: a sink with producer-only
        rights on its topic, which it needs nowhere else; refusing would stop every run's
        first batch)."""
        from fanout_kafka.renamed import renamed_refusal

        info, topic = settings.info, str(self.topic)
        pipeline, epoch = settings.pipeline, 0 if info is None else info.epoch
        since_ms = None if info is None else info.batch_timestamp_ms
        exclude = {*self._vanished_unasked, self.name}
        started = time.monotonic()
        deadline = started + self.open_timeout_s  # the whole read's: rounds, tries, markers
        spent = ""  # what used part of the deadline before a read again: refused if cut short
        while True:
            writers, held, unread = self._read_tail(config, topic, pipeline, epoch, batch_id,
                                                    exclude, since_ms, deadline,
                                                    spent=spent)  # fmt: skip
            if writers is None:
                log.warning(
                    "sink %r, batch %d: cannot tell whether topic %r holds this batch written "
                    "by a sink the pipeline no longer configures (its first write in the "
                    "epoch; %s). If this sink is another renamed after it committed the batch "
                    "and before its ledger mark, the batch is written again",
                    self.name, batch_id, topic, unread,
                )  # fmt: skip
                return
            for other, answer in held.items():
                if answer is True or isinstance(answer, PartlyHeld):
                    part = "" if answer is True else " (part of it: some of its partitions)"
                    raise renamed_refusal(self.name, other, topic, pipeline, epoch, batch_id,
                                          part)  # fmt: skip
            if not writers:
                break
            # names whose markers do not hold the batch: read again past them, for one
            # buried under their records that does
            exclude |= set(writers)
            spent = (
                f"reading past sink(s) {', '.join(map(repr, sorted(writers)))} first (their "
                f"records at the topic's end, their markers not holding the batch)"
            )
        log.debug("sink %r, batch %d: the topic's end read for a vanished sink's records in "
                  "%.1f ms", self.name, batch_id, 1000 * (time.monotonic() - started))  # fmt: skip
        self._vanished_unasked = ()

    def _read_tail(
        self,
        config: dict[str, Any],
        topic: str,
        pipeline: str,
        epoch: int,
        batch_id: int,
        exclude: set[str],
        since_ms: int | None,
        deadline: float,
        *,
        spent: str = "",
    ) -> tuple[dict[str, int] | None, dict[str, bool | PartlyHeld | None], str]:
        """:func:`fanout_kafka.renamed.tail_writers` and, for each name it finds, whether
        that name's markers in the scope hold batch ``batch_id``; a failure tried again,
        up to :data:`~fanout_kafka.renamed.READ_ATTEMPTS` times, when its error may pass.
        Every try, its pauses and the markers' reads end by ``deadline`` (``time.monotonic``:
        the first write's ``open_timeout_s``, for the whole read). Names ``None``: cannot
        tell, and why (the read not ended by ``deadline``, or its rights refused:
        :func:`fanout_kafka.renamed.read_error_is_unauthorized`). But a read not ended by
        ``deadline`` after part of the time went elsewhere (``spent``: a name read past
        before, by the caller; a try that failed, here) is refused, not "cannot tell": a
        read given the whole time may have found the batch (:meth:`_cut_short`).

        :raises fanout.TransientSinkError: when it still fails after those attempts, or
            when ``deadline`` passes with it failing, or after ``spent``.
        :raises fanout.SinkWriteError: at once, when its error cannot pass.
        """
        from confluent_kafka import KafkaException

        from fanout_kafka.renamed import (
            READ_ATTEMPTS,
            RETRY_PAUSE_S,
            read_error_is_transient,
            read_error_is_unauthorized,
            tail_writers,
        )

        unread = (
            f"the topic's records since the batch's planning not all read within its "
            f"open_timeout_s={self.open_timeout_s:g} s: raise it to read them"
        )
        attempt = 0
        while True:
            attempt += 1
            left = deadline - time.monotonic()
            if left <= 0:
                if spent:
                    raise self._cut_short(batch_id, topic, spent)
                return None, {}, unread
            try:
                writers = tail_writers(
                    ADMINS.client(config), config, topic, pipeline, exclude, batch_id,
                    left, since_ms=since_ms,
                )  # fmt: skip
                if writers is None and spent:
                    raise self._cut_short(batch_id, topic, spent)
                held = {
                    other: self._markers_hold(config, pipeline, epoch, batch_id, other,
                                              max(deadline - time.monotonic(), 0.001))
                    for other in sorted(writers or {})
                }  # fmt: skip
                return writers, held, unread
            except (KafkaException, TimeoutError) as exc:
                error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
                transient = not hasattr(error, "code") or read_error_is_transient(error)
                if not transient and read_error_is_unauthorized(error):
                    said = redact(str(exc), self.secret_values())
                    return None, {}, (
                        f"the sink may not read it: {said}; grant the sink's principal READ "
                        f"on the topic (or the group the error names) to have it checked, "
                        f"or rename a sink only once `fanout status` shows its last batch "
                        f"marked"
                    )  # fmt: skip
                pause = RETRY_PAUSE_S * attempt
                if transient and attempt < READ_ATTEMPTS and time.monotonic() + pause < deadline:
                    log.info(
                        "sink %r, batch %d: reading the end of topic %r failed (attempt %d of "
                        "%d), trying again: %s", self.name, batch_id, topic, attempt,
                        READ_ATTEMPTS, redact(str(exc), self.secret_values()),
                    )  # fmt: skip
                    time.sleep(pause)
                    spent = f"a try that failed with an error worth trying again ({error})"
                    continue
                raise self._unread_tail(batch_id, topic, exc, transient, attempt) from exc

    def _cut_short(self, batch_id: int, topic: str, spent: str) -> TransientSinkError:
        """The refusal of batch ``batch_id``'s first write when the read of the end of
        ``topic`` ran out of ``open_timeout_s`` after part of it went to ``spent``: a read
        given the whole time (before the shared deadline, each got its own) may have found
        the old name's batch, so writing would risk it twice. Transient: a restart reads
        again with the whole time."""
        return TransientSinkError(
            f"cannot write batch {batch_id}, this sink's first write to topic {topic!r} in "
            f"the epoch: the read of the topic's end for its records of a sink the pipeline "
            f"no longer configures (one renamed after it committed the batch and before its "
            f"ledger mark) did not end within its open_timeout_s={self.open_timeout_s:g} s "
            f"after {redact(spent, self.secret_values())}. Not written, so as not to write "
            f"such a batch twice: the run fails; restart it (the read starts again with the "
            f"whole time), or raise the sink's open_timeout_s",
            sink=self.name, batch_id=batch_id,
        )  # fmt: skip

    def _unread_tail(
        self, batch_id: int, topic: str, exc: BaseException, transient: bool, attempts: int
    ) -> SinkError:
        """The refusal of batch ``batch_id``'s first write when the end of ``topic`` (or a
        vanished name's markers) cannot be read: ``transient`` after ``attempts`` tries
        (:class:`fanout.TransientSinkError`: the batch is tried again as any transient
        failure), else at once (:class:`fanout.SinkWriteError`)."""
        said = redact(str(exc), self.secret_values())
        why = (
            f"failed {'once' if attempts == 1 else f'{attempts} times'} within its "
            f"open_timeout_s={self.open_timeout_s:g} s with an error worth trying again "
            f"({said}): the run "
            "fails; restart it once the brokers answer (if they answer and the read used its "
            "time up, a deep topic's, with the sink's open_timeout_s raised)"
            if transient
            else f"failed ({said}), an error trying again does not clear: fix it (the "
            "topic, its partitions, the sink's rights to read it) and restart"
        )
        text = (
            f"cannot write batch {batch_id}, this sink's first write to topic {topic!r} in "
            f"the epoch: the read of the topic's end for its records of a sink the pipeline "
            f"no longer configures (one renamed after it committed the batch and before its "
            f"ledger mark) {why}. Not written, so as not to write such a batch twice"
        )
        if transient:
            return TransientSinkError(text, sink=self.name, batch_id=batch_id)
        return SinkWriteError(text, sink=self.name, batch_id=batch_id)

    def after_partitions(self, batch: Batch, outcomes: Sequence[PartitionOutcome]) -> None:
        """Every partition committed or was skipped: no transaction of this attempt is
        left open; after the first batch of an ``open()``, and hourly, the topic's id is
        recorded (:meth:`_record_topic_id`)."""
        super().after_partitions(batch, outcomes)
        self._unsettled = False
        recorded = self._topic_id_recorded
        if recorded is None or time.monotonic() - recorded[0] >= self.topic_id_refresh_s:
            self._record_topic_id(batch)

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> KafkaPartitionWriter:
        """One transaction per partition, committing the batch's plan with its marker; on a
        broker whose markers may be held back, with a token of this attempt
        (:mod:`fanout_kafka.reruns`)."""
        attempt = new_attempt() if self._end_turns is not None else ""
        settings = replace(self.settings(batch), plan=plan, attempt=attempt)
        return KafkaPartitionWriter(settings, batch.batch_id)

    def result_details(self, outcomes: Sequence[PartitionOutcome]) -> Mapping[str, Any]:
        """The records sent to the dead-letter target."""
        return {"dead_letters": sum(o.dead_lettered for o in outcomes)}

    def partitioned_by(self) -> Sequence[str] | Literal["*"]:
        """The key columns, or the whole row when keyless: a replay skips committed
        partitions, so these must be deterministic (:mod:`fanout.partitioned.membership`)."""
        return self._key_columns or WHOLE_ROW

    def exclusive_resources(self, pipeline: str) -> Sequence[str]:
        """The transactional ids ``<prefix>-<p>``: two sinks on one prefix fence each
        other's producers in every batch. Claimed whatever the brokers: two bootstrap
        lists cannot be told to reach different clusters."""
        prefix = self.transactional_id_prefix
        if prefix is None or self._derived_prefix:
            prefix = default_transactional_id_prefix(pipeline, self.name)
        return (f"the Kafka transactional ids {prefix}-<p> (transactional_id_prefix {prefix!r})",)

    def secret_values(self) -> Sequence[str]:
        """Passwords, keys and tokens among the producer settings."""
        return secret_values(self.producer)

    def is_transient(self, error: BaseException) -> bool:
        """Aborted transactions (:class:`KafkaAbortedError`) are worth a replay; fenced
        producers and bad records are not."""
        return super().is_transient(error)

    # -- configuration ---------------------------------------------------------------------

    def settings(self, batch: Batch) -> WriterSettings:
        """The picklable configuration of one batch's partition tasks. Every write reads
        it first (the markers, the partition writers, the dead letters), so the topics
        :meth:`open` found missing are created here, once."""
        pipeline, batch_id = batch.pipeline, batch.batch_id
        if self.max_record_bytes is None or self.transactional_id_prefix is None:
            raise ConfigurationError(f"Kafka sink {self.name!r}: write() before open()")
        self._create_missing_topics(batch)
        header_columns: tuple[str, ...] = ()
        if not isinstance(self.headers, bool):
            header_columns = columns(self.name, "headers", self.headers) or ()
        encoder = Encoder(
            key_columns=self._key_columns,
            value_column=None if self.value == "json" else self.value,
            header_columns=header_columns,
            headers=batch_headers(pipeline, self.name, batch_id) if self.headers else (),
            max_record_bytes=self.max_record_bytes,
        )
        return WriterSettings(
            pipeline=pipeline,
            sink=self.name,
            scope=scope_of(batch.txn_app_id, self.name),
            bootstrap_servers=str(self.bootstrap_servers),
            topic=str(self.topic),
            producer=dict(self.producer),
            transactional_id_prefix=self.transactional_id_prefix,
            marker_topic=self.marker_topic,
            transaction_timeout_ms=self.transaction_timeout_ms,
            encoder=encoder,
            dead_topic=self._dead_topic,
            dead_letters=None if self._dead_topic is not None else self._dead,
            info=batch.info,
            txn_app_id=batch.txn_app_id,
            end_turns=self._end_turns,
            route=route_of(batch).fingerprint,
            route_earlier=route_of(batch).earlier,
            max_batch_bytes=self._max_batch_bytes,
            speculation=self._speculation_of(batch),
            secrets=self.letter_secrets(),
            earlier=batch.earlier,
            ledger=self._ledger,
        )

    def _create_missing_topics(self, batch: Batch) -> None:
        """Create the topics :meth:`open` found missing (``create_topic``), once per
        ``open()``: one admin connection at the first write, none after."""
        if not self._to_create:
            return
        from fanout_kafka.admin import Cluster

        servers = str(self.bootstrap_servers)
        with Cluster(self.name, servers, self.producer, self.open_timeout_s) as cluster:
            try:
                cluster.connect()
            except ConfigurationError as exc:  # out of reach, or refused: worth a retry
                said = str(exc).removeprefix(f"sink {self.name!r}: ")
                said = said.removeprefix(f"Kafka sink {self.name!r}: ")
                raise TransientSinkError(said, sink=self.name, batch_id=batch.batch_id) from exc
            spec = self._topic_spec
            while self._to_create:
                topic, option = self._to_create[0]
                try:
                    cluster.ensure_topic(topic, option, spec)
                except ConfigurationError as exc:
                    raise SinkWriteError(str(exc), sink=self.name, batch_id=batch.batch_id) from exc
                self._to_create.pop(0)

    def _speculation_of(self, batch: Batch) -> bool | None:
        """``spark.speculation`` of the batch's session, read once (a static setting)."""
        if self._speculation is None:
            self._speculation = speculation_of(batch.df)
        return self._speculation

    @property
    def _key_columns(self) -> tuple[str, ...] | None:
        return columns(self.name, "key", self.key)

    @property
    def _dead_topic(self) -> str | None:
        """The dead-letter topic when the target is one (``kafka:<topic>``)."""
        dead = self._dead
        return getattr(dead, "topic", None) if getattr(dead, "kind", None) == "kafka" else None

    @property
    def _topic_spec(self) -> TopicSpec | None:
        return parse_create_topic(self.name, self.create_topic)

    def _error(self, message: str) -> ConfigurationError:
        return ConfigurationError(f"Kafka sink {self.name!r}: {message}")

    def _check_options(self) -> None:
        if not isinstance(self.bootstrap_servers, str) or not self.bootstrap_servers.strip():
            raise self._error("option 'bootstrap_servers' is required (host:port[,host:port])")
        if self.topic is None:
            raise self._error("option 'topic' is required")
        check_topic_name(self.name, "topic", self.topic)
        check_topic_name(self.name, "marker_topic", self.marker_topic)
        if self.marker_topic == self.topic:
            raise self._error("options 'topic' and 'marker_topic' must differ")
        for option in ("partitions", "transaction_timeout_ms"):
            value = getattr(self, option)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise self._error(f"option {option!r} must be a positive integer, got {value!r}")
        if not isinstance(self.value, str) or not self.value:
            raise self._error(f"option 'value' must be 'json' or a column name, got {self.value!r}")
        if not isinstance(self.headers, bool):
            check_header_columns(self.name, columns(self.name, "headers", self.headers) or ())
        columns(self.name, "key", self.key)
        columns(self.name, "order_by", self.order_by)
        if self.dead_letter is not None and not isinstance(self.dead_letter, str):
            raise self._error("option 'dead_letter' must be a string: 'kafka:<topic>' or a path")
        if self._dead_topic is not None and self._dead_topic in (self.topic, self.marker_topic):
            raise self._error("option 'dead_letter' must not be the topic or the marker topic")
        self._topic_spec  # noqa: B018  (validates create_topic)
        limit = self.max_record_bytes
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise self._error(
                f"option 'max_record_bytes' must be a positive integer, got {limit!r}"
            )
        if not isinstance(self.open_timeout_s, int | float) or self.open_timeout_s <= 0:
            raise self._error("option 'open_timeout_s' must be a positive number of seconds")

    def _check_producer_config(self) -> None:
        from confluent_kafka import KafkaException, Producer

        self.producer = check_producer_settings(self.name, self.producer)
        config = producer_config(
            self.producer,
            str(self.bootstrap_servers),
            f"{self.transactional_id_prefix}-0",
            self.transaction_timeout_ms,
        )
        try:
            Producer(config)  # librdkafka checks names and values; no connection needed
        except (KafkaException, ValueError, TypeError) as exc:
            raise self._error(f"invalid producer settings: {exc}") from None

    def _check_transaction_timeout(self, cluster: Any) -> None:
        ceiling = cluster.broker_config("transaction.max.timeout.ms")
        if ceiling is not None and self.transaction_timeout_ms > int(ceiling):
            raise self._error(
                f"option 'transaction_timeout_ms' ({self.transaction_timeout_ms}) is over the "
                f"broker's transaction.max.timeout.ms ({ceiling}); lower it"
            )

    def _warn_marker_retention(self, cluster: Any) -> None:
        """Markers are offsets of member-less groups, which the broker forgets after
        ``offsets.retention.minutes``: a query restarted later than that after a crash in
        the middle of a batch writes that batch's committed partitions again. Say how long
        the window is (a warning when it is under a week). Brokers that do not report it
        (``describe_configs`` refused or unanswered), or report an unusable value, are
        warned of once per process, brokers and value, at info level after
        (:func:`fanout_kafka.renewal.say_unusable_retention`), naming what fanout assumes
        (Kafka's default, perhaps longer than theirs) and that it renews the markers
        hourly instead; Tansu, which reports none and keeps offsets for ever, only at info
        level."""
        value = self._offsets_retention = cluster.broker_config("offsets.retention.minutes")
        minutes = retention_minutes(value)
        if minutes is None:
            if self._end_turns is not None:  # Tansu (open() knows it by its cluster id)
                log.info(
                    "sink %r: the broker (Tansu) does not report offsets.retention.minutes "
                    "and expires no committed offset: the partition markers last as long as "
                    "its storage keeps them", self.name,
                )  # fmt: skip
                return
            say_unusable_retention(self.name, str(self.bootstrap_servers), value)
            return
        level = logging.WARNING if minutes < MARKER_RETENTION_WARN_MINUTES else logging.INFO
        log.log(
            level,
            "sink %r: the broker forgets partition markers %d minute(s) (%.1f days) after "
            "their last commit (offsets.retention.minutes): restart a query that failed in "
            "the middle of a batch within that time, or the partitions it had committed are "
            "written again; raise offsets.retention.minutes on the brokers to widen the window",
            self.name,
            minutes,
            minutes / 1440,
        )

    def check_schema(self, schema: pa.Schema) -> None:
        """Batches of the Arrow ``schema`` hold the columns the options name (``key``,
        ``headers``, ``order_by``, ``value``), a ``value`` column is a string or binary, and
        the columns written as JSON are of types it holds:
        the checks of each batch (:meth:`_check_columns`), raising the same
        :class:`SchemaMismatchError` without a batch id. Needs no broker; called by
        ``fanout validate`` after :meth:`open`."""
        from pyspark.sql.pandas.types import from_arrow_schema

        self._check_columns(from_arrow_schema(schema), None)

    def _check_columns(self, schema: Any, batch_id: int | None) -> None:
        """Batches of ``schema`` (a Spark ``StructType``) can be encoded as the options
        say: every column they name is there, the partitioning columns (the key, or every
        column when keyless) hold no map or variant Spark cannot hash, a ``value`` column is
        a string or binary, and
        every column written as JSON is of a type JSON holds faithfully
        (:mod:`fanout_kafka.json_types`).
        ``batch_id`` is ``None`` before the stream starts (:meth:`check_schema`)."""
        names = list(schema.fieldNames())
        types = {f.name: f.dataType.simpleString() for f in schema.fields}
        wanted = {
            "key": self._key_columns or (),
            "order_by": columns(self.name, "order_by", self.order_by) or (),
            "headers": ()
            if isinstance(self.headers, bool)
            else columns(self.name, "headers", self.headers) or (),
            "value": () if self.value == "json" else (self.value,),
        }
        missing = sorted({c for cols in wanted.values() for c in cols if c not in names})
        if missing:
            options = [o for o, cols in wanted.items() if any(c in missing for c in cols)]
            option = "option" if len(options) == 1 else "options"
            raise SchemaMismatchError(
                f"column(s) {', '.join(map(repr, missing))} named by {option} "
                f"{', '.join(map(repr, options))} are not in the batch (columns: "
                f"{', '.join(names)}); add them in the query or the sink's select, or change "
                f"the {option}",
                sink=self.name, batch_id=batch_id, columns=missing,
            )  # fmt: skip
        if self.value != "json" and types.get(self.value) not in ("string", "binary"):
            raise SchemaMismatchError(
                f"option 'value' names column {self.value!r} of type {types.get(self.value)}; "
                "it must be a string or binary column (or use value='json')",
                sink=self.name, batch_id=batch_id, columns=[self.value],
            )  # fmt: skip
        # the JSON of the row (value='json'), of a multi-column key, and the text of a key
        # or header that is not a string: a value it cannot hold fails here, not per record
        encoded = None if self.value == "json" else [*wanted["key"], *wanted["headers"]]
        problems = unwritable(schema, encoded)
        if problems:
            bad = list(dict.fromkeys(p.column for p in problems))
            raise SchemaMismatchError(
                "batch column(s) cannot be written as JSON faithfully: "
                + "; ".join(p.describe() for p in problems),
                sink=self.name, batch_id=batch_id, columns=bad,
            )  # fmt: skip
        # keyless: every column is hashed into the partition membership digest
        keys = wanted["key"]
        check_hashable(schema, keys or names, keyed=bool(keys), sink=self.name,
                       batch_id=batch_id)  # fmt: skip

    def partition_failure(
        self, batch: Batch, failed: Sequence[PartitionOutcome], outcomes: Sequence[PartitionOutcome]
    ) -> SinkError:
        """One error naming every failed partition's cause; its class by the worst kind:
        fenced, then bad record, then aborted (transient) when all are transient."""
        done = [o.partition for o in outcomes if o.status in ("committed", "skipped")]
        lines = [
            f"{len(failed)} of {len(outcomes)} partition(s) failed; partitions holding the "
            f"batch (skipped on replay): {done or 'none'}"
        ]
        lines += [f"  - {o.failure.message}" for o in failed if o.failure is not None]
        message = "\n".join(lines)
        kinds = {o.failure.kind for o in failed if o.failure is not None}
        worst = next((k for k in _FAILURE_ORDER if k in kinds), "error")
        error_class: type[SinkError] = SinkWriteError
        if worst == "fenced":
            error_class = KafkaFencedError
        elif worst == "bad_record":
            error_class = KafkaBadRecordError
        elif all(o.failure is not None and o.failure.transient for o in failed):
            error_class = KafkaAbortedError
        return error_class(message, sink=self.name, batch_id=batch.batch_id)
