"""Queues across the nodes of a cluster: one JetStream work queue behind every queue.

A queue is one queue cluster-wide: consumers on any node compete for its messages, and each
message goes to one of them. The messages are kept by JetStream, not by the nodes:

* One stream per cluster, ``GW_<cluster>_QUEUES``, on the subjects ``gw.<cluster>.q.>``,
  with work-queue retention (a message is removed when it is acknowledged), file storage and
  :attr:`GatewaySettings.cluster_replicas` copies, so a persistent message outlives any one
  NATS server (JetStream's replicated streams, NATS documentation, "JetStream",
  "Streams", replicas).
* A producer's message to queue ``Q`` on any node is published on ``gw.<cluster>.q.Q`` in the
  store's binary encoding (:mod:`gateway.serial`), with its message id as ``Nats-Msg-Id`` so
  that JetStream drops a second copy within its duplicate window. A persistent message is
  confirmed to its producer only when JetStream has acknowledged it (its ``PubAck``: written
  on a majority of the replicas); a non-persistent one is sent and not waited for (JMS
  allows its loss when something fails).
* One durable pull consumer per queue (its name a digest of the queue's, which may hold
  characters JetStream's names may not), filtered on the queue's subject, shared by every
  node. A node pulls from it only while the queue has consumers there, and only as much as
  they can take (their windows, :data:`PULL_CAP` at most), :data:`PULL_BATCH` at a time. What it pulls is put on its local
  queue, never in its own store, and dispatched as any message is; when the message leaves
  the local queue for good (acknowledged, expired, moved to ``$sys.undelivered``, purged) the
  node acknowledges it to JetStream, which removes it.
* A node renews what it holds (JetStream's "in progress") every third of ``ack_wait``. When
  the last consumer of a queue on a node goes, the node takes back what it had not delivered
  and gives it to the others (a NAK: JetStream redelivers at once). A node that dies holds its
  messages no longer than ``cluster_ack_wait``: JetStream then delivers them to another node,
  with their delivery count, so the consumer sees JMSRedelivered and ``maxRedelivery`` counts
  across nodes.

Not kept cluster-wide (the README says so): a queue's ``maxmsgs`` / ``maxbytes`` and
``exclusive`` apply to each node's share; browsing shows what this node holds; a consumer's
selector chooses among what its node pulled.
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
from nats.js.errors import NotFoundError

from gateway.errors import GatewayError, MessageFormatError, UnavailableError
from gateway.message import DeliveryMode, Message
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
ACKED_WINDOW = 10_000  # ids of messages acknowledged here, remembered (see QueueFeed._take)
RETRY_WAIT = 0.5  # seconds before trying again what JetStream refused
LOST_WAIT = 0.5  # seconds past a pull request's expiry before it counts as lost


class QueueFeeds:
    """Every queue's feed on this node, and what they share: the stream, the publisher's
    acknowledgements and the renewal of held messages."""

    def __init__(self, broker: Core, nc: NATS, cluster_name: str, replicas: int,
                 ack_wait: float) -> None:
        self.broker = broker
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.stream = f"GW_{cluster_name}_QUEUES"
        self.prefix = f"gw.{cluster_name}.q."
        self.replicas = replicas
        self.ack_wait = ack_wait
        self.feeds: dict[str, QueueFeed] = {}
        self.by_consumer: dict[str, QueueFeed] = {}  # the same, by JetStream consumer name
        self.inbox = ""  # JetStream's acknowledgements of persistent messages: inbox.<n>
        self.pulls = ""  # messages pulled for the queues: pulls.<consumer name>
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
        # headers, reply) and (how, JetStream message) to acknowledge, NAK or terminate
        self.outbox: list[tuple[Any, ...]] = []
        self.sending: asyncio.Task[None] | None = None
        self.renewer: asyncio.Task[None] | None = None
        self.stats = {"queued": 0, "pulled": 0, "acked": 0, "returned": 0}

    async def start(self) -> None:
        config = api.StreamConfig(
            name=self.stream, subjects=[self.prefix + ">"],
            retention=api.RetentionPolicy.WORK_QUEUE, storage=api.StorageType.FILE,
            num_replicas=self.replicas,
            description="the gateway cluster's queues (gateway cluster/queues.py)")
        try:
            try:
                await self.js.stream_info(self.stream)
            except NotFoundError:
                await self.js.add_stream(config)
            else:
                await self.js.update_stream(config)
        except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
            raise GatewayError(
                f"JetStream cannot keep the stream {self.stream} with {self.replicas} "
                f"replicas (cluster_replicas in gateway.conf): {exc}") from None
        # Both inboxes are subscribed to at once and for good: a pull request is dropped
        # by a JetStream server that has not yet heard of interest in its reply subject.
        self.inbox = self.nc.new_inbox()
        await self.nc.subscribe(self.inbox + ".*", cb=self._pub_ack)
        self.pulls = self.nc.new_inbox()
        await self.nc.subscribe(self.pulls + ".*", cb=self._pulled)
        await self.nc.flush()
        self.renewer = asyncio.ensure_future(self._renew())
        self.broker.feed_queues(self.feed)

    async def close(self) -> None:
        for feed in list(self.feeds.values()):
            feed.give_back()
        self.broker.feed_queues(None)
        for t in [*(f.task for f in self.feeds.values()), self.renewer]:
            if t is not None and not t.done():
                t.cancel()
        if self.sending is not None:  # acknowledgements under way go out first
            await asyncio.wait([self.sending], timeout=PUB_ACK_WAIT)
        for fut, *_ in self.waiting.values():
            if not fut.done():
                fut.set_exception(UnavailableError("the cluster link closed"))
        self.waiting.clear()

    def feed(self, name: str) -> QueueFeed:
        """The feed of queue ``name`` (what ``Core.feed_queues`` asks for)."""
        f = self.feeds.get(name)
        if f is None:
            f = self.feeds[name] = QueueFeed(self, name)
            self.by_consumer[f.consumer] = f
        return f

    async def _pulled(self, jm: Msg) -> None:
        """A message pulled (its subject the queue's) or a pull request's status (its
        subject the request's own inbox, ``pulls.<consumer name>``)."""
        subject_name = jm.subject
        if subject_name.startswith(self.prefix):
            feed = self.feeds.get(subject_name[len(self.prefix):])
        else:
            feed = self.by_consumer.get(subject_name.rsplit(".", 1)[-1])
        if feed is not None:
            feed.arrived(jm)

    def send(self, item: tuple[Any, ...]) -> None:
        self.outbox.append(item)
        if self.sending is None:
            self.sending = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        """Everything queued to NATS, in order."""
        try:
            while self.outbox:
                batch, self.outbox = self.outbox, []
                for item in batch:
                    if item[0] == "pub":
                        await self._publish(*item[1:])
                    else:
                        await _settle(item[1], item[0])
        finally:
            self.sending = None

    # -- producers ------------------------------------------------------------------------

    def publish(self, subject_name: str, msg: Message) -> asyncio.Future[None] | None:
        try:
            payload = encode_message(msg)
        except MessageFormatError as exc:
            raise GatewayError(f"cannot send {msg.message_id} to the cluster: {exc}",
                               reason="message-format") from None
        headers = {"Nats-Msg-Id": msg.message_id or ""}
        self.stats["queued"] += 1
        if msg.delivery_mode != DeliveryMode.PERSISTENT:
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

    async def _publish(self, subject_name: str, payload: bytes, headers: dict[str, str],
                       reply: str) -> None:
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
            for feed in list(self.feeds.values()):
                for jm in list(feed.held.values()):
                    try:
                        await jm.in_progress()
                    except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                        log.debug("cannot renew a message of %s: %s", feed.name, exc)
                        break


class QueueFeed:
    """One queue's link to its JetStream consumer: see the module docstring."""

    def __init__(self, feeds: QueueFeeds, name: str) -> None:
        self.feeds = feeds
        self.name = name
        self.subject = feeds.prefix + name
        digest = hashlib.sha256(name.encode()).hexdigest()[:32]
        self.consumer = f"q-{digest}"
        self.next_subject = f"$JS.API.CONSUMER.MSG.NEXT.{feeds.stream}.{self.consumer}"
        self.held: dict[Message, Msg] = {}  # each message on the local queue, by JetStream's
        self.task: asyncio.Task[None] | None = None  # binding to the JetStream consumer
        self.bound = False  # the JetStream consumer is there
        self.inbox = f"{feeds.pulls}.{self.consumer}"
        self.asked = 0  # messages the request out may still bring
        self.request = 0  # requests made
        self.consumers = 0
        self.returning = False

    # -- what the broker calls (see Core.feed_queues) -------------------------------------

    def enqueue(self, msg: Message) -> asyncio.Future[None] | None:
        return self.feeds.publish(self.subject, msg)

    def removed(self, msg: Message) -> None:
        jm = self.held.pop(msg, None)
        if jm is not None:
            feeds = self.feeds
            feeds.stats["acked"] += 1
            feeds.send(("ack", jm))
            acked = feeds.acked_ids
            acked[msg.message_id or ""] = None
            if len(acked) > ACKED_WINDOW:
                acked.popitem(last=False)
            if not self.asked:
                self._ask()

    def consumers_changed(self, n: int) -> None:
        self.consumers = n
        if n:
            if not self.bound:
                if self.task is None or self.task.done():
                    self.task = asyncio.ensure_future(self._bind())
            else:
                self._ask()
        elif not self.returning:
            # after the closing consumer's deliveries came back (they are requeued after
            # it is removed)
            self.returning = True
            self.feeds.broker.loop.call_soon(self._return_if_idle)

    def _return_if_idle(self) -> None:
        self.returning = False
        if not self.consumers:
            self.give_back()

    def give_back(self) -> None:
        """Give what this node holds and has not delivered back to JetStream, for the
        other nodes."""
        for msg in self.feeds.broker.queue_return(self.name):
            jm = self.held.pop(msg, None)
            if jm is not None:
                self.feeds.stats["returned"] += 1
                self.feeds.send(("nak", jm))

    # -- pulling --------------------------------------------------------------------------
    #
    # One pull request at a time (JetStream's "next message" API, NATS documentation,
    # "JetStream wire API", consumer MSG.NEXT), for as many messages as the local consumers
    # can take, answered on an inbox of the feed's own as messages come: a request is over
    # when that many came, or when JetStream says it is (a status message: 408 at its expiry,
    # 409 and the like), or, when the answer was lost with a connection, at its expiry.

    async def _bind(self) -> None:
        feeds = self.feeds
        config = api.ConsumerConfig(
            durable_name=self.consumer, description=f"queue {self.name}",
            filter_subject=self.subject, ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=feeds.ack_wait, max_deliver=-1, max_ack_pending=-1)
        while self.consumers and not self.bound:
            try:
                await feeds.js.add_consumer(feeds.stream, config)
                self.bound = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - nats-py raises several kinds
                log.warning("queue %s: cannot use JetStream consumer %s: %s", self.name,
                            self.consumer, exc)
                await asyncio.sleep(RETRY_WAIT * 4)
        self._ask()

    def _ask(self) -> None:
        """Ask JetStream for what the local consumers can take, if no request is out."""
        if not self.bound or self.asked or not self.consumers:
            return
        want = min(self.feeds.broker.queue_demand(self.name, PULL_CAP), PULL_BATCH)
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
            self.asked = 0
            self._ask()

    def arrived(self, jm: Msg) -> None:
        status = jm.headers.get("Status") if jm.headers else None
        if status is not None:
            if status != "100":  # not a heartbeat: the request is over
                self.asked = 0
                self._ask()
            return
        if self.asked:
            self.asked -= 1
        self._take(jm)
        if not self.asked:
            self._ask()

    def _take(self, jm: Msg) -> None:
        feeds = self.feeds
        try:
            msg = decode_message(jm.data)
        except MessageFormatError as exc:
            log.warning("queue %s: dropped an undecodable message: %s", self.name, exc)
            feeds.send(("term", jm))
            return
        try:
            count = max(jm.metadata.num_delivered - 1, 0)
        except Exception:  # noqa: BLE001 - not a JetStream message after all
            count = 0
        if count and (msg.message_id or "") in feeds.acked_ids:
            feeds.send(("ack", jm))  # acknowledged here before: that acknowledgement was lost
            return
        self.held[msg] = jm
        feeds.stats["pulled"] += 1
        if not feeds.broker.queue_take(self.name, msg, count):
            del self.held[msg]
            feeds.stats["returned"] += 1
            feeds.send(("nak", jm))


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
