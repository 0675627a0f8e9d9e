'use strict';
/*
 * What send.js, receive.js and request.js share: reading the JSON spec, writing JSON lines,
 * connecting, and the two directions of the typed-value notation.
 *
 * How this works. Each script takes one command-line argument, a JSON object (or "-" to
 * read it from stdin), and prints one JSON object per line on stdout; it exits 0 when it did
 * what was asked, 1 on an AMQP error or a timeout (after printing an {"event": "error",
 * "where": "connection"|"session"|"link"|"timeout"|..., "condition": the AMQP error's,
 * "description": ...} line, which also tells how far the script got: "sent" and "settled",
 * or "received" and "bytes") and 2 on a bad spec.
 *
 * Typed values. AMQP has more types than JSON, so a value may be written as
 *     {"type": T, "value": V}
 * with T one of null boolean ubyte ushort uint ulong byte short int long float double
 * decimal32 decimal64 decimal128 char timestamp uuid binary string symbol list map array
 * described. V is: a number for the integer types (or a decimal string for the 64-bit ones
 * beyond 2^53), a number or "NaN"/"Infinity"/"-Infinity" for float and double, the hex of
 * the IEEE 754 bytes for the decimals, a one-character string for char, milliseconds since
 * the epoch for timestamp, the canonical 8-4-4-4-12 hex for uuid, base64 for binary, a
 * string for string and symbol, a list of typed values for list, a list of [key, value]
 * pairs for map (an object is accepted when sending: its keys become strings), a list of
 * element values plus "element_type" for array, and "descriptor" plus "value" for described.
 * receive.js prints every value this way, decoded from the raw bytes (not through rhea's
 * decoder, which loses the type and, for 64-bit integers, precision), so Python can check
 * both the type and the value. 64-bit integers are printed as exact JSON numbers.
 * When sending, a plain JSON value is also accepted: null, true/false, a string (string),
 * a number (rhea's choice: uint or int, ulong or long beyond 32 bits, double if it has a
 * fraction), a list (list) or an object (map with string keys). An object with exactly the
 * keys "type" and "value" (and "descriptor" or "element_type") is always read as a typed
 * value: describe a map that looks like one as {"type": "map", "value": [[k, v], ...]}.
 *
 * Connection spec keys, common to all three scripts:
 *   host (127.0.0.1), port (5672), container_id (rhea's uuid),
 *   username + password (SASL PLAIN), or sasl: "anonymous" (SASL ANONYMOUS); neither: no
 *   SASL layer at all; idle_time_out (ms, none); timeout (seconds for the whole script, 30).
 */

const fs = require('fs');
const rhea = require('rhea');

const types = rhea.types;
const BIGINT_MARK = '__rhea_peer_bigint__:';
const BIGINT_RE = new RegExp('"' + BIGINT_MARK + '(-?\\d+)"', 'g');

// --- spec and output ------------------------------------------------------------------------

function readSpec() {
    const arg = process.argv[2];
    if (arg === undefined || process.argv.length > 3) {
        bad('usage: node ' + require('path').basename(process.argv[1]) + ' JSON-SPEC (or - for stdin)');
    }
    let spec;
    try {
        spec = JSON.parse(arg === '-' ? fs.readFileSync(0, 'utf8') : arg);
    } catch (e) {
        bad('the spec is not JSON: ' + e.message);
    }
    if (spec === null || typeof spec !== 'object' || Array.isArray(spec)) {
        bad('the spec must be a JSON object');
    }
    return spec;
}

function stringify(obj) {
    const text = JSON.stringify(obj, function (k, v) {
        return typeof v === 'bigint' ? BIGINT_MARK + v.toString() : v;
    });
    return text.indexOf(BIGINT_MARK) < 0 ? text : text.replace(BIGINT_RE, '$1');
}

function emit(obj) {
    process.stdout.write(stringify(obj) + '\n');
}

let exiting = false;

