#!/usr/bin/env node
'use strict';
/*
 * Request/reply with rhea: send one request whose reply_to is a dynamic receiver's address,
 * then print the reply.
 *
 *   node tests/peers/rhea/request.js '{"port": 5672, "address": "queue://service",
 *       "message": {"body": "ping", "correlation_id": "c1"}}'
 *
 * Spec keys, besides the connection keys of common.js:
 *   address     where the request goes (required)
 *   message     the request, a message spec as for send.js (default {}); its reply_to is
 *               set to the reply address, and its message_id, when missing, to
 *               "request-<uuid>"
 *   reply_source  extra fields of the dynamic source, e.g. {"capabilities": ["temporary-queue"]}
 *   reply_address  receive replies from this address instead of a dynamic source
 *   settle      "unsettled" (default) or "presettled", for the request
 *
 * How this works: a receiver with a dynamic source (AMQP 1.0 section 3.5.3: the peer creates
 * a node and answers with its address) gets one credit; once it is attached, a sender on
 * `address` sends the request with reply_to = that address. Prints:
 *   {"event": "reply_to", "address": the dynamic node's address}
 *   {"event": "sent", "message_id": the request's message_id as sent (typed)}
 *   {"event": "outcome", "state": ..., "settled": ...}     (unsettled requests)
 *   {"event": "message", "settled": ..., "message": {...}}  (the reply, typed as receive.js)
 * and exits 0 once it has the reply (and the request's outcome), 1 on an error or when
 * `timeout` passes first.
 */

const common = require('./common.js');

const spec = common.readSpec();
if (typeof spec.address !== 'string') common.bad('address (a string) is required');
const presettled = spec.settle === 'presettled';
const request = Object.assign({}, spec.message || {});
const given = function (name) {
    return request[name] !== undefined || (request.properties && request.properties[name] !== undefined);
};
if (!given('message_id')) {
    request.message_id = 'request-' + common.rhea.generate_uuid();
}

const conn = common.connect(spec);
const source = spec.reply_address !== undefined
    ? {address: String(spec.reply_address)}
    : Object.assign({}, spec.reply_source || {}, {dynamic: true});
const receiver = conn.open_receiver({source: source, credit_window: 0, autoaccept: false});

let replied = false;
let settled = presettled;
let sender;

function maybeDone() {
    if (replied && settled) common.closeAndFinish(conn, 0);
}

receiver.on('receiver_open', function (context) {
    const s = context.receiver.source;
    const address = s ? s.address : null;
    common.emit({event: 'reply_to', address: address});
    if (typeof address !== 'string') {
        common.fail('link', 'the peer gave the dynamic source no address');
        return;
    }
    receiver.add_credit(1);
    if (!given('reply_to')) {
        request.reply_to = address;
    }
    const built = common.buildMessage(request, 'message');
    const options = {target: {address: spec.address}, autosettle: true, treat_modified_as_released: false};
    if (presettled) options.snd_settle_mode = 1;
    sender = conn.open_sender(options);
    sender.once('sendable', function () {
        const delivery = sender.send(built);
        const id = common.describeMessage(common.rhea.message.encode(built)).properties.message_id;
        common.emit({event: 'sent', message_id: id});
        delivery.index = 0;
    });
    for (const name of ['accepted', 'rejected', 'released', 'modified']) {
        sender.on(name, function (ctx) {
            common.emit(Object.assign({event: 'outcome'}, common.outcomeOf(ctx.delivery)));
            settled = true;
            maybeDone();
        });
    }
    sender.on('sender_error', function (ctx) { common.fail('link', ctx.sender.error); });
});

receiver.on('message', function (context) {
    if (replied) return;
    replied = true;
    const out = {event: 'message', settled: Boolean(context.delivery.remote_settled)};
    try {
        out.message = common.describeMessage(context.message.payload);
    } catch (e) {
        out.decode_error = String(e.message || e);
    }
    common.emit(out);
    if (context.delivery.remote_settled) context.delivery.update(true);
    else context.delivery.accept();
    maybeDone();
});

receiver.on('receiver_error', function (context) { common.fail('link', context.receiver.error); });
