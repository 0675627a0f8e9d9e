#!/usr/bin/env node
'use strict';
/*
 * Receive messages from one AMQP 1.0 address with rhea and print each, every value typed.
 *
 *   node tests/peers/rhea/receive.js '{"port": 5672, "address": "queue://q", "count": 2}'
 *
 * Spec keys, besides the connection keys of common.js:
 *   address        the source address (required unless dynamic)
 *   count          stop after this many messages (default 1; 0: no limit, stop on idle)
 *   credit         link credit kept outstanding (default min(count, 1000), or 1000); the
 *                  credit granted in all never exceeds count, so no message is taken (and
 *                  then released) beyond it
 *   refill         false: grant `credit` once and never again (default true)
 *   idle           stop when no message came for this many seconds (reason "idle")
 *   disposition    "accept" (default), "reject", "release", "modify" (with
 *                  delivery_failed: true) or "none" (leave unsettled: the peer gets them back
 *                  when the link closes)
 *   settle         "unsettled" (default) or "presettled" (ask for snd-settle-mode settled:
 *                  at-most-once; nothing to accept)
 *   selector       a JMS selector, sent as source filter "jms-selector" described by
 *                  apache.org:selector-filter:string; selector_descriptor "code" (default,
 *                  0x0000468C:0x00000004, as rhea and Qpid JMS send it) or "name" (the symbol)
 *   durable        true: a durable subscription: source durable 2 (unsettled-state),
 *                  expiry-policy never; use with container_id and link_name, which name it
 *   distribution_mode  "copy" (browse) or "move"
 *   dynamic        true: ask the peer for a dynamic source (a temporary node)
 *   source         extra source terminus fields, e.g. {"capabilities": ["topic"]}
 *   end            "close" (default: the link is closed, which ends a durable subscription)
 *                  or "detach" (closed=false: a durable subscription survives)
 *   link_name      the link's name (default: a uuid)
 *   raw            true: add the payload's hex to each message
 *   quiet          true: print only "attached", "first" and "done" (benchmarks)
 *   report_first   true: print {"event": "first", "at": ms} when the first message arrives
 *
 * Prints:
 *   {"event": "attached", "address": the source address the peer answered with (the node's
 *    name for a dynamic source), "source": {...the peer's source fields...}}
 *   {"event": "message", "index": i, "settled": the peer sent it settled,
 *    "message": {"header": {...}, "properties": {...}, "application_properties": MAP, ...,
 *    "body": {"section": ..., "value": ...}}}  (every value {"type": T, "value": V}; see
 *    common.js)
 *   {"event": "done", "received": n, "reason": "count"|"idle", "bytes": body bytes,
 *    "first_at": ms, "last_at": ms (Date.now() at the first and the last message)}
 * Exit status 0, 1 on a link or connection error or when `timeout` passes first.
 */

const common = require('./common.js');

const spec = common.readSpec();
const dynamic = Boolean(spec.dynamic);
if (!dynamic && typeof spec.address !== 'string') common.bad('address (a string) is required');
const count = spec.count === undefined ? 1 : Number(spec.count);
if (!Number.isInteger(count) || count < 0) common.bad('count must be a whole number');
const credit = spec.credit === undefined ? (count ? Math.min(count, 1000) : 1000) : Number(spec.credit);
if (!Number.isInteger(credit) || credit < 1) common.bad('credit must be a positive whole number');
const refill = spec.refill !== false;
const disposition = spec.disposition || 'accept';
if (!['accept', 'reject', 'release', 'modify', 'none'].includes(disposition)) {
    common.bad('disposition must be accept, reject, release, modify or none');
}
const presettled = spec.settle === 'presettled';
const quiet = Boolean(spec.quiet);
const endMode = spec.end || 'close';
if (endMode !== 'close' && endMode !== 'detach') common.bad('end must be "close" or "detach"');

const SELECTOR_CODE = 0x0000468C00000004;
const SELECTOR_NAME = 'apache.org:selector-filter:string';

const source = Object.assign({}, spec.source || {});
if (dynamic) {
    source.dynamic = true;
    if (spec.address !== undefined) source.address = spec.address;
} else {
    source.address = spec.address;
}
if (spec.durable) {
    source.durable = 2;
    source.expiry_policy = 'never';
}
if (spec.distribution_mode !== undefined) source.distribution_mode = String(spec.distribution_mode);
if (spec.selector !== undefined) {
    const descriptor = spec.selector_descriptor === 'name' ? SELECTOR_NAME : SELECTOR_CODE;
    source.filter = Object.assign({}, source.filter || {},
        {'jms-selector': common.types.wrap_described(String(spec.selector), descriptor)});
}