// Exit once stdout is flushed (a pipe's writes are asynchronous in node).
function finish(code) {
    if (exiting) return;
    exiting = true;
    process.exitCode = code;
    process.stdout.write('', function () { process.exit(code); });
}

function bad(message) {
    emit({event: 'error', where: 'spec', description: message});
    finish(2);
    throw new SpecError(message);
}

class SpecError extends Error {}

// Progress a script adds to its error line ({received: n}, ...); set by the script.
let progress = function () { return {}; };

function setProgress(fn) {
    progress = fn;
}

function fail(where, error) {
    if (exiting) return;
    const out = Object.assign({event: 'error', where: where}, progress());
    if (error && error.condition !== undefined) {
        out.condition = String(error.condition);
        if (error.description !== undefined) out.description = String(error.description);
    } else if (error) {
        out.description = String(error.message || error);
    }
    emit(out);
    finish(1);
}

// --- connecting -----------------------------------------------------------------------------

function connect(spec) {
    const container = rhea.create_container(spec.container_id ? {id: String(spec.container_id)} : {});
    const options = {
        host: spec.host || '127.0.0.1',
        port: spec.port || 5672,
        reconnect: false,
    };
    if (spec.username !== undefined) {
        options.username = String(spec.username);
        if (spec.password !== undefined) options.password = String(spec.password);
    } else if (spec.sasl === 'anonymous') {
        options.username = 'anonymous';
    } else if (spec.sasl !== undefined && spec.sasl !== 'none') {
        bad('sasl must be "anonymous" or "none" (give username and password for PLAIN)');
    }
    if (spec.idle_time_out !== undefined) options.idle_time_out = spec.idle_time_out;
    const conn = container.connect(options);
    conn.on('connection_error', function (ctx) {
        fail('connection', ctx.error || ctx.connection.get_error());
    });
    conn.on('disconnected', function (ctx) {
        if (!exiting) fail('connection', ctx.error || 'disconnected');
    });
    conn.on('session_error', function (ctx) { fail('session', ctx.session.error); });
    const seconds = spec.timeout === undefined ? 30 : Number(spec.timeout);
    if (seconds > 0) {
        setTimeout(function () {
            fail('timeout', 'gave up after ' + seconds + ' s');
        }, seconds * 1000).unref();
    }
    return conn;
}

// Close the connection, then exit with `code` (or after a second if the peer does not answer).
function closeAndFinish(conn, code) {
    if (exiting) return;
    conn.removeAllListeners('disconnected');
    conn.on('connection_close', function () { finish(code); });
    conn.on('disconnected', function () { finish(code); });
    conn.close();
    setTimeout(function () { finish(code); }, 1000).unref();
}

// --- typed values: JSON -> rhea ------------------------------------------------------------

const TYPE_NAMES = new Set([
    'null', 'boolean', 'ubyte', 'ushort', 'uint', 'ulong', 'byte', 'short', 'int', 'long',
    'float', 'double', 'decimal32', 'decimal64', 'decimal128', 'char', 'timestamp', 'uuid',
    'binary', 'string', 'symbol', 'list', 'map', 'array', 'described',
]);
const TYPED_KEYS = new Set(['type', 'value', 'descriptor', 'element_type']);

function isTyped(x) {
    if (x === null || typeof x !== 'object' || Array.isArray(x) || !TYPE_NAMES.has(x.type)) return false;
    if (!('value' in x)) return false;
    return Object.keys(x).every(function (k) { return TYPED_KEYS.has(k); });
}

function int64Buffer(v, signed, what) {
    let big;
    try {
        big = BigInt(v);
    } catch (e) {
        bad(what + ': not an integer: ' + JSON.stringify(v));
    }
    const buf = Buffer.alloc(8);
    try {
        if (signed) buf.writeBigInt64BE(big);
        else buf.writeBigUInt64BE(big);
    } catch (e) {
        bad(what + ': out of range: ' + JSON.stringify(v) +
            ' (give 64-bit values beyond 2^53 as decimal strings)');
    }
    return buf;
}

