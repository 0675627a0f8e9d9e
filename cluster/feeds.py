"""Queues and durable subscriptions across the nodes of a cluster, kept by JetStream.

A queue is one queue cluster-wide: consumers on any node compete for its messages, and each
message goes to one of them. A durable subscription is one subscription cluster-wide: its
subscriber may come back on any node and finds what was published meanwhile. What either
holds is kept by JetStream, not by the nodes, so it outlives any one node and any one NATS
server:

* **Streams.** Each queue ``Q`` is a stream of its own, ``GW_<cluster>_Q_<digest of Q>`` on
  ``gw.<cluster>.q.Q``, with work-queue retention (a message goes when it is acknowledged) and
  the queue's limits: ``maxmsgs`` and ``maxbytes`` as the stream's, its ``overflowPolicy`` as
  what the stream discards when full (new messages, refused to their producer, or with
  ``discardOld`` the oldest), changed when the queue's definition is (as a RabbitMQ quorum
  queue is a Raft group of its own). ``GW_<cluster>_TOPICS`` on ``gw.<cluster>.p.>`` has
  interest retention (a message stays until every durable subscription it matches has
  acknowledged it; one that matches none is not kept). All on file storage with
  :attr:`GatewaySettings.cluster_replicas` copies (NATS documentation, "JetStream",
  "Streams": retention policies, limits, discard policy, replicas).
* **Producers.** A message to queue ``Q`` goes to ``gw.<cluster>.q.Q``; a persistent message to
  topic ``T`` that a durable subscription somewhere in the cluster matches
  (:mod:`cluster.durables`) goes to ``gw.<cluster>.p.T`` as well as to the nodes' live
  subscribers (:mod:`cluster.link`). Each in the store's binary encoding
  (:mod:`gateway.serial`), with its message id as ``Nats-Msg-Id``, so that JetStream drops a
  second copy within its duplicate window. A persistent message is confirmed to its producer
  only when JetStream has acknowledged it (its ``PubAck``: written on a majority of the
  replicas), and is sent again every :data:`PUB_RETRY` until then (a lost acknowledgement, a
  stream electing its leader); a non-persistent one is sent and not waited for (JMS allows
  its loss when something fails), but for one to a queue with limits, whose producer learns
  that the queue is full as on one gateway, and for one to a queue whose stream JetStream
  has not yet said is there (made by another node at the same moment, or slow to answer
  under load): sent before the stream is, it would be lost.
* **Consumers.** One durable JetStream consumer per queue and per durable subscription (its
  name a digest of the endpoint's key, which may hold characters JetStream's names may not),
  shared by every node: a queue's filtered on its subject, a durable subscription's on its
  pattern (EMS's wildcards are NATS's) and delivering what is published after it was made.
  A node pulls from one only while the endpoint has consumers there, as much as they can
  take (their windows, :data:`PULL_CAP` at most), :data:`PULL_BATCH` at a time. What it
  pulls is put on its local endpoint, never in its own store, and dispatched as any message
  is (a durable subscription's selector and no-local apply then); when the message leaves the
  endpoint for good (acknowledged, expired, moved to ``$sys.undelivered``, purged) the node
  acknowledges it to JetStream.
* **Nodes that go.** A node renews what it holds (JetStream's "in progress") every third of
  ``ack_wait``. When the last consumer of an endpoint on a node goes, the node gives back
  what it had not delivered (a NAK: JetStream delivers it again at once, elsewhere); when
  they are only paused, a queue's node does so after :data:`PAUSED_WAIT`, a durable
  subscription's not (:meth:`Feed.consumers_changed`). A node
  that dies holds its messages no longer than ``cluster_ack_wait``: JetStream then delivers
  them to another, with their delivery count, so the consumer sees JMSRedelivered and
  ``maxRedelivery`` counts across nodes. A message JetStream gives again after this node
  acknowledged it (the acknowledgement lost with a connection or a leader) is acknowledged
  again, not delivered.

An exclusive queue is pulled by one node at a time: the one that holds its lease
(:mod:`cluster.leases`, :meth:`QueueFeed.consumers_changed`).

The admin API browses a queue in JetStream (:meth:`Feeds.browse_queue`); a JMS QueueBrowser
(AMQP, STOMP) sees what its node holds.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import BadRequestError, NotFoundError

from cluster.durables import DurableIndex
from cluster.leases import Leases
from cluster.ordered import Ordered
from gateway import subject
from gateway.errors import (
    GatewayError,
    LimitExceededError,
    MessageFormatError,
    UnavailableError,
)
from gateway.message import PROP_IMPORTED, DeliveryMode, Message
from gateway.serial import decode_message, encode_message

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS
    from nats.js.client import JetStreamContext

    from gateway.facade import Core

log = logging.getLogger("cluster")

PULL_CAP = 256  # most messages of one queue a node holds at once
PULL_BATCH = 32  # most messages one pull request asks for: JetStream serves the requests
                 # waiting in turn, so that nodes share a backlog in slices of this size
FETCH_WAIT = 1.0  # seconds one pull request waits for messages to come
PUB_ACK_WAIT = 10.0  # seconds a persistent message waits for JetStream's acknowledgement
PUB_RETRY = 1.0  # seconds between sends of a persistent message JetStream has not confirmed
ACKED_WINDOW = 10_000  # ids of messages acknowledged here, remembered (see Feed._take)
RETRY_WAIT = 0.5  # seconds before trying again what JetStream refused
LOST_WAIT = 0.5  # seconds past a pull request's expiry before it counts as lost
PAUSED_WAIT = 5.0  # seconds a queue's consumers stay paused before its node gives back
STREAM_NOT_FOUND = 10059  # JetStream's error code for an unknown stream


class Feeds:
    """Every feed of this node, and what they share: the streams, the producers'
    confirmations, one ordered way out to NATS and the renewal of held messages."""

    def __init__(self, broker: Core, nc: NATS, cluster_name: str, replicas: int,
                 ack_wait: float) -> None:
        self.broker = broker
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.durables = DurableIndex(self.js, cluster_name, replicas)
        self.durables.listener = self._durable_changed
        self.queue_stream_prefix = f"GW_{cluster_name}_Q_"
        self.queue_prefix = f"gw.{cluster_name}.q."
        self.topic_stream = f"GW_{cluster_name}_TOPICS"
        self.topic_prefix = f"gw.{cluster_name}.p."
        self.replicas = replicas
        self.ack_wait = ack_wait
        self.queues: dict[str, QueueFeed] = {}  # by queue name
        self.by_consumer: dict[str, Feed] = {}  # every feed, by JetStream consumer name
        self.inbox = ""  # JetStream's acknowledgements of persistent messages: inbox.<n>
        self.pulls = ""  # pull requests' answers: pulls.<consumer name>
        # reply subject -> the producer's wait, and what to send again: (future, subject,
        # payload, headers, deadline)
        self.waiting: dict[str, tuple[asyncio.Future[None], str, bytes, dict[str, str],
                                      float]] = {}
        # ids of the messages acknowledged to JetStream here, newest last: one JetStream
        # gives again (the acknowledgement lost with a connection or a leader) is not
        # delivered twice
        self.acked_ids: OrderedDict[str, None] = OrderedDict()
        self.seq = 0
        # what goes to NATS, in order, by one task a loop turn: ("pub", subject, payload,
        # headers, reply), (how, JetStream message) to acknowledge, NAK or terminate, and
        # ("bind" | "drop", feed) to make or delete a JetStream consumer
        self.outbox = Ordered(self._handle)
        self.renewer: asyncio.Task[None] | None = None
        self.leases: Leases | None = None  # an exclusive queue's consumer node holds one
        self.durable_made = False  # since the last mark
        self.fresh: list[str] = []  # durables made here, to tell the other nodes of
        self.durable_mark: asyncio.Future[None] | None = None
        self.stats = {"queued": 0, "stored": 0, "pulled": 0, "acked": 0, "returned": 0}

    async def start(self) -> None:
        topics = api.StreamConfig(
            name=self.topic_stream, subjects=[self.topic_prefix + ">"],
            retention=api.RetentionPolicy.INTEREST, storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            description="the gateway cluster's persistent topic messages for durable "
                        "subscriptions")
        try:
            await make_stream(self.js, topics)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise GatewayError(
                f"JetStream cannot keep the stream {topics.name} with {self.replicas} "
                f"replicas (cluster_replicas in gateway.conf): {exc}") from None
        await self.durables.start()
        # Both inboxes are subscribed to at once and for good: a pull request is dropped
        # by a JetStream server that has not yet heard of interest in its reply subject.
        self.inbox = self.nc.new_inbox()
        await self.nc.subscribe(self.inbox + ".*", cb=self._pub_ack)
        self.pulls = self.nc.new_inbox()
        await self.nc.subscribe(self.pulls + ".*", cb=self._pulled)
        await self.nc.flush()
        self.renewer = asyncio.ensure_future(self._renew())
        self.broker.feed_queues(self.queue_feed)
        self.broker.feed_durables(self.durable_feed)

    async def close(self) -> None:
        for feed in list(self.by_consumer.values()):
            feed.give_back(final=True)
        self.broker.feed_queues(None)
        self.broker.feed_durables(None)
        if self.renewer is not None:
            self.renewer.cancel()
        await self.outbox.flush(PUB_ACK_WAIT)  # acknowledgements under way go out first
        await self.durables.close()
        for fut, *_ in self.waiting.values():
            if not fut.done():
                fut.set_exception(UnavailableError("the cluster link closed"))
        self.waiting.clear()

    def queue_feed(self, name: str) -> QueueFeed:
        """The feed of queue ``name`` (what ``Core.feed_queues`` asks for); its stream is
        made (or brought to the queue's limits) before anything is sent to it."""
        f = self.queues.get(name)
        if f is None:
            f = self.queues[name] = QueueFeed(self, name)
            self.by_consumer[f.consumer] = f
            f.ask_stream()
        return f

    def queue_stream(self, name: str) -> str:
        """Queue ``name``'s stream: its name a digest, as JetStream's names may not hold
        every character a queue's may."""
        return self.queue_stream_prefix + hashlib.sha256(name.encode()).hexdigest()[:32]

    def queue_changed(self, pattern: str) -> None:
        """The definition that ``pattern`` names changed (the admin API, on any node):
        the streams of the queues it governs take their new limits."""
        for name, f in self.queues.items():
            if name == pattern or subject.matches(pattern, name):
                f.ask_stream()

    async def queue_streams(self) -> list[api.StreamInfo]:
        """Every queue's stream, as JetStream has it now."""
        out: list[api.StreamInfo] = []
        offset = 0
        while True:  # 256 a page
            page = await self.js.streams_info(offset=offset)
            out.extend(i for i in page if (i.config.name or "").startswith(
                self.queue_stream_prefix))
            if len(page) < 256:
                return out
            offset += len(page)

    def durable_feed(self, key: str, pattern: str, parent_match: bool) -> DurableFeed:
        """The feed of durable subscription ``key`` (what ``Core.feed_durables`` asks
        for); its JetStream consumer is made now, so that it keeps what is published from
        now on whether or not its subscriber is here."""
        f = DurableFeed(self, key, pattern, parent_match)
        self.by_consumer[f.consumer] = f
        self.durables.add(f.consumer, pattern, parent_match)
        f.binding = True
        self.send(("bind", f))
        self.send(("record", f.consumer))
        self.durable_made = True
        self.fresh.append(f.consumer)
        return f

    def mark(self) -> asyncio.Future[None] | None:
        """A future done once the durable subscriptions made so far are in JetStream and
        in the durables bucket (what goes to NATS goes in order), or None when none was
        made since the last one (ClusterLink.ready)."""
        if self.durable_made:
            self.durable_made = False
            self.durable_mark = self.broker.loop.create_future()
            self.send(("mark", self.durable_mark))
        return self.durable_mark

    def _durable_changed(self, consumer: str, entry: tuple[str, bool] | None) -> None:
        """A durable subscription ended, or was made again with another pattern, on some
        node: a copy of it here that no consumer uses is stale, and this node lets go of
        it (without touching what JetStream keeps), so that its subscriber, if it comes
        back here, gets the cluster's."""
        feed = self.by_consumer.get(consumer)
        if not isinstance(feed, DurableFeed) or feed.consumers:
            return
        if entry is not None and entry == (feed.pattern, feed.parent_match):
            return
        del self.by_consumer[consumer]
        feed.ended = True
        self.broker.release_durable(feed.key)

    def forget_durable(self, key: str) -> None:
        """Durable subscription ``key``, which this node does not hold, ends for good (an
        MQTT session that starts clean where an earlier one of its client id, on another
        node, left one): its JetStream consumer goes, with what it kept."""
        consumer = consumer_name(key)
        if consumer not in self.by_consumer:
            self.send(("forget", self.topic_stream, consumer))

    async def _pulled(self, jm: Msg) -> None:
        """A pulled message (its consumer named in its reply subject, JetStream's
        acknowledgement subject) or a pull request's status (its subject the request's own
        inbox, ``pulls.<consumer name>``)."""
        if jm.headers and "Status" in jm.headers:
            feed = self.by_consumer.get(jm.subject.rsplit(".", 1)[-1])
        else:
            try:
                feed = self.by_consumer.get(jm.metadata.consumer)
            except Exception:  # noqa: BLE001 - no JetStream reply subject: not ours
                feed = None
        if feed is not None:
            feed.arrived(jm)
        elif not (jm.headers and "Status" in jm.headers):
            self.send(("nak", jm))  # for a feed that ended meanwhile

    def send(self, item: tuple[Any, ...]) -> None:
        self.outbox.put(item)

    async def _handle(self, item: tuple[Any, ...]) -> None:
        """One item queued to NATS (see ``outbox``)."""
        what = item[0]
        if what == "pub":
            await self._publish(*item[1:])
        elif what == "bind":
            await item[1].bind()
        elif what == "stream":
            await item[1].make_stream()
        elif what == "mark":
            if not item[1].done():
                item[1].set_result(None)
        elif what == "drop":
            await self._delete_consumer(item[1].stream, item[1].consumer)
        elif what == "forget":
            await self._delete_consumer(item[1], item[2])
        elif what == "record":
            await self.durables.put(item[1])
        else:
            await _settle(item[1], what)

    async def _delete_consumer(self, stream: str, consumer: str) -> None:
        try:
            await self.js.delete_consumer(stream, consumer)
        except Exception as exc:  # noqa: BLE001 - e.g. deleted already by another node
            log.debug("JetStream consumer %s: %s", consumer, exc)
        if stream == self.topic_stream and consumer not in self.by_consumer:
            # (a subscription made again under the same name since keeps its entry)
            await self.durables.delete(consumer)

    async def purge_queue(self, name: str) -> int:
        """Purge queue ``name``'s messages from JetStream, wherever they are (waiting, or
        held by a node); how many there were. A request of JetStream's API
        (``$JS.API.STREAM.PURGE``) rather than nats-py's ``purge_stream``, which does not
        give the count."""
        try:
            reply = await self.nc.request(f"$JS.API.STREAM.PURGE.{self.queue_stream(name)}",
                                          b"", timeout=PUB_ACK_WAIT)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise UnavailableError(f"JetStream did not answer: {exc}") from None
        answer = json.loads(reply.data)
        if "error" in answer and answer["error"].get("err_code") == STREAM_NOT_FOUND:
            return 0  # never used on any node
        if "error" in answer:
            raise UnavailableError(f"JetStream did not purge queue {name!r}: "
                                   f"{answer['error'].get('description', answer['error'])}")
        return int(answer.get("purged", 0))

    async def browse_queue(self, name: str, limit: int) -> list[Message]:
        """The first ``limit`` messages JetStream keeps for queue ``name``, in the queue's
        order, not consumed: those waiting, and those delivered and not yet acknowledged on
        any node (JetStream's message get, next by subject)."""
        subject_name = self.queue_prefix + name
        stream = self.queue_stream(name)
        out: list[Message] = []
        seq = 1
        try:
            while len(out) < limit:
                try:
                    raw = await self.js.get_msg(stream, seq=seq, subject=subject_name,
                                                next=True)
                except NotFoundError:  # no more, or no such stream
                    break
                seq = (raw.seq or seq) + 1
                try:
                    out.append(decode_message(raw.data or b""))
                except MessageFormatError as exc:
                    log.warning("queue %s: an undecodable message: %s", name, exc)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise UnavailableError(f"JetStream did not answer: {exc}") from None
        return out

    # -- producers ------------------------------------------------------------------------

    def publish(self, subject_name: str, msg: Message, *, confirm: bool = False,
                ) -> asyncio.Future[None] | None:
        """Send ``msg`` to JetStream on ``subject_name``; for a persistent one (or any, with
        ``confirm``), what its producer's confirmation waits for."""
        try:
            payload = encode_message(msg)
        except MessageFormatError as exc:
            raise GatewayError(f"cannot send {msg.message_id} to the cluster: {exc}",
                               reason="message-format") from None
        # JetStream drops a second message of one id within its duplicate window: a
        # message sent again here, or a far side's resend of what a transport imported,
        # which carries the first copy's trace id (see cluster.leases)
        dest = msg.destination
        if PROP_IMPORTED in msg.properties and msg.trace_id and dest is not None:
            msg_id = f"{msg.trace_id}:{dest.name}"
        else:
            msg_id = msg.message_id or ""
        headers = {"Nats-Msg-Id": msg_id}
        if msg.delivery_mode != DeliveryMode.PERSISTENT and not confirm:
            self.send(("pub", subject_name, payload, headers, ""))
            return None
        self.seq += 1
        reply = f"{self.inbox}.{self.seq}"
        loop = self.broker.loop
        fut: asyncio.Future[None] = loop.create_future()
        self.waiting[reply] = (fut, subject_name, payload, headers, loop.time() + PUB_ACK_WAIT)
        loop.call_later(PUB_RETRY, self._unconfirmed, reply)
        self.send(("pub", subject_name, payload, headers, reply))
        return fut

    def store_for_durables(self, topic: str, msg: Message) -> asyncio.Future[None] | None:
        """A persistent message to ``topic`` that durable subscriptions match."""
        self.stats["stored"] += 1
        return self.publish(self.topic_prefix + topic, msg)

    def _unconfirmed(self, reply: str) -> None:
        """No answer yet: send it again (JetStream drops the second copy by its
        ``Nats-Msg-Id``: a lost acknowledgement, or a stream electing its leader), until
        :data:`PUB_ACK_WAIT` has passed."""
        entry = self.waiting.get(reply)
        if entry is None:
            return
        loop = self.broker.loop
        if loop.time() >= entry[4]:
            self._settle(reply, UnavailableError(
                f"JetStream did not acknowledge the message in {PUB_ACK_WAIT:g} s"))
            return
        loop.call_later(PUB_RETRY, self._unconfirmed, reply)
        self.send(("pub", entry[1], entry[2], entry[3], reply))

    async def _publish(self, subject_name: str, payload: bytes,
                       headers: dict[str, str] | None, reply: str) -> None:
        try:
            await self.nc.publish(subject_name, payload, reply=reply, headers=headers)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.debug("cannot send to %s: %s", subject_name, exc)  # sent again, or given up

    async def _pub_ack(self, nmsg: Msg) -> None:
        if not nmsg.data:  # a status only: 503, no JetStream to answer: sent again
            return
        error: GatewayError | None = None
        try:
            answer = json.loads(nmsg.data)
        except ValueError:
            answer = {"error": {"description": "unreadable acknowledgement"}}
        if "error" in answer:
            err = answer["error"]
            text = err.get("description", err) if isinstance(err, dict) else err
            if "maximum messages" in str(text) or "maximum bytes" in str(text):
                # a queue's stream at its limits (maxmsgs, maxbytes) with discard new
                error = LimitExceededError(f"the queue is full: {text}")
            else:
                error = UnavailableError(f"JetStream refused the message: {text}")
        self._settle(nmsg.subject, error)

    def _settle(self, reply: str, error: GatewayError | None) -> None:
        entry = self.waiting.pop(reply, None) if reply else None
        if entry is None or entry[0].done():
            return
        fut = entry[0]
        if error is None:
            fut.set_result(None)
        else:
            log.warning("%s", error)
            fut.set_exception(error)

    # -- held messages --------------------------------------------------------------------

    async def _renew(self) -> None:
        """Tell JetStream, every third of ``ack_wait``, that this node still works on what
        it holds, so that it is not given to another node meanwhile."""
        while True:
            await asyncio.sleep(self.ack_wait / 3)
            for feed in list(self.by_consumer.values()):
                for jm in [*feed.held.values(), *feed.parked]:
                    try:
                        await jm.in_progress()
                    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                        log.debug("cannot renew a message of %s: %s", feed.key, exc)
                        break


class Feed:
    """One local endpoint's link to its JetStream consumer: see the module docstring."""

    shared = False  # consumers on other nodes may take what this node holds (a queue)

    def __init__(self, feeds: Feeds, key: str, stream: str, filters: list[str],
                 deliver_new: bool) -> None:
        self.feeds = feeds
        self.key = key  # the endpoint's store key: queue:<name>, sub:<scope>:<name>
        self.stream = stream
        self.filters = filters
        self.deliver_new = deliver_new
        self.consumer = consumer_name(key)
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{self.consumer}"
        # each message on the local endpoint, and JetStream's delivery of it (what is
        # acknowledged); the same messages by message id
        self.held: dict[Message, Msg] = {}
        self.held_ids: dict[str, Message] = {}
        self.parked: list[Msg] = []  # what came for no consumer, to give back (_unpark)
        self.hold_until = 0.0  # no pull request before this loop time (see bind)
        self.bound = False  # the JetStream consumer is there
        self.binding = False  # and is being made
        self.ended = False
        self.inbox = f"{feeds.pulls}.{self.consumer}"
        self.asked = 0  # messages the request out may still bring
        self.request = 0  # requests made
        self.consumers = 0
        self.returning = False
        self.waiting_lease = False  # an exclusive queue's: another node pulls, not this one
        self.paused_timer: asyncio.TimerHandle | None = None  # see consumers_changed

    # -- what the endpoint calls (gateway.endpoint, Endpoint.feed) ------------------------

    def removed(self, msg: Message) -> None:
        jm = self.held.pop(msg, None)
        if jm is not None:
            self.held_ids.pop(msg.message_id or "", None)
            feeds = self.feeds
            feeds.stats["acked"] += 1
            feeds.send(("ack", jm))
            acked = feeds.acked_ids
            acked[msg.message_id or ""] = None
            if len(acked) > ACKED_WINDOW:
                acked.popitem(last=False)
            if not self.asked:
                self._ask()

    def consumers_changed(self, n: int, present: int) -> None:
        """``n`` consumers here take messages now, of ``present`` (the others paused: a
        window full, an AMQP link without credit, an MQTT session away). Pulls follow
        ``n``. What this node holds goes back to JetStream at once when the last consumer
        goes, but not when they are only paused: a message given back counts as delivered
        when JetStream gives it again (JMSRedelivered, ``maxRedelivery``), so a consumer
        that pauses after each message (an AMQP link given one credit at a time) would have
        its queue's messages counted redelivered without ever being delivered. A queue's
        gives back what it holds after its consumers stayed paused :data:`PAUSED_WAIT`, for
        the other nodes' consumers; a durable subscription's keeps it (its subscriber comes
        back here, or resumes elsewhere: :meth:`give_back` then)."""
        self.consumers = n
        if n or present:
            if self.paused_timer is not None:
                self.paused_timer.cancel()
                self.paused_timer = None
        if n:
            if not self.bound:
                if not self.binding:
                    self.binding = True
                    self.feeds.send(("bind", self))
            else:
                self._ask()
        elif present:
            if self.shared and self.paused_timer is None:
                self.paused_timer = self.feeds.broker.loop.call_later(
                    PAUSED_WAIT, self._return_if_idle)
        elif not self.returning:
            # after the closing consumer's deliveries came back (they are requeued after
            # it is removed)
            self.returning = True
            self.feeds.broker.loop.call_soon(self._return_if_idle)

    def _return_if_idle(self) -> None:
        self.returning = False
        self.paused_timer = None
        if not self.consumers:
            self.give_back()

    def give_back(self, final: bool = False) -> None:
        """Give what this node holds and has not delivered back to JetStream, for the
        other nodes (``final``: the link closes, whatever requests are out)."""
        back = []
        for msg in self.feeds.broker.feed_return(self.key):
            jm = self.held.pop(msg, None)
            if jm is not None:
                self.held_ids.pop(msg.message_id or "", None)
                back.append(jm)
        self.parked.extend(back)
        if not self.asked or final:
            self._unpark()

    def _unpark(self) -> None:
        """NAK what came for no consumer, once no pull request of this node is out (else
        JetStream would give it straight back to that request), and in the stream's order,
        which is the order JetStream gives them again in: a subscriber that moves to another
        node gets them there in the order they were published."""
        parked, self.parked = self.parked, []
        parked.sort(key=_stream_seq)
        for jm in parked:
            self.feeds.stats["returned"] += 1
            self.feeds.send(("nak", jm))

    # -- the JetStream consumer -----------------------------------------------------------

    async def bind(self) -> None:
        """Make the JetStream consumer (or find it made by another node), then pull."""
        feeds = self.feeds
        config = api.ConsumerConfig(
            durable_name=self.consumer, description=self.key,
            deliver_policy=api.DeliverPolicy.NEW if self.deliver_new else api.DeliverPolicy.ALL,
            filter_subject=self.filters[0] if len(self.filters) == 1 else None,
            filter_subjects=self.filters if len(self.filters) > 1 else None,
            ack_policy=api.AckPolicy.EXPLICIT, ack_wait=feeds.ack_wait, max_deliver=-1,
            max_ack_pending=-1)
        while not self.bound and not self.ended:
            try:
                info = await feeds.js.add_consumer(self.stream, config)
                self.bound = True
                if self.deliver_new and (info.num_waiting or info.num_ack_pending):
                    # Another node has pull requests out, or holds messages, for this
                    # subscription (its subscriber just came here from there): what it
                    # holds comes back when its requests are over, and should come first.
                    loop = feeds.broker.loop
                    self.hold_until = loop.time() + FETCH_WAIT + LOST_WAIT
                    loop.call_later(FETCH_WAIT + LOST_WAIT, self._ask)
            except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                log.warning("%s: cannot make JetStream consumer %s: %s", self.key,
                            self.consumer, exc)
                if not feeds.nc.is_connected and not self.consumers:
                    break  # made again when a consumer comes
                await asyncio.sleep(RETRY_WAIT * 4)
        self.binding = False
        self._ask()

    # -- pulling --------------------------------------------------------------------------
    #
    # One pull request at a time (JetStream's "next message" API, NATS documentation,
    # "JetStream wire API", consumer MSG.NEXT), for as many messages as the local consumers
    # can take, answered on an inbox of the feed's own as messages come: a request is over
    # when that many came, or when JetStream says it is (a status message: 408 at its expiry,
    # 409 and the like), or, when the answer was lost with a connection, at its expiry.

    def _ask(self) -> None:
        """Ask JetStream for what the local consumers can take, if no request is out."""
        if not self.bound or self.asked or not self.consumers or self.ended or (
                self.waiting_lease):
            return
        if self.hold_until and self.feeds.broker.loop.time() < self.hold_until:
            return
        want = min(self.feeds.broker.feed_demand(self.key, PULL_CAP), PULL_BATCH)
        if want <= 0:
            return
        self.asked = want
        self.request += 1
        feeds = self.feeds
        body = json.dumps({"batch": want, "expires": int(FETCH_WAIT * 1e9)}).encode()
        feeds.send(("pub", self.next_subject, body, None, self.inbox))
        feeds.broker.loop.call_later(FETCH_WAIT + LOST_WAIT, self._request_lost, self.request)

    def _request_lost(self, request: int) -> None:
        if request == self.request and self.asked:
            self._request_over()

    def _request_over(self) -> None:
        self.asked = 0
        if self.parked:
            self._unpark()
        self._ask()

    def arrived(self, jm: Msg) -> None:
        status = jm.headers.get("Status") if jm.headers else None
        if status is not None:
            if status != "100":  # not a heartbeat: the request is over
                self._request_over()
            return
        if self.asked:
            self.asked -= 1
        self._take(jm)
        if not self.asked:
            self._request_over()

    def _take(self, jm: Msg) -> None:
        feeds = self.feeds
        try:
            msg = decode_message(jm.data)
        except MessageFormatError as exc:
            log.warning("%s: dropped an undecodable message: %s", self.key, exc)
            feeds.send(("term", jm))
            return
        try:
            count = max(jm.metadata.num_delivered - 1, 0)
        except Exception:  # noqa: BLE001 - not a JetStream message after all
            count = 0
        mid = msg.message_id or ""
        if count and mid in feeds.acked_ids:
            feeds.send(("ack", jm))  # acknowledged here before: that acknowledgement was lost
            return
        mine = self.held_ids.get(mid) if count and mid else None
        if mine is not None and mine in self.held:
            # JetStream gives again what this node still holds (its renewals did not reach
            # JetStream in time: NATS away): it stays where it is, not delivered twice, and
            # is acknowledged through this delivery
            self.held[mine] = jm
            return
        self.held[msg] = jm
        if mid:
            self.held_ids[mid] = msg
        feeds.stats["pulled"] += 1
        taken = feeds.broker.feed_take(self.key, msg, count)
        if taken != "taken":
            del self.held[msg]
            self.held_ids.pop(mid, None)
            if taken == "filtered":  # not for this subscription: done with
                feeds.send(("ack", jm))
            else:
                self.parked.append(jm)


class QueueFeed(Feed):
    """A queue's feed: producers' messages go to its subject."""

    shared = True

    def __init__(self, feeds: Feeds, name: str) -> None:
        self.subject = feeds.queue_prefix + name
        super().__init__(feeds, "queue:" + name, feeds.queue_stream(name), [self.subject],
                         deliver_new=False)
        self.limited = False  # the queue has maxmsgs or maxbytes: every message confirmed
        self.stream_made = False  # JetStream said so; until then a message or a bind asks
        self.stream_asked = False  # a "stream" item is queued
        self.name = name
        self.lease = "queue/" + name
        self.leasing = False  # this node holds, or tries to take, the exclusive queue's lease

    def consumers_changed(self, n: int, present: int) -> None:
        """An exclusive queue (EMS's ``exclusive``: every message to one consumer while it
        is there) is pulled by one node at a time, the holder of lease ``queue/<name>``,
        whose first consumer gets every message; a node whose consumers are all gone (not
        only paused) gives the lease up, and a node with consumers takes it."""
        leases = self.feeds.leases
        q = self.feeds.broker.queues.get(self.name)
        if leases is not None and q is not None and q.exclusive:
            if present and not self.leasing:
                self.leasing = self.waiting_lease = True
                leases.hold(self.lease, self._lease_taken, self._lease_lost)
            elif not present and self.leasing:
                self.leasing = self.waiting_lease = False
                leases.release(self.lease)
        super().consumers_changed(n, present)

    def _lease_taken(self) -> None:
        self.waiting_lease = False
        self._ask()

    def _lease_lost(self) -> None:
        self.waiting_lease = True
        self.give_back()

    async def make_stream(self) -> None:
        """Make the queue's stream, or give it the queue's limits now (see the module
        docstring); a failure is logged, and the producers' messages are refused until
        JetStream has the stream."""
        feeds = self.feeds
        self.stream_asked = False
        props = feeds.broker.config.queues.resolve(self.name)
        maxmsgs = props.maxmsgs if props is not None else 0
        maxbytes = props.maxbytes if props is not None else 0
        discard_old = props is not None and props.overflow_policy.name == "DISCARD_OLD"
        self.limited = bool(maxmsgs or maxbytes)
        config = api.StreamConfig(
            name=self.stream, subjects=[self.subject], description=f"queue {self.name}",
            retention=api.RetentionPolicy.WORK_QUEUE, storage=api.StorageType.FILE,
            num_replicas=feeds.replicas, max_msgs=maxmsgs or -1, max_bytes=maxbytes or -1,
            discard=api.DiscardPolicy.OLD if discard_old else api.DiscardPolicy.NEW)
        try:
            await make_stream(feeds.js, config)
            self.stream_made = True
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            log.warning("queue %s: JetStream cannot keep its stream %s: %s", self.name,
                        self.stream, exc)

    def ask_stream(self) -> None:
        self.stream_asked = True
        self.feeds.send(("stream", self))

    async def bind(self) -> None:
        if not self.stream_made:
            await self.make_stream()
        await super().bind()

    def enqueue(self, msg: Message) -> asyncio.Future[None] | None:
        """A producer's message to the queue (``Broker.publish``)."""
        feeds = self.feeds
        feeds.stats["queued"] += 1
        if not self.stream_made and not self.stream_asked:  # (NATS was out of reach, or
            self.ask_stream()                                # JetStream slow): asked again
        # Until JetStream has said the stream is there, every message is confirmed, so one
        # sent before the stream is (made by another node meanwhile, or JetStream slow to
        # make it) is sent again until it is kept, not lost.
        return feeds.publish(self.subject, msg, confirm=self.limited or not self.stream_made)

    def dropped(self) -> None:  # a queue is never dropped by its feed's endpoint
        pass


class DurableFeed(Feed):
    """A durable subscription's feed: its consumer takes what its pattern matches (and,
    with MQTT's parent match, the parent: ``a/#`` takes ``a``), from its making on."""

    def __init__(self, feeds: Feeds, key: str, pattern: str, parent_match: bool) -> None:
        filters = [feeds.topic_prefix + pattern]
        if parent_match and pattern.endswith(".>"):
            filters.append(feeds.topic_prefix + pattern[:-2])
        super().__init__(feeds, key, feeds.topic_stream, filters, deliver_new=True)
        self.pattern = pattern
        self.parent_match = parent_match

    def dropped(self) -> None:
        """The subscription ended for good (unsubscribed, its MQTT session ended): its
        JetStream consumer goes, and with it what it kept."""
        self.ended = True
        self.held.clear()
        self.held_ids.clear()
        feeds = self.feeds
        if feeds.by_consumer.get(self.consumer) is self:
            del feeds.by_consumer[self.consumer]
        feeds.send(("drop", self))


async def make_stream(js: JetStreamContext, config: api.StreamConfig) -> None:
    """Make stream ``config.name``, or bring the one there to ``config`` (its limits)."""
    try:
        await js.stream_info(config.name or "")
    except NotFoundError:
        try:
            await js.add_stream(config)
            return
        except BadRequestError:  # made meanwhile by another node
            pass
    await js.update_stream(config)


def _stream_seq(jm: Msg) -> int:
    try:
        return int(jm.metadata.sequence.stream)
    except Exception:  # noqa: BLE001 - not a JetStream message after all
        return 0


def consumer_name(key: str) -> str:
    """The JetStream consumer of endpoint ``key``: ``q-`` (a queue) or ``s-`` (a durable
    subscription) and a digest of the key, whose characters JetStream's names may not all
    take."""
    return f"{key[0]}-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


async def _settle(jm: Msg, how: str) -> None:
    try:
        if how == "ack":
            await jm.ack()
        elif how == "nak":
            await jm.nak()
        else:
            await jm.term()
    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
        log.debug("cannot %s a queue message: %s", how, exc)