const conn = common.connect(spec);
const options = {source: source, credit_window: 0, autoaccept: false};
if (spec.link_name !== undefined) options.name = String(spec.link_name);
if (presettled) options.snd_settle_mode = 1;
const receiver = conn.open_receiver(options);

let received = 0;
let issued = 0;
let bytes = 0;
let firstAt = 0;
let lastAt = 0;
let idleTimer;
let stopping = false;
common.setProgress(function () { return {received: received, bytes: bytes}; });

// Keep `credit` outstanding, topped up when half is used, never granting beyond `count`.
function topUp() {
    const outstanding = receiver.credit;
    const room = count ? count - issued : Infinity;
    const add = Math.min(credit - outstanding, room);
    if (add > 0 && (outstanding <= credit / 2)) {
        issued += add;
        receiver.add_credit(add);
    }
}

function bodyBytes(body) {
    if (body === undefined || body === null) return 0;
    if (Buffer.isBuffer(body)) return body.length;
    if (typeof body === 'string') return Buffer.byteLength(body);
    if (body.typecode === 0x75) {
        if (!body.multiple) return body.content.length;
        return body.content.reduce(function (n, b) { return n + b.length; }, 0);
    }
    return 0;
}

function stop(reason) {
    if (stopping) return;
    stopping = true;
    clearTimeout(idleTimer);
    common.emit({event: 'done', received: received, reason: reason, bytes: bytes,
        first_at: firstAt, last_at: lastAt});
    if (endMode === 'detach') {
        receiver.on('receiver_close', function () { common.closeAndFinish(conn, 0); });
        receiver.detach();
        setTimeout(function () { common.closeAndFinish(conn, 0); }, 1000).unref();
    } else {
        // Close the link itself (detach with closed=true) before the connection: that is
        // what ends a durable subscription; closing only the connection would keep it.
        receiver.on('receiver_close', function () { common.closeAndFinish(conn, 0); });
        receiver.close();
        setTimeout(function () { common.closeAndFinish(conn, 0); }, 1000).unref();
    }
}

function armIdle() {
    if (spec.idle === undefined) return;
    clearTimeout(idleTimer);
    idleTimer = setTimeout(function () { stop('idle'); }, Number(spec.idle) * 1000);
}

receiver.on('receiver_open', function (context) {
    const s = context.receiver.source;
    const out = {event: 'attached', address: s ? s.address : null};
    if (s && !quiet) {
        out.source = {};
        const names = ['address', 'durable', 'expiry_policy', 'timeout', 'dynamic', 'distribution_mode'];
        for (const f of names) {
            if (s[f] !== undefined && s[f] !== null) out.source[f] = s[f];
        }
    }
    common.emit(out);
    if (count === 0 || received < count) {
        topUp();
        armIdle();
    }
});

receiver.on('message', function (context) {
    if (stopping) return;  // beyond count: left unsettled, so the peer gets it back
    const delivery = context.delivery;
    const now = Date.now();
    if (!firstAt) {
        firstAt = now;
        if (spec.report_first) common.emit({event: 'first', at: now});
    }
    lastAt = now;
    const index = received++;
    bytes += bodyBytes(context.message.body);
    if (!quiet) {
        const out = {event: 'message', index: index, settled: Boolean(delivery.remote_settled)};
        const payload = context.message.payload;
        try {
            out.message = common.describeMessage(payload);
        } catch (e) {
            out.decode_error = String(e.message || e);
        }
        if (spec.raw) out.payload_hex = payload.toString('hex');
        common.emit(out);
    }
    if (delivery.remote_settled) {
        // Settled by the peer: only forget it (no disposition), so the session window opens.
        delivery.update(true);
    } else if (disposition === 'accept') {
        delivery.accept();
    } else if (disposition === 'reject') {
        delivery.reject({condition: 'amqp:internal-error', description: 'rejected by receive.js'});
    } else if (disposition === 'release') {
        delivery.release();
    } else if (disposition === 'modify') {
        delivery.modified({delivery_failed: true, undeliverable_here: false});
    }
    if (count && received >= count) {
        stop('count');
        return;
    }
    if (refill) topUp();
    armIdle();
});

receiver.on('receiver_error', function (context) { common.fail('link', context.receiver.error); });
receiver.on('receiver_close', function () {
    if (!stopping) common.fail('link', 'the peer detached the link');
});