function floatOf(v) {
    if (v === 'NaN') return NaN;
    if (v === 'Infinity') return Infinity;
    if (v === '-Infinity') return -Infinity;
    return Number(v);
}

function hexBuffer(v, size, what) {
    const buf = Buffer.from(String(v).replace(/-/g, ''), 'hex');
    if (buf.length !== size) bad(what + ': expected ' + size + ' bytes of hex, got ' + JSON.stringify(v));
    return buf;
}

// Array element constructors: one fixed encoding per type (AMQP 1.0 section 1.6.20).
const ARRAY_CODES = {
    boolean: 0x56, ubyte: 0x50, ushort: 0x60, uint: 0x70, ulong: 0x80, byte: 0x51, short: 0x61,
    int: 0x71, long: 0x81, float: 0x72, double: 0x82, decimal32: 0x74, decimal64: 0x84,
    decimal128: 0x94, char: 0x73, timestamp: 0x83, uuid: 0x98, binary: 0xb0, string: 0xb1,
    symbol: 0xb3, list: 0xd0, map: 0xd1,
};

// The rhea Typed for a typed value; wide=true picks the encoding of ARRAY_CODES (no compact
// forms such as smalluint or list0), which array elements need.
function typed(t, v, extra, wide) {
    switch (t) {
    case 'null': return types.Null();
    case 'boolean': return wide ? types.Boolean(v ? 1 : 0) : types.wrap_boolean(Boolean(v));
    case 'ubyte': return types.Ubyte(Number(v));
    case 'ushort': return types.Ushort(Number(v));
    case 'uint': return wide ? types.Uint(Number(v)) : types.wrap_uint(Number(v));
    case 'ulong': {
        const b = int64Buffer(v, false, 'ulong');
        return wide ? types.Ulong(b) : types.wrap_ulong(b);
    }
    case 'byte': return types.Byte(Number(v));
    case 'short': return types.Short(Number(v));
    case 'int': return wide ? types.Int(Number(v)) : types.wrap_int(Number(v));
    case 'long': {
        const b = int64Buffer(v, true, 'long');
        return wide ? types.Long(b) : types.wrap_long(b);
    }
    case 'float': return types.Float(floatOf(v));
    case 'double': return types.Double(floatOf(v));
    case 'decimal32': return types.Decimal32(hexBuffer(v, 4, t));
    case 'decimal64': return types.Decimal64(hexBuffer(v, 8, t));
    case 'decimal128': return types.Decimal128(hexBuffer(v, 16, t));
    case 'char': return types.CharUTF32(String(v).codePointAt(0));
    case 'timestamp': return types.Timestamp(int64Buffer(v, true, 'timestamp'));
    case 'uuid': return types.Uuid(hexBuffer(v, 16, t));
    case 'binary': {
        const b = Buffer.from(String(v), 'base64');
        return wide ? types.Vbin32(b) : types.wrap_binary(b);
    }
    case 'string': return wide ? types.Str32(String(v)) : types.wrap_string(String(v));
    case 'symbol': return wide ? types.Sym32(String(v)) : types.wrap_symbol(String(v));
    case 'list': {
        if (!Array.isArray(v)) bad('list: value must be a JSON list');
        if (v.length === 0 && !wide) return types.List0();
        return types.List32(v.map(toRhea));
    }
    case 'map': {
        const items = [];
        if (Array.isArray(v)) {
            for (const pair of v) {
                if (!Array.isArray(pair) || pair.length !== 2) {
                    bad('map: value must be [[key, value], ...]');
                }
                items.push(toRhea(pair[0]), toRhea(pair[1]));
            }
        } else if (v !== null && typeof v === 'object') {
            for (const k of Object.keys(v)) items.push(types.wrap_string(k), toRhea(v[k]));
        } else {
            bad('map: value must be [[key, value], ...] or an object');
        }
        return types.Map32(items);
    }
    case 'array': {
        const et = extra.element_type;
        if (!(et in ARRAY_CODES)) {
            bad('array: element_type must be one of ' + Object.keys(ARRAY_CODES).join(' '));
        }
        if (!Array.isArray(v)) bad('array: value must be a JSON list');
        const elements = v.map(function (e) {
            const ev = isTyped(e) ? e.value : e;
            return typed(et, ev, {}, true).value;
        });
        return types.Array32(elements, ARRAY_CODES[et]);
    }
    case 'described': {
        if (extra.descriptor === undefined) bad('described: needs a descriptor');
        const inner = toRhea(v);
        inner.descriptor = toRhea(extra.descriptor);
        return inner;
    }
    default:
        bad('unknown type ' + JSON.stringify(t));
    }
    return undefined;
}

