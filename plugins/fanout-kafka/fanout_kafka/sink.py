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

The class shows the sink's contract: its hooks (lifecycle, the partitioned-sink kit, the
driver's lost-target and epoch questions, configuration) each say what they decide and hand
the long work to a module named for it, given the state it needs: :mod:`fanout_kafka.admin`
(``open()``'s checks against the brokers), :mod:`fanout_kafka.readiness` (``fanout
validate``'s), :mod:`fanout_kafka.holding` (what the markers say of a batch),
:mod:`fanout_kafka.letters`, :mod:`fanout_kafka.renewal`, :mod:`fanout_kafka.former_ids`,
:mod:`fanout_kafka.topic_id`, :mod:`fanout_kafka.vanished` (the first write's read for a
vanished writer), :mod:`fanout_kafka.schema`, :mod:`fanout_kafka.failures`. What a run keeps
between batches stays on the sink (it is pickled to the executors as it is).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from fanout.contract.batch import Batch, BatchInfo, pipeline_scope, txn_app_id
from fanout.contract.dead_letters import DeadLetterTarget
from fanout.contract.sink import Guarantee, PartlyHeld, SinkContext
from fanout.errors import ConfigurationError, SinkError, TransientSinkError
from fanout.partitioned.membership import WHOLE_ROW, CommittedPartition, PartitionPlan
from fanout.partitioned.outcome import PartitionOutcome
from fanout.partitioned.sink import PartitionedSink, PartitionInput
from fanout.routes.route import route_of
from fanout_kafka.abandoned import end_abandoned_transactions, fence_legacy_transactions
from fanout_kafka.declaration import OPTIONS
from fanout_kafka.driver_admins import ADMINS, admin_config
from fanout_kafka.failures import batch_failure
from fanout_kafka.fence import ScopeFence
from fanout_kafka.former_ids import fence_former_and_record, read_former_prefix
from fanout_kafka.holding import markers_hold
from fanout_kafka.letters import letters_waiting
from fanout_kafka.markers import (
    default_transactional_id_prefix,
    legacy_transactional_id_prefix,
    marker_group,
)
from fanout_kafka.membership import forget_elsewhere_checks, read_committed, record_span
from fanout_kafka.options import (
    TopicSpec,
    check_producer_settings,
    check_sink_options,
    client_max_message_bytes,
    columns,
    parse_create_topic,
    secret_values,
)
from fanout_kafka.records import RECORD_BATCH_HEADER_BYTES, Encoder, batch_headers
from fanout_kafka.renewal import (
    MARKER_RETENTION_WARN_MINUTES,
    RenewalSchedule,
    marker_renewal_interval_s,
    say_marker_retention,
)
from fanout_kafka.reruns import new_attempt
from fanout_kafka.rivals import speculation_of
from fanout_kafka.schema import check_columns
from fanout_kafka.settings import WriterSettings, check_producer_accepted, scope_of
from fanout_kafka.task import KafkaPartitionWriter
from fanout_kafka.topic_id import commit_run_topic_id, recorded_for, replaced_since
from fanout_kafka.turns import needs_turns, turn_file
from fanout_kafka.vanished import TailCheck

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger("fanout_kafka")


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
        the first write (:meth:`settings`, :func:`fanout_kafka.admin.create_missing_topics`),
        not here: ``open()`` runs before the run's lost-target check (:meth:`holds_batch`),
        and a topic it created would make the retry of a refused run find one, which the
        markers (they outlive the topic) then say holds the batches. Its record size limit
        is the one it will be created with."""
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
        self.producer = check_producer_settings(self.name, self.producer)
        check_producer_accepted(self.name, self.producer, str(self.bootstrap_servers),
                                self.transactional_id_prefix,
                                self.transaction_timeout_ms)  # fmt: skip
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

    def _check_options(self) -> None:
        """The options as given (:func:`fanout_kafka.options.check_sink_options`)."""
        check_sink_options(
            self.name,
            bootstrap_servers=self.bootstrap_servers,
            topic=self.topic,
            marker_topic=self.marker_topic,
            partitions=self.partitions,
            transaction_timeout_ms=self.transaction_timeout_ms,
            value=self.value,
            headers=self.headers,
            key=self.key,
            order_by=self.order_by,
            dead_letter=self.dead_letter,
            dead_topic=self._dead_topic,
            create_topic=self.create_topic,
            max_record_bytes=self.max_record_bytes,
            open_timeout_s=self.open_timeout_s,
        )

    def _check_brokers(self, cluster: Any, context: SinkContext) -> None:
        """:meth:`open`'s checks against the brokers (:mod:`fanout_kafka.admin`): reachable,
        the topics (the marker topic created), the transaction timeout, ``fanout
        validate``'s readiness (:func:`fanout_kafka.readiness.check_ready`), the markers'
        retention, the record size limits."""
        from fanout_kafka.admin import (
            cap_batch_size,
            check_topics,
            check_transaction_timeout,
            topic_limit,
        )
        from fanout_kafka.readiness import check_ready

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
        check_topics(cluster, context, topics, missing=self._to_create)
        check_transaction_timeout(cluster, self.name, self.transaction_timeout_ms)
        if context.checking and context.readiness:  # fanout validate (not recover): what
            # a run would fail on only mid-stream
            check_ready(
                cluster, [(topic, option) for topic, option, _, _ in topics], sink=self.name,
                pipeline=str(self.pipeline), bootstrap_servers=str(self.bootstrap_servers),
                producer=self.producer, prefix=str(self.transactional_id_prefix),
                transaction_timeout_ms=self.transaction_timeout_ms,
                timeout_s=self.open_timeout_s, end_turns=self._end_turns,
            )  # fmt: skip
        self._warn_marker_retention(cluster)
        broker_limit = topic_limit(cluster, self.topic, spec)
        if self.max_record_bytes is None:
            # the broker counts a record with its batch's header; librdkafka without it
            self.max_record_bytes = min(
                broker_limit - RECORD_BATCH_HEADER_BYTES, client_max_message_bytes(self.producer)
            )
        self._max_batch_bytes = cap_batch_size(cluster, self.name, self.producer,
                                               {self.topic: broker_limit}, self._dead_topic,
                                               spec)  # fmt: skip
        log.info(
            "sink %r: Kafka topic %r on %s, %d transactional partition(s) %s-<p>, markers in "
            "%r, records up to %d bytes",
            self.name, self.topic, self.bootstrap_servers, self.partitions,
            self.transactional_id_prefix, self.marker_topic, self.max_record_bytes,
        )  # fmt: skip

    def _warn_marker_retention(self, cluster: Any) -> None:
        """Keep the brokers' ``offsets.retention.minutes`` (the renewal interval's,
        :meth:`_renewal_interval_s`) and say how long the restart window it leaves is
        (:func:`fanout_kafka.renewal.say_marker_retention`)."""
        value = self._offsets_retention = cluster.broker_config("offsets.retention.minutes")
        say_marker_retention(self.name, str(self.bootstrap_servers), value,
                             tansu=self._end_turns is not None)  # fmt: skip

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

    def partition_writer(self, batch: Batch, plan: PartitionPlan | None) -> KafkaPartitionWriter:
        """One transaction per partition, committing the batch's plan with its marker; on a
        broker whose markers may be held back, with a token of this attempt
        (:mod:`fanout_kafka.reruns`)."""
        attempt = new_attempt() if self._end_turns is not None else ""
        settings = replace(self.settings(batch), plan=plan, attempt=attempt)
        return KafkaPartitionWriter(settings, batch.batch_id)

    def after_partitions(self, batch: Batch, outcomes: Sequence[PartitionOutcome]) -> None:
        """Every partition committed or was skipped: no transaction of this attempt is
        left open; after the first batch of an ``open()``, and hourly, the topic's id is
        recorded (:meth:`_record_topic_id`)."""
        super().after_partitions(batch, outcomes)
        self._unsettled = False
        recorded = self._topic_id_recorded
        if recorded is None or time.monotonic() - recorded[0] >= self.topic_id_refresh_s:
            self._record_topic_id(batch)

    def partition_failure(
        self, batch: Batch, failed: Sequence[PartitionOutcome], outcomes: Sequence[PartitionOutcome]
    ) -> SinkError:
        """One error naming every failed partition's cause; its class by the worst kind:
        fenced, then bad record, then aborted (transient) when all are transient
        (:func:`fanout_kafka.failures.batch_failure`)."""
        return batch_failure(self.name, batch.batch_id, failed, outcomes)

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
        """Aborted transactions (:class:`fanout_kafka.errors.KafkaAbortedError`) are worth a
        replay; fenced producers and bad records are not."""
        return super().is_transient(error)

    # -- a batch's markers, read by the driver before its partitions write ----------------

    def _read_markers(self, batch: Batch, plan: PartitionPlan) -> list[CommittedPartition]:
        """:meth:`committed_partitions`' read, in its order: the partition span (recorded
        first), the former prefixes' ids fenced (once per ``open()``), on Tansu the
        transactions an unfinished attempt left open ended, the marker groups renewed when
        due, then the markers."""
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
        """At the sink's first write in its scope, before anything is written: refuse batch
        ``batch_id`` when a sink of the pipeline it no longer configures committed it to
        the topic (:meth:`fanout_kafka.vanished.TailCheck.refuse_vanished_writer`). Not
        asked again in this ``open()`` once it passes."""
        if self._tail_check().refuse_vanished_writer(config, settings, batch_id,
                                                     self._vanished_unasked):  # fmt: skip
            self._vanished_unasked = ()

    def _tail_check(self) -> TailCheck:
        """The first write's read of the topic's end, with this sink's markers' answer for
        the names it finds (:meth:`_markers_hold`)."""
        return TailCheck(self.name, str(self.topic), self.open_timeout_s, self.secret_values(),
                         self._markers_hold)  # fmt: skip

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
        secrets = self.secret_values()
        found = read_former_prefix(settings, span, batch_id, self.open_timeout_s, secrets)
        if self._legacy_prefix is not None:
            fenced_before = found is not None and found.former == settings.transactional_id_prefix
            fence_legacy_transactions(settings, self._legacy_prefix, span, batch_id,
                                      fenced_before=fenced_before)  # fmt: skip
            self._legacy_prefix = None  # once per open()
        if found is not None:
            fence_former_and_record(settings, found, batch_id, self.open_timeout_s, secrets)

    def _renew_markers(self, settings: WriterSettings, span: int, batch_id: int) -> None:
        """Commit the scope's marker groups again at the first batch of this ``open()`` in
        the scope, and at a later batch once the last complete renewal is
        :attr:`marker_renewal_s` old; a renewal that failed is tried again
        :attr:`renewal_retry_s` later (:class:`fanout_kafka.renewal.RenewalSchedule`)."""
        schedule = RenewalSchedule(self._renewed, self._renewal_failed, self._renewal_warned,
                                   interval_s=self._renewal_interval_s(),
                                   retry_s=self.renewal_retry_s)  # fmt: skip
        schedule.renew_when_due(settings, span, batch_id)

    def _renewal_interval_s(self) -> float:
        """:attr:`marker_renewal_s`, else half the brokers' ``offsets.retention.minutes``
        (:func:`fanout_kafka.renewal.marker_renewal_interval_s`; Tansu is known by
        ``open()``)."""
        return marker_renewal_interval_s(self.marker_renewal_s, self._offsets_retention,
                                         tansu=self._end_turns is not None)  # fmt: skip

    def _record_topic_id(self, batch: Batch) -> None:
        """After the first batch's partitions of an ``open()``, and after a batch every
        :attr:`topic_id_refresh_s` since: commit the topic's id (:mod:`fanout_kafka.topic_id`)
        for the next run's lost-target check. Committed again so the broker does not forget
        it while the markers, committed every batch, are kept: a run longer than
        ``offsets.retention.minutes`` (7 days by default) left none, and the next run did
        not see a topic re-created before it. An id other than the one this run recorded
        (the topic re-created during the run) is not committed: the old one refuses the
        next run. A failure is logged and tried again after the next batch
        (:func:`fanout_kafka.topic_id.commit_run_topic_id`)."""
        config = admin_config(self.producer, str(self.bootstrap_servers))
        kept = None if self._topic_id_recorded is None else self._topic_id_recorded[1]
        scope = scope_of(batch.txn_app_id, self.name)
        done, now = commit_run_topic_id(config, self.marker_topic, scope, self.name,
                                        str(self.topic), kept, batch.batch_id,
                                        self.open_timeout_s)  # fmt: skip
        if done:
            self._topic_id_recorded = (time.monotonic(), now)

    # -- the driver's questions: lost target, replaced topic, renamed sink, epochs --------

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
        config = admin_config(self.producer, str(self.bootstrap_servers))
        return replaced_since(config, self.marker_topic, pipeline_scope(pipeline, epoch),
                              self.name, str(self.topic), self.open_timeout_s)  # fmt: skip

    def _markers_hold(
        self,
        config: dict[str, Any],
        pipeline: str,
        epoch: int,
        batch_id: int,
        name: str,
        timeout_s: float = 60.0,
    ) -> bool | PartlyHeld | None:
        """What the partitions' markers of sink ``name`` say of the batch
        (:func:`fanout_kafka.holding.markers_hold`), read within ``timeout_s``, when every
        partition holds it with the letters they named that the dead-letter target does
        not hold (:meth:`_letters_waiting`)."""
        return markers_hold(
            config, sink=self.name, name=name, marker_topic=self.marker_topic,
            topic=self.topic, partitions=self.partitions, pipeline=pipeline, epoch=epoch,
            batch_id=batch_id, timeout_s=timeout_s,
            letters_waiting=lambda count: self._letters_waiting(pipeline, epoch, batch_id,
                                                                count, name),
        )  # fmt: skip

    def _letters_waiting(
        self, pipeline: str, epoch: int, batch_id: int, partitions: int, name: str
    ) -> int:
        """How many letters the batch's committed partitions named in their journals that
        the dead-letter target does not hold (:func:`fanout_kafka.letters.letters_waiting`):
        none without a target outside the cluster (a topic's letters are in the
        transactions)."""
        if self._dead is None or self._dead_topic is not None:
            return 0
        batch = Batch(None, BatchInfo(pipeline, batch_id, epoch=epoch), name,
                      txn_app_id(pipeline, name, epoch))  # fmt: skip
        return letters_waiting(self.settings(batch), self._dead, pipeline, epoch, batch_id,
                               partitions, name, topic=self.topic,
                               secrets=self.secret_values())  # fmt: skip

    def _topic_missing(self) -> bool:
        """Whether the topic does not exist (:func:`fanout_kafka.admin.topic_missing`)."""
        from fanout_kafka.admin import topic_missing

        return topic_missing(self.name, self.bootstrap_servers, self.producer,
                             self.open_timeout_s, self.topic)  # fmt: skip

    # -- configuration ---------------------------------------------------------------------

    def settings(self, batch: Batch) -> WriterSettings:
        """The picklable configuration of one batch's partition tasks. Every write reads
        it first (the markers, the partition writers, the dead letters), so the topics
        :meth:`open` found missing are created here, once
        (:func:`fanout_kafka.admin.create_missing_topics`: one admin connection at the
        first write, none after)."""
        pipeline, batch_id = batch.pipeline, batch.batch_id
        if self.max_record_bytes is None or self.transactional_id_prefix is None:
            raise ConfigurationError(f"Kafka sink {self.name!r}: write() before open()")
        if self._to_create:
            from fanout_kafka.admin import create_missing_topics

            create_missing_topics(self.name, str(self.bootstrap_servers), self.producer,
                                  self.open_timeout_s, self._to_create, self._topic_spec,
                                  batch_id)  # fmt: skip
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
        say (:func:`fanout_kafka.schema.check_columns`). ``batch_id`` is ``None`` before
        the stream starts (:meth:`check_schema`)."""
        check_columns(schema, batch_id, sink=self.name, key=self._key_columns,
                      value=self.value, headers=self.headers,
                      order_by=self.order_by)  # fmt: skip

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


__all__ = ["MARKER_RETENTION_WARN_MINUTES", "KafkaSink"]
