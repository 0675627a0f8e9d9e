#!/usr/bin/env node
'use strict';
/*
 * Send messages to one AMQP 1.0 address with rhea and print what became of each.
 *
 *   node tests/peers/rhea/send.js '{"port": 5672, "address": "queue://q",
 *       "messages": [{"body": "hi", "application_properties": {"n": {"type": "ubyte", "value": 5}}}]}'
 *
 * Spec keys, besides the connection keys of common.js:
 *   address     the target address (required)
 *   messages    a list of message specs (see buildMessage in common.js); default [{}]
 *   count       how many messages to send, cycling through `messages` (default: their number)
 *   settle      "unsettled" (default: at-least-once, wait for every outcome) or "presettled"
 *               (snd-settle-mode settled: at-most-once, no outcomes)
 *   linger      presettled: seconds to keep the connection open after the last transfer
 *               before closing it (default 0). RabbitMQ 3.10 drops the presettled messages it
 *               has not routed yet when the connection closes; a benchmark lingers and stops
 *               the script once its receiver has everything.
 *   link_name   the link's name (default: a uuid); target: extra target terminus fields, e.g.
 *               {"capabilities": ["queue"], "durable": 2}
 *   quiet       true: print no "outcome" lines (benchmarks)
 *
 * How this works: every message is encoded once; they are then sent back to back for as long
 * as the link has credit and the session window room (rhea's "sendable"), and sending resumes
 * at each "sendable" event, so the sender is pipelined, never one message per round trip.
 * Prints:
 *   {"event": "attached", "address": the target address the peer answered with}
 *   {"event": "sent", "sent": n, "started_at": ms}   (once every message is handed to rhea,
 *    maybe after the first outcomes; started_at: Date.now() at the first send)
 *   {"event": "outcome", "index": i, "state": "accepted"|"rejected"|"released"|"modified",
 *    "settled": bool, "error": {...} for rejected, "delivery_failed"/"undeliverable_here" for
 *    modified}                                       (one per message, unsettled mode only)
 *   {"event": "done", "sent": n, "outcomes": {"accepted": n, ...}, "started_at": ms,
 *    "seconds": s}   (started_at: Date.now() at the first send; seconds: from it to "done")
 * Unsettled: "done" comes once every delivery has an outcome. Presettled: once the peer has
 * answered the connection close that follows the last transfer (and `linger`), so it has
 * read every transfer.
 * Exit status 0 (whatever the outcomes), 1 on a link or connection error or the timeout.
 */

const common = require('./common.js');

const spec = common.readSpec();
if (typeof spec.address !== 'string') common.bad('address (a string) is required');
const specs = spec.messages === undefined ? [{}] : spec.messages;
if (!Array.isArray(specs) || specs.length === 0) common.bad('messages must be a non-empty list');
const count = spec.count === undefined ? specs.length : Number(spec.count);
if (!Number.isInteger(count) || count < 0) common.bad('count must be a whole number');
const presettled = spec.settle === 'presettled';
if (!presettled && spec.settle !== undefined && spec.settle !== 'unsettled') {
    common.bad('settle must be "unsettled" or "presettled"');
}
const quiet = Boolean(spec.quiet);
const linger = spec.linger === undefined ? 0 : Number(spec.linger);
if (!(linger >= 0)) common.bad('linger must be a number of seconds');
const encoded = specs.map(function (m, i) {
    return common.rhea.message.encode(common.buildMessage(m, 'messages[' + i + ']'));
});

const conn = common.connect(spec);
const target = Object.assign({}, spec.target || {}, {address: spec.address});
const options = {target: target, autosettle: true, treat_modified_as_released: false};
if (spec.link_name !== undefined) options.name = String(spec.link_name);
if (presettled) options.snd_settle_mode = 1;
const sender = conn.open_sender(options);

let sent = 0;
let settled = 0;
let started = 0;
let closing = false;
const outcomes = {};
common.setProgress(function () { return {sent: sent, settled: settled}; });

function done() {
    common.emit({event: 'done', sent: sent, outcomes: outcomes, started_at: started,
        seconds: (Date.now() - started) / 1000});
}

function record(context) {
    const delivery = context.delivery;
    if (delivery.index === undefined || delivery.recorded) return;
    delivery.recorded = true;
    const out = common.outcomeOf(delivery);
    outcomes[out.state] = (outcomes[out.state] || 0) + 1;
    settled++;
    if (!quiet) common.emit(Object.assign({event: 'outcome', index: delivery.index}, out));
    if (settled === count) {
        done();
        common.closeAndFinish(conn, 0);
    }
}

function pump() {
    if (!started) started = Date.now();
    while (sent < count && sender.sendable()) {
        const delivery = sender.send(encoded[sent % encoded.length], undefined, 0);
        delivery.index = sent++;
    }
    if (sent === count && !closing) {
        closing = true;
        common.emit({event: 'sent', sent: sent, started_at: started});
        if (presettled) setTimeout(closeAfterLastTransfer, linger * 1000);
    }
}

// Close after the last transfer; the peer's close answers once it has read them all.
function closeAfterLastTransfer() {
    conn.removeAllListeners('disconnected');
    conn.on('connection_close', function () { done(); common.finish(0); });
    conn.on('disconnected', function () { common.fail('connection', 'disconnected before close'); });
    conn.close();
}

sender.on('sender_open', function (context) {
    const t = context.sender.target;
    common.emit({event: 'attached', address: t ? t.address : null});
    if (count === 0) {
        done();
        common.closeAndFinish(conn, 0);
    }
});
sender.on('sendable', function () {
    if (sent < count) pump();
});
for (const name of ['accepted', 'rejected', 'released', 'modified']) sender.on(name, record);
sender.on('sender_error', function (context) { common.fail('link', context.sender.error); });
sender.on('sender_close', function () {
    if (settled < count) common.fail('link', 'the peer detached the link');
});