// A JSON value (plain or typed) as the rhea Typed that encodes it.
function toRhea(x) {
    if (isTyped(x)) return typed(x.type, x.value, x, false);
    if (Array.isArray(x)) return x.length ? types.List32(x.map(toRhea)) : types.List0();
    if (x !== null && typeof x === 'object') return typed('map', x, {}, false);
    return types.wrap(x);
}

// An object's values as rhea Typed (application-properties, annotations: keys stay strings).
function toRheaMap(obj, what) {
    if (obj === undefined) return undefined;
    if (obj === null || typeof obj !== 'object' || Array.isArray(obj)) bad(what + ' must be a JSON object');
    const out = {};
    for (const k of Object.keys(obj)) out[k] = toRhea(obj[k]);
    return out;
}

// --- typed values: raw AMQP bytes -> JSON ---------------------------------------------------

// [name, width] of the fixed-width constructors (AMQP 1.0 section 1.6).
const FIXED = {
    0x40: ['null', 0], 0x41: ['boolean', 0], 0x42: ['boolean', 0], 0x56: ['boolean', 1],
    0x50: ['ubyte', 1], 0x60: ['ushort', 2], 0x70: ['uint', 4], 0x52: ['uint', 1], 0x43: ['uint', 0],
    0x80: ['ulong', 8], 0x53: ['ulong', 1], 0x44: ['ulong', 0],
    0x51: ['byte', 1], 0x61: ['short', 2], 0x71: ['int', 4], 0x54: ['int', 1],
    0x81: ['long', 8], 0x55: ['long', 1], 0x72: ['float', 4], 0x82: ['double', 8],
    0x74: ['decimal32', 4], 0x84: ['decimal64', 8], 0x94: ['decimal128', 16],
    0x73: ['char', 4], 0x83: ['timestamp', 8], 0x98: ['uuid', 16],
};
const VARIABLE = {0xa0: ['binary', 1], 0xb0: ['binary', 4], 0xa1: ['string', 1], 0xb1: ['string', 4],
    0xa3: ['symbol', 1], 0xb3: ['symbol', 4]};
const COMPOUND = {
    0x45: ['list', 0], 0xc0: ['list', 1], 0xd0: ['list', 4], 0xc1: ['map', 1], 0xd1: ['map', 4],
};
const ARRAYS = {0xe0: 1, 0xf0: 4};

function jsonFloat(f) {
    return Number.isFinite(f) ? f : String(f);
}

function int64(v) {
    return Number.isSafeInteger(Number(v)) ? Number(v) : v;  // BigInt: printed exactly
}

function uuidString(b) {
    const h = b.toString('hex');
    return [h.slice(0, 8), h.slice(8, 12), h.slice(12, 16), h.slice(16, 20), h.slice(20)].join('-');
}

class Decoder {
    constructor(buffer) {
        this.buf = buffer;
        this.pos = 0;
    }

    remaining() {
        return this.buf.length - this.pos;
    }

    need(n) {
        if (this.pos + n > this.buf.length) throw new Error('truncated AMQP value at byte ' + this.pos);
    }

    uint(width) {
        this.need(width);
        const p = this.pos;
        this.pos += width;
        return width === 1 ? this.buf.readUInt8(p) : this.buf.readUInt32BE(p);
    }

    // One value with its constructor: {"type", "value"} (or {"type": "described", ...}).
    value() {
        this.need(1);
        const code = this.buf[this.pos++];
        if (code === 0x00) {
            const descriptor = this.value();
            const inner = this.value();
            return {type: 'described', descriptor: descriptor, value: inner};
        }
        return this.body(code);
    }

    // The value that follows constructor `code`.
    body(code) {
        const buf = this.buf;
        if (code in FIXED) {
            const [name, width] = FIXED[code];
            this.need(width);
            const p = this.pos;
            this.pos += width;
            switch (code) {
            case 0x40: return {type: 'null', value: null};
            case 0x41: return {type: 'boolean', value: true};
            case 0x42: return {type: 'boolean', value: false};
            case 0x56: return {type: 'boolean', value: buf[p] !== 0};
            case 0x43: case 0x44: return {type: name, value: 0};
            case 0x50: case 0x52: case 0x53: return {type: name, value: buf.readUInt8(p)};
            case 0x60: return {type: name, value: buf.readUInt16BE(p)};
            case 0x70: return {type: name, value: buf.readUInt32BE(p)};
            case 0x80: return {type: name, value: int64(buf.readBigUInt64BE(p))};
            case 0x51: case 0x54: case 0x55: return {type: name, value: buf.readInt8(p)};
            case 0x61: return {type: name, value: buf.readInt16BE(p)};
            case 0x71: return {type: name, value: buf.readInt32BE(p)};
            case 0x81: case 0x83: return {type: name, value: int64(buf.readBigInt64BE(p))};
            case 0x72: return {type: name, value: jsonFloat(buf.readFloatBE(p))};
            case 0x82: return {type: name, value: jsonFloat(buf.readDoubleBE(p))};
            case 0x73: return {type: name, value: String.fromCodePoint(buf.readUInt32BE(p))};
            case 0x98: return {type: name, value: uuidString(buf.subarray(p, p + 16))};
            default: return {type: name, value: buf.subarray(p, p + width).toString('hex')};
            }
        }
        if (code in VARIABLE) {
            const [name, width] = VARIABLE[code];
            const size = this.uint(width);
            this.need(size);
            const bytes = buf.subarray(this.pos, this.pos + size);
            this.pos += size;
            const text = name === 'binary' ? bytes.toString('base64') : bytes.toString('utf8');
            return {type: name, value: text};
        }
        if (code in COMPOUND) {
            const [name, width] = COMPOUND[code];
            if (width === 0) return {type: 'list', value: []};
            this.uint(width);  // size
            const count = this.uint(width);
            const items = [];
            for (let i = 0; i < count; i++) items.push(this.value());
            if (name === 'list') return {type: 'list', value: items};
            const pairs = [];
            for (let i = 0; i + 1 < items.length; i += 2) pairs.push([items[i], items[i + 1]]);
            return {type: 'map', value: pairs};
        }
        if (code in ARRAYS) {
            const width = ARRAYS[code];
            this.uint(width);  // size
            const count = this.uint(width);
            this.need(1);
            let elementCode = buf[this.pos++];
            let descriptor;
            if (elementCode === 0x00) {
                descriptor = this.value();
                this.need(1);
                elementCode = buf[this.pos++];
            }
            const items = [];
            for (let i = 0; i < count; i++) items.push(this.body(elementCode));
            const elementType = items.length ? items[0].type : typeName(elementCode);
            const out = {type: 'array', element_type: elementType, value: items};
            if (descriptor !== undefined) out.descriptor = descriptor;
            return out;
        }
        throw new Error('unknown AMQP constructor 0x' + code.toString(16) + ' at byte ' + (this.pos - 1));
    }
}

function typeName(code) {
    return (FIXED[code] || VARIABLE[code] || COMPOUND[code] || ['array'])[0];
}

const SECTIONS = {
    0x70: 'header', 0x71: 'delivery_annotations', 0x72: 'message_annotations', 0x73: 'properties',
    0x74: 'application_properties', 0x75: 'data', 0x76: 'sequence', 0x77: 'value', 0x78: 'footer',
};
const SYMBOLIC_SECTIONS = {
    'amqp:header:list': 0x70, 'amqp:delivery-annotations:map': 0x71,
    'amqp:message-annotations:map': 0x72, 'amqp:properties:list': 0x73,
    'amqp:application-properties:map': 0x74, 'amqp:data:binary': 0x75,
    'amqp:amqp-sequence:list': 0x76, 'amqp:value:*': 0x77, 'amqp:footer:map': 0x78,
};
const HEADER_FIELDS = ['durable', 'priority', 'ttl', 'first_acquirer', 'delivery_count'];
const PROPERTY_FIELDS = ['message_id', 'user_id', 'to', 'subject', 'reply_to', 'correlation_id',
    'content_type', 'content_encoding', 'absolute_expiry_time', 'creation_time', 'group_id',
    'group_sequence', 'reply_to_group_id'];

function fields(list, names) {
    const out = {};
    list.value.forEach(function (v, i) {
        if (v.type !== 'null') out[i < names.length ? names[i] : String(i)] = v;
    });
    return out;
}

// A bare message (AMQP 1.0 section 3.2) as JSON: each section that is present, every value
// typed; the body as {"section": "value"|"data"|"sequence", "value": ...} where data and
// sequence give the list of their sections.
function describeMessage(payload) {
    const d = new Decoder(payload);
    const msg = {};
    while (d.remaining()) {
        const s = d.value();
        if (s.type !== 'described') throw new Error('a message section must be described, got ' + s.type);
        const code = s.descriptor.type === 'symbol'
            ? SYMBOLIC_SECTIONS[s.descriptor.value] : Number(s.descriptor.value);
        const name = SECTIONS[code];
        if (name === undefined) {
            (msg.unknown_sections = msg.unknown_sections || []).push(s);
        } else if (name === 'header') {
            msg.header = fields(s.value, HEADER_FIELDS);
        } else if (name === 'properties') {
            msg.properties = fields(s.value, PROPERTY_FIELDS);
        } else if (name === 'data' || name === 'sequence') {
            if (!msg.body) msg.body = {section: name, value: []};
            msg.body.value.push(s.value);
        } else if (name === 'value') {
            msg.body = {section: 'value', value: s.value};
        } else {
            msg[name] = s.value;
        }
    }
    return msg;
}

// --- messages to send -----------------------------------------------------------------------

const SEND_KEYS = new Set(['header', 'properties', 'application_properties', 'message_annotations',
    'delivery_annotations', 'footer', 'body', 'body_section'].concat(HEADER_FIELDS, PROPERTY_FIELDS));

function fieldOf(m, group, name) {
    if (m[name] !== undefined) return m[name];
    return m[group] ? m[group][name] : undefined;
}

function plainValue(v) {
    return isTyped(v) ? v.value : v;
}

function binaryOf(v, what) {
    if (isTyped(v) && v.type === 'binary') return Buffer.from(String(v.value), 'base64');
    if (typeof v === 'string') return Buffer.from(v, 'utf8');
    bad(what + ' must be a string (sent as its UTF-8 bytes) or {"type": "binary", "value": BASE64}');
    return undefined;
}

/*
 * A message spec as the object rhea's message.encode takes. Keys (all optional):
 *   header fields durable, priority, ttl, first_acquirer, delivery_count, at the top level or
 *   under "header";
 *   properties fields message_id, user_id, to, subject, reply_to, correlation_id,
 *   content_type, content_encoding, absolute_expiry_time, creation_time, group_id,
 *   group_sequence, reply_to_group_id, at the top level or under "properties"
 *   (message_id and correlation_id may be typed: ulong, uuid, binary or string; user_id is
 *   a string, sent as UTF-8, or a typed binary; the times are milliseconds);
 *   application_properties, message_annotations, delivery_annotations, footer: objects whose
 *   values are JSON or typed values;
 *   body with body_section "value" (the default: one amqp-value section holding the body,
 *   plain or typed; no body key: a null value), "data" (a string, sent as UTF-8, or a typed
 *   binary: one data section; a list of those: several) or "sequence" (a list of values: one
 *   amqp-sequence section; {"sections": [[...], [...]]}: several).
 */
function buildMessage(m, where) {
    if (m === null || typeof m !== 'object' || Array.isArray(m)) {
        bad(where + ': a message must be a JSON object');
    }
    for (const k of Object.keys(m)) {
        if (!SEND_KEYS.has(k)) bad(where + ': unknown message key ' + JSON.stringify(k));
    }
    const msg = {};
    for (const f of HEADER_FIELDS) {
        const v = fieldOf(m, 'header', f);
        if (v !== undefined) msg[f] = plainValue(v);
    }
    for (const f of PROPERTY_FIELDS) {
        const v = fieldOf(m, 'properties', f);
        if (v === undefined) continue;
        if (f === 'message_id' || f === 'correlation_id') {
            msg[f] = isTyped(v) ? toRhea(v) : v;
        } else if (f === 'user_id') {
            msg[f] = binaryOf(v, 'user_id');
        } else if (f === 'absolute_expiry_time' || f === 'creation_time') {
            msg[f] = int64Buffer(plainValue(v), true, f);
        } else {
            msg[f] = plainValue(v);
        }
    }
    for (const f of ['application_properties', 'message_annotations', 'delivery_annotations', 'footer']) {
        if (m[f] !== undefined) msg[f] = toRheaMap(m[f], where + ': ' + f);
    }
    const section = m.body_section || 'value';
    if (section === 'value') {
        msg.body = toRhea(m.body === undefined ? null : m.body);
    } else if (section === 'data') {
        msg.body = Array.isArray(m.body)
            ? rhea.message.data_sections(m.body.map(function (b) { return binaryOf(b, 'a data body'); }))
            : rhea.message.data_section(binaryOf(m.body, 'a data body'));
    } else if (section === 'sequence') {
        const b = m.body;
        if (Array.isArray(b)) {
            msg.body = rhea.message.sequence_section(b.map(toRhea));
        } else if (b && Array.isArray(b.sections)) {
            const lists = b.sections.map(function (l) { return l.map(toRhea); });
            msg.body = rhea.message.sequence_sections(lists);
        } else {
            bad(where + ': a sequence body is a list, or {"sections": [list, ...]}');
        }
    } else {
        bad(where + ': body_section must be "value", "data" or "sequence"');
    }
    return msg;
}

// The outcome a sender learnt, as JSON (AMQP 1.0 section 3.4).
function outcomeOf(delivery) {
    const state = delivery.remote_state;
    const name = state && state.constructor && state.constructor.composite_type;
    const out = {
        state: name || (delivery.settled ? 'settled' : 'none'),
        settled: Boolean(delivery.remote_settled),
    };
    if (name === 'rejected' && state.error) {
        out.error = {condition: String(state.error.condition), description: state.error.description};
    }
    if (name === 'modified') {
        out.delivery_failed = Boolean(state.delivery_failed);
        out.undeliverable_here = Boolean(state.undeliverable_here);
    }
    return out;
}

// Keep each delivery's raw payload: rhea decodes it before handing the message over.
const rawMessage = rhea.message;
const originalDecode = rawMessage.decode;
rawMessage.decode = function (buffer) {
    const msg = originalDecode(buffer);
    Object.defineProperty(msg, 'payload', {value: buffer, enumerable: false});
    return msg;
};

process.on('uncaughtException', function (e) {
    if (e instanceof SpecError) return;  // already reported; finish() exits with status 2
    fail('internal', e && e.stack ? e.stack : e);
});

module.exports = {
    rhea, types, readSpec, emit, finish, fail, bad, SpecError, connect, closeAndFinish,
    toRhea, toRheaMap, isTyped, Decoder, describeMessage, buildMessage, outcomeOf, setProgress,
};
