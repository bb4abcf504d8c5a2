#!/usr/bin/env python3
"""A msgtrail client in Python with nothing but nats-py and nkeys (no msgtrail SDK).

It walks the whole protocol of docs/PROTOCOL.md once:

 1. opens a producer channel (channel.challenge -> sign the nonce -> channel.open);
 2. uploads one message with an attribute (category=refund) and reports its own P1 and P4;
 3. uploads it again with the same request ID (a retry): the broker stores it once and
    answers with the same message ID and "duplicate": true;
 4. opens a consumer channel, keeps it alive once, fetches the message (pull) by its
    message ID in the consumer group, and decodes its base64 payload;
 5. reports C6 (received), X1/X2 (processing started/finished) and C7 (ack sent) as one
    newline-delimited JSON batch, then acks the delivery (the broker records C8);
 6. fetches it again and gets the no-matching-message notice;
 7. push: subscribes its inbox, uploads a second message, receives it pushed (raw payload,
    metadata in headers), reports C2/X1/X2/C3, acks it (the broker records C1 and C4) and
    unsubscribes;
 8. the batched binary path (docs/PROTOCOL.md §18), with nothing but the struct module:
    uploads one binary upload batch of four messages (a JSON payload, a 0-byte payload, one
    with an invalid topic, raw binary bytes), each carrying its own P1 time (sent_at), and
    prints the per-message results (the invalid one is refused alone); reports the P4s of
    the stored ones in a binary report frame; fetches them with "format": "binary" and
    decodes the delivery frame; settles them in one binary settle batch (version 2) whose
    every settle carries C6, X1, X2 and C7 of its own delivery (the settle's token is their
    proof), plus one forged token that fails alone with its records; fetches again and
    decodes the binary no-matching-message notice;
 9. closes both channels.

Every step prints one JSON line on stdout ({"event": ...}); a refusal prints
{"event": "error", ...} on stdout and exits with status 1.

Install:  python3 -m pip install "nats-py>=2.6" "nkeys>=0.2.1"

Arguments (each flag may come from the environment variable in brackets):
  --nats-url       [NATS_URL]                 default nats://127.0.0.1:4222
  --inbox-prefix   [NATS_INBOX_PREFIX]        this client's inbox prefix, e.g. _INBOX_CLIENT.shop
                                              (required with deploy/nats/accounts.conf, where a
                                              client may subscribe to its own prefix only);
                                              default _INBOX
  --producer-id    [MSGTRAIL_PRODUCER_ID]     a producer configured on the broker
  --producer-seed  [MSGTRAIL_PRODUCER_SEED]   its nkey seed (SU...); prefer the env var
  --consumer-id    [MSGTRAIL_CONSUMER_ID]     a consumer configured on the broker
  --consumer-seed  [MSGTRAIL_CONSUMER_SEED]   its nkey seed (SU...); prefer the env var
  --topic          [MSGTRAIL_TOPIC]           default orders.eu
  --group          [MSGTRAIL_GROUP]           consumer group; default: the consumer ID
  --payload        [MSGTRAIL_PAYLOAD]         default: a small JSON document
  --request-id     [MSGTRAIL_REQUEST_ID]      default: generated (py-<uuid4>)
  --trace                                     print every request and reply on stderr

Example:
  NATS_URL=nats://127.0.0.1:4222 \\
  MSGTRAIL_PRODUCER_ID=shop MSGTRAIL_PRODUCER_SEED=SUA... \\
  MSGTRAIL_CONSUMER_ID=billing-1 MSGTRAIL_CONSUMER_SEED=SUB... \\
  python3 examples/python/raw_client.py --topic orders.eu
"""

import argparse
import asyncio
import base64
import json
import os
import struct
import sys
import time
import uuid

try:
    import nats
    import nkeys
except ImportError as e:  # pragma: no cover - a friendly message instead of a traceback
    print(
        f"missing Python package ({e.name}): python3 -m pip install nats-py nkeys",
        file=sys.stderr,
    )
    sys.exit(2)

# Subjects (docs/PROTOCOL.md, "Subjects").
CHALLENGE = "msgtrail.v1.channel.challenge"
OPEN = "msgtrail.v1.channel.open"
KEEPALIVE = "msgtrail.v1.channel.keepalive"
CLOSE = "msgtrail.v1.channel.close"
UPLOAD = "msgtrail.v1.upload"
UPLOAD_BATCH = "msgtrail.v1.upload.batch"
SETTLE = "msgtrail.v1.settle"
FETCH = "msgtrail.v1.fetch"
SUBSCRIBE = "msgtrail.v1.subscribe"
UNSUBSCRIBE = "msgtrail.v1.unsubscribe"
ACK = "msgtrail.v1.ack"
STAGE = "msgtrail.v1.stage"

TIMEOUT = 5.0  # seconds, for every request but fetch
TRACE = False  # --trace: print every request and reply on stderr


class Refused(Exception):
    """An error reply of the broker: Msgtrail-Error code, HTTP-like status, message."""

    def __init__(self, subject, code, status, message):
        super().__init__(f"{subject}: {code} ({status}): {message}")
        self.subject, self.code, self.status, self.message = subject, code, status, message


def emit(**fields):
    print(json.dumps(fields, sort_keys=True), flush=True)


def header(msg, name):
    """A reply header, looked up case-insensitively (None if absent)."""
    for k, v in (msg.headers or {}).items():
        if k.lower() == name.lower():
            return v
    return None


def shown(body):
    """A body for the wire trace: binary frames (they start with "MT") as hex."""
    if body[:2] == b"MT":
        return "hex:" + body.hex()
    return body.decode(errors="replace")


async def request_raw(nc, subject, body=b"", headers=None, timeout=TIMEOUT):
    """Sends a request; returns the reply body as bytes, raises Refused on an error reply."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    reply = await nc.request(subject, body, timeout=timeout, headers=headers)
    if TRACE:
        print(
            json.dumps(
                {
                    "subject": subject,
                    "headers": headers or {},
                    "body": shown(body),
                    "reply_headers": reply.headers or {},
                    "reply": shown(reply.data),
                }
            ),
            file=sys.stderr,
            flush=True,
        )
    status = header(reply, "Nats-Service-Error-Code")
    if status is not None or header(reply, "Msgtrail-Error") is not None:
        raise Refused(
            subject,
            header(reply, "Msgtrail-Error") or "internal",
            int(status or 500),
            header(reply, "Nats-Service-Error") or "",
        )
    return reply.data


async def request(nc, subject, body=b"", headers=None, timeout=TIMEOUT):
    """Sends a request; returns the reply body as JSON, raises Refused on an error reply."""
    return json.loads(await request_raw(nc, subject, body, headers, timeout))


def sign(seed, nonce):
    """Ed25519 signature of the nonce's UTF-8 bytes, base64url without padding."""
    key = nkeys.from_seed(seed.encode())
    sig = key.sign(nonce.encode())
    return base64.urlsafe_b64encode(sig).decode().rstrip("=")


async def open_channel(nc, role, client_id, seed):
    challenge = await request(nc, CHALLENGE, {"client_id": client_id})
    opened = await request(
        nc,
        OPEN,
        {
            "role": role,
            "client_id": client_id,
            "nonce": challenge["nonce"],
            "signature": sign(seed, challenge["nonce"]),
        },
    )
    emit(
        event="channel_opened",
        role=role,
        client_id=client_id,
        channel=opened["channel"],
        ttl_ms=opened["ttl_ms"],
        topics=opened["topics"],
    )
    return opened["channel"]


async def report(nc, channel, records):
    """Reports the client's own stage records: one JSON object per line."""
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    reply = await request(nc, STAGE, body, headers={"Msgtrail-Channel": channel})
    return reply["accepted"]


async def upload(nc, channel, topic, request_id, attempt, payload, attrs):
    headers = {
        "Msgtrail-Channel": channel,
        "Msgtrail-Topic": topic,
        "Msgtrail-Request-Id": request_id,
        "Msgtrail-Attempt": str(attempt),
    }
    for k, v in attrs.items():
        headers["Msgtrail-Attr-" + k] = v
    return await request(nc, UPLOAD, payload, headers=headers)


# -- binary frames (docs/PROTOCOL.md §18) ---------------------------------------------------
# Every frame: "M", "T", a kind byte, the format version 1; integers big-endian; str8 / str16
# are UTF-8 with a u8 / u16 length; bytes32 a u32 length; a message ID its 16 UUID bytes.

FRAME_VERSION = 1
# The stage byte of a compact record: the position of the code in this list.
STAGES = ["P1", "P2", "P3", "P4", "C1", "C2", "C3", "C4", "C5", "C6", "C7", "C8",
          "X1", "X2", "N1", "A1", "R1", "D1"]
SETTLE_KINDS = {"ack": 0, "nack": 1, "term": 2}


def u8(v):
    return struct.pack(">B", v)


def u16(v):
    return struct.pack(">H", v)


def u32(v):
    return struct.pack(">I", v)


def u64(v):
    return struct.pack(">Q", v)


def str8(s):
    b = s.encode()
    if len(b) > 0xFF:
        raise ValueError(f"{s[:20]!r}… is over 255 bytes")
    return u8(len(b)) + b


def str16(s):
    b = s.encode()
    if len(b) > 0xFFFF:
        raise ValueError(f"{s[:20]!r}… is over 65535 bytes")
    return u16(len(b)) + b


def bytes32(b):
    return u32(len(b)) + b


# A settle batch whose settles carry their delivery's records (docs/PROTOCOL.md §18.4).
SETTLE_RECORDS_VERSION = 2


def frame_head(kind, version=FRAME_VERSION):
    return b"MT" + kind.encode() + u8(version)


def attrs_bytes(attrs):
    out = u8(len(attrs))
    for k, v in attrs.items():
        out += str8(k) + str16(v)
    return out


# The optional fields of a compact stage record, in presence-bitmap order (bit 0 first).
RECORD_FIELDS = [
    ("message_id", lambda v: uuid.UUID(v).bytes),
    ("request_id", str8),
    ("producer", str8),
    ("consumer", str8),
    ("group", str8),
    ("topic", str16),
    ("attempt", u32),
    ("stream_seq", u64),
    ("outcome", str8),
    ("detail", str16),
    ("service", str8),
    ("traceparent", str8),
    ("attrs", attrs_bytes),
    ("payload_size", u64),
    ("payload_head", str16),
]


def record_bytes(rec):
    """A stage record (a dict as in JSON reports) in the compact encoding."""
    present, fields = 0, b""
    for bit, (name, encode) in enumerate(RECORD_FIELDS):
        value = rec.get(name)
        if value is None or value == {}:
            continue
        present |= 1 << bit
        fields += encode(value)
    return u8(STAGES.index(rec["stage"])) + u64(rec["at"]) + u16(present) + fields


def reports_bytes(reports):
    """Reported records grouped by their proof (token: receipt or ack token, or ""): each
    distinct token once, then its records — a delivery's C6, X1, X2, C7 share one token."""
    groups = {}
    for rec in reports:
        rec = dict(rec)
        groups.setdefault(rec.pop("token", ""), []).append(rec)
    out = u16(len(groups))
    for token, recs in groups.items():
        out += str16(token) + u16(len(recs)) + b"".join(record_bytes(r) for r in recs)
    return out


def encode_upload_batch(entries, reports=()):
    """An upload batch: per message request_id, topic, attempt, sent_at (P1, 0 = none),
    traceparent ("" = none), attributes and the raw payload; then the reported records."""
    out = frame_head("U") + u16(len(entries))
    for e in entries:
        out += str8(e["request_id"]) + str16(e["topic"]) + u32(e.get("attempt", 1))
        out += u64(e.get("sent_at", 0)) + str8(e.get("traceparent", ""))
        out += attrs_bytes(e.get("attrs", {})) + bytes32(e["payload"])
    return out + reports_bytes(reports)


def encode_settle_batch(settles, reports=()):
    """A settle batch: per delivery kind, optional delay_ms, token and reason, and (version 2,
    when any settle has "records") the delivery's own records (C2/C3, C6/C7, X1/X2) with no
    token: the settle's is their proof; then the reported records riding along (each with
    its delivery's ack token)."""
    own = any(s.get("records") for s in settles)
    out = frame_head("S", SETTLE_RECORDS_VERSION if own else FRAME_VERSION) + u16(len(settles))
    for s in settles:
        out += u8(SETTLE_KINDS[s.get("kind", "ack")])
        delay = s.get("delay_ms")
        out += u8(0) if delay is None else u8(1) + u64(delay)
        out += str16(s["token"]) + str16(s.get("reason", ""))
        if own:
            records = s.get("records", [])
            out += u8(len(records)) + b"".join(record_bytes(r) for r in records)
    return out + reports_bytes(reports)


def encode_report(reports):
    """A stage report as a binary frame (for msgtrail.v1.stage)."""
    return frame_head("R") + reports_bytes(reports)


class Frame:
    """Reads one frame strictly: wrong kind or version, truncation or trailing bytes raise."""

    def __init__(self, data, kind):
        self.data, self.pos = bytes(data), 0
        head = self.take(4)
        if head[:3] != b"MT" + kind.encode() or head[3] != FRAME_VERSION:
            raise ValueError(f"not a version-1 {kind!r} frame: {head!r}")

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ValueError(f"frame truncated at byte {self.pos}: needs {n} more bytes")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def int(self, fmt, n):
        return struct.unpack(fmt, self.take(n))[0]

    def u8(self):
        return self.int(">B", 1)

    def u16(self):
        return self.int(">H", 2)

    def u32(self):
        return self.int(">I", 4)

    def u64(self):
        return self.int(">Q", 8)

    def str8(self):
        return self.take(self.u8()).decode()

    def str16(self):
        return self.take(self.u16()).decode()

    def bytes32(self):
        return self.take(self.u32())

    def message_id(self):
        return str(uuid.UUID(bytes=self.take(16)))

    def attrs(self):
        return dict((self.str8(), self.str16()) for _ in range(self.u8()))

    def error(self):
        return {"code": self.str8(), "error": self.str16()}

    def outcome(self):
        """What became of the records that rode along: accepted whole or refused whole."""
        accepted = self.u32()
        return {"accepted": accepted, "error": self.error() if self.u8() else None}

    def end(self):
        if self.pos != len(self.data):
            raise ValueError(f"{len(self.data) - self.pos} trailing bytes at byte {self.pos}")


def decode_upload_results(data):
    f = Frame(data, "u")
    results = []
    for _ in range(f.u16()):
        status = f.u8()
        if status in (0, 1):
            results.append({"ok": True, "message_id": f.message_id(), "stream_seq": f.u64(),
                            "duplicate": status == 1, "receipt": f.str8()})
        elif status == 2:
            results.append({"ok": False, **f.error()})
        else:
            raise ValueError(f"unknown upload result status {status}")
    reports = f.outcome()
    f.end()
    return results, reports


def decode_deliveries(data):
    f = Frame(data, "D")
    no_match = f.u8() != 0
    messages = []
    for _ in range(f.u16()):
        messages.append({
            "message_id": f.message_id(), "topic": f.str16(), "producer": f.str8(),
            "group": f.str8(), "delivery_attempt": f.u32(), "stream_seq": f.u64(),
            "ack_token": f.str16(), "attributes": f.attrs(), "payload": f.bytes32(),
        })
    f.end()
    return no_match, messages


def decode_settle_results(data):
    f = Frame(data, "s")
    results = []
    for _ in range(f.u16()):
        status = f.u8()
        if status == 0:
            results.append({"ok": True})
        elif status == 2:
            results.append({"ok": False, **f.error()})
        else:
            raise ValueError(f"unknown settle result status {status}")
    reports = f.outcome()
    f.end()
    return results, reports


async def run(args):
    nc = await nats.connect(
        args.nats_url,
        connect_timeout=5,
        max_reconnect_attempts=0,
        inbox_prefix=args.inbox_prefix,  # replies and push inboxes live under it
    )
    try:
        await walk(nc, args)
    finally:
        await nc.drain()


async def walk(nc, args):
    topic, group = args.topic, args.group or args.consumer_id
    payload = args.payload.encode()
    attrs = {"category": "refund"}
    request_id = args.request_id or f"py-{uuid.uuid4()}"

    # -- producer ---------------------------------------------------------------------------
    producer = await open_channel(nc, "producer", args.producer_id, args.producer_seed)
    p1_at = time.time_ns()
    stored = await upload(nc, producer, topic, request_id, 1, payload, attrs)
    p4_at = time.time_ns()
    emit(event="uploaded", **stored)
    accepted = await report(
        nc,
        producer,
        [
            {"stage": "P1", "at": p1_at, "request_id": request_id, "topic": topic, "attempt": 1},
            {
                "stage": "P4",
                "at": p4_at,
                "request_id": request_id,
                "message_id": stored["message_id"],
                "stream_seq": stored["stream_seq"],
                "token": stored["receipt"],  # proves the message ID was assigned to this upload
            },
        ],
    )
    emit(event="reported", role="producer", stages=["P1", "P4"], accepted=accepted)

    # A retry with the same request ID (as after a lost reply): stored once, same message ID.
    again = await upload(nc, producer, topic, request_id, 2, payload, attrs)
    emit(event="uploaded", **again)

    # -- consumer ---------------------------------------------------------------------------
    consumer = await open_channel(nc, "consumer", args.consumer_id, args.consumer_seed)
    kept = await request(nc, KEEPALIVE, {"channel": consumer})
    emit(event="keepalive", channel=consumer, ttl_ms=kept["ttl_ms"])

    # Fetch this very message by its ID (so other messages of the topic, waiting for the
    # group, are left alone). A fetch by topic would be the same without "message_id", plus
    # "filter": {"category": "refund"} to take only messages with that attribute.
    fetch = {
        "channel": consumer,
        "group": group,
        "topic": topic,
        "message_id": stored["message_id"],
        "max": 1,
        "wait_ms": 5000,
    }
    reply = await request(nc, FETCH, fetch, timeout=TIMEOUT + 5)
    c6_at = time.time_ns()
    if not reply["messages"]:
        raise Refused(FETCH, "no_message", 404, f"fetch returned {reply}")
    d = reply["messages"][0]
    body = base64.b64decode(d["payload"])
    emit(
        event="fetched",
        message_id=d["message_id"],
        topic=d["topic"],
        attributes=d["attributes"],
        payload=body.decode(errors="replace"),
        delivery_attempt=d["delivery_attempt"],
        stream_seq=d["stream_seq"],
        producer=d["producer"],
        group=d["group"],
    )

    # "Process" the message, then report C6, X1, X2, C7 and ack. The consumer field may be
    # omitted: the broker fills it in from the channel (and refuses any other consumer).
    x1_at = time.time_ns()
    ok = body == payload
    x2_at = time.time_ns()
    base = {
        "message_id": d["message_id"],
        "group": d["group"],
        "topic": d["topic"],
        "attempt": d["delivery_attempt"],
        "token": d["ack_token"],  # proves the delivery went to this consumer
    }
    c7_at = time.time_ns()
    accepted = await report(
        nc,
        consumer,
        [
            {"stage": "C6", "at": c6_at, **base},
            {"stage": "X1", "at": x1_at, **base},
            {"stage": "X2", "at": x2_at, "outcome": "ok" if ok else "failed", **base},
            {"stage": "C7", "at": c7_at, "outcome": "ack", **base},
        ],
    )
    emit(event="reported", role="consumer", stages=["C6", "X1", "X2", "C7"], accepted=accepted)
    await request(nc, ACK, {"channel": consumer, "token": d["ack_token"], "kind": "ack"})
    emit(event="acked", message_id=d["message_id"], kind="ack")

    # Acked: fetching it again finds nothing, and the broker answers with the
    # no-matching-message notice (and records N1).
    reply = await request(nc, FETCH, {**fetch, "wait_ms": 200}, timeout=TIMEOUT + 1)
    emit(event="fetched_none", notice=reply.get("notice"), messages=len(reply["messages"]))

    await push(nc, args, producer, consumer, request_id, payload)
    await batch(nc, args, producer, consumer, request_id)

    for ch in (producer, consumer):
        await request(nc, CLOSE, {"channel": ch})
    emit(event="closed", channels=2)


async def push(nc, args, producer, consumer, request_id, payload):
    """Push: the broker publishes matching messages to our inbox as soon as they exist."""
    topic, group = args.topic, args.group or args.consumer_id
    # A filter only this run's message matches (a new subscription starts at the beginning of
    # the stream, so older messages of the topic would come first otherwise).
    run = uuid.uuid4().hex
    inbox = nc.new_inbox()
    pushed = asyncio.Queue()

    async def on_push(msg):
        await pushed.put(msg)

    inbox_sub = await nc.subscribe(inbox, cb=on_push)  # subscribe before asking for pushes
    sub = await request(
        nc,
        SUBSCRIBE,
        {
            "channel": consumer,
            "group": group,
            "topic": topic,
            "filter": {"run": run},
            "deliver_subject": inbox,
            "max_inflight": 1,
        },
    )
    emit(event="subscribed", subscription_id=sub["subscription_id"])
    stored = await upload(nc, producer, topic, f"{request_id}-push", 1, payload, {"run": run})
    emit(event="uploaded", **stored)

    msg = await asyncio.wait_for(pushed.get(), timeout=10)
    c2_at = time.time_ns()
    attrs = {
        k[len("Msgtrail-Attr-"):]: v
        for k, v in (msg.headers or {}).items()
        if k.lower().startswith("msgtrail-attr-")
    }
    d = {
        "message_id": header(msg, "Msgtrail-Message-Id"),
        "topic": header(msg, "Msgtrail-Topic"),
        "group": header(msg, "Msgtrail-Group"),
        "attempt": int(header(msg, "Msgtrail-Delivery-Attempt")),
    }
    emit(
        event="pushed",
        subject=msg.subject,
        stream_seq=int(header(msg, "Msgtrail-Stream-Seq")),
        producer=header(msg, "Msgtrail-Producer"),
        attributes=attrs,
        payload=msg.data.decode(errors="replace"),  # raw bytes, not base64
        **d,
    )
    ok = msg.data == payload
    d = {**d, "token": header(msg, "Msgtrail-Ack-Token")}  # proves the delivery was ours
    x_at = time.time_ns()
    accepted = await report(
        nc,
        consumer,
        [
            {"stage": "C2", "at": c2_at, **d},
            {"stage": "X1", "at": x_at, **d},
            {"stage": "X2", "at": time.time_ns(), "outcome": "ok" if ok else "failed", **d},
            {"stage": "C3", "at": time.time_ns(), "outcome": "ack", **d},
        ],
    )
    emit(event="reported", role="consumer", stages=["C2", "X1", "X2", "C3"], accepted=accepted)
    token = header(msg, "Msgtrail-Ack-Token")
    await request(nc, ACK, {"channel": consumer, "token": token, "kind": "ack"})
    emit(event="acked", message_id=d["message_id"], kind="ack")
    await request(nc, UNSUBSCRIBE, {"channel": consumer, "subscription_id": sub["subscription_id"]})
    await inbox_sub.unsubscribe()
    emit(event="unsubscribed", subscription_id=sub["subscription_id"])


async def batch(nc, args, producer, consumer, request_id):
    """The batched binary path: one upload batch, one fetch, one settle batch (§18)."""
    topic, group = args.topic, args.group or args.consumer_id
    run = uuid.uuid4().hex  # a filter only this step's messages match
    entries = [
        {"request_id": f"{request_id}-b1", "topic": topic,
         "attrs": {"run": run, "category": "refund"}, "payload": b'{"order": 43}'},
        {"request_id": f"{request_id}-b2", "topic": topic, "attrs": {"run": run},
         "payload": b""},  # a 0-byte payload is a message like any other
        {"request_id": f"{request_id}-b3", "topic": "not a topic", "attrs": {"run": run},
         "payload": b"refused alone"},  # invalid topic: only this one is refused
        {"request_id": f"{request_id}-b4", "topic": topic, "attrs": {"run": run},
         "payload": b"\x00\x01\xfe\xff"},  # raw bytes, no encoding
    ]
    for e in entries:
        e["attempt"] = 1
        e["sent_at"] = time.time_ns()  # P1 rides in the entry: the broker records it
    reply = await request_raw(nc, UPLOAD_BATCH, encode_upload_batch(entries),
                              headers={"Msgtrail-Channel": producer})
    p4_at = time.time_ns()
    results, reports = decode_upload_results(reply)
    if len(results) != len(entries):
        raise ValueError(f"{len(entries)} uploads, {len(results)} results")
    shown_results = []
    for e, r in zip(entries, results):
        r = {k: v for k, v in r.items() if k != "receipt"}
        shown_results.append({"request_id": e["request_id"], "topic": e["topic"],
                              "sent_at": e["sent_at"], **r})
    emit(event="batch_uploaded", results=shown_results, reports=reports)

    # P4 of each stored message, with its receipt as the proof, in a binary report frame.
    # (They could also ride along the next upload batch.)
    stored = [(e, r) for e, r in zip(entries, results) if r["ok"]]
    p4s = []
    for e, r in stored:
        p4 = {"stage": "P4", "at": p4_at, "request_id": e["request_id"],
              "message_id": r["message_id"], "stream_seq": r["stream_seq"],
              "token": r["receipt"]}
        if r["duplicate"]:
            p4["outcome"] = "duplicate"
        p4s.append(p4)
    accepted = await request(nc, STAGE, encode_report(p4s),
                             headers={"Msgtrail-Channel": producer})
    emit(event="batch_reported", role="producer", stages=["P4"] * len(p4s),
         accepted=accepted["accepted"])

    # Fetch them with binary replies: raw payloads, one frame for the whole batch.
    fetch = {"channel": consumer, "group": group, "topic": topic, "filter": {"run": run},
             "max": 10, "wait_ms": 5000, "format": "binary"}
    delivered = []
    deadline = time.monotonic() + 15
    while len(delivered) < len(stored) and time.monotonic() < deadline:
        no_match, messages = decode_deliveries(
            await request_raw(nc, FETCH, fetch, timeout=TIMEOUT + 5))
        received_at = time.time_ns()
        delivered += [(m, received_at) for m in messages]
    emit(
        event="batch_fetched",
        messages=[
            {"message_id": m["message_id"], "topic": m["topic"], "producer": m["producer"],
             "group": m["group"], "delivery_attempt": m["delivery_attempt"],
             "stream_seq": m["stream_seq"], "attributes": m["attributes"],
             "payload_hex": m["payload"].hex(), "payload_size": len(m["payload"])}
            for m, _ in delivered
        ],
    )

    # "Process" each, then settle all in one batch: an ack per delivery, and a forged token
    # (a real one with another signature) that must fail alone. Each settle carries C6, X1,
    # X2, C7 of its own delivery: the settle's ack token proves them, and the broker fills in
    # message, group, attempt and topic from it, so they need only stage, time and outcome.
    own = []
    settles = []
    for m, c6_at in delivered:
        x1_at = time.time_ns()
        ok = any(m["payload"] == e["payload"] for e, _ in stored)
        records = [
            {"stage": "C6", "at": c6_at},
            {"stage": "X1", "at": x1_at},
            {"stage": "X2", "at": time.time_ns(), "outcome": "ok" if ok else "failed"},
            {"stage": "C7", "at": time.time_ns(), "outcome": "ack"},
        ]
        own += records
        settles.append({"kind": "ack", "token": m["ack_token"], "message_id": m["message_id"],
                        "records": records})
    if settles:
        body, _, tag = settles[0]["token"].rpartition(".")
        forged = body + "." + ("A" * len(tag) if tag != "A" * len(tag) else "B" * len(tag))
        # The forged settle's records are refused with it (not counted as accepted).
        settles.insert(1, {"kind": "ack", "token": forged, "forged": True,
                           "records": [{"stage": "C6", "at": time.time_ns()}]})
    reply = await request_raw(nc, SETTLE, encode_settle_batch(settles),
                              headers={"Msgtrail-Channel": consumer})
    results, reports = decode_settle_results(reply)
    emit(
        event="batch_settled",
        results=[
            {"message_id": s.get("message_id"), "forged": s.get("forged", False), **r}
            for s, r in zip(settles, results)
        ],
        reports=reports,
        stages=[r["stage"] for r in own],
    )

    # Settled: nothing matches any more; the binary reply is the no-matching-message notice.
    no_match, messages = decode_deliveries(
        await request_raw(nc, FETCH, {**fetch, "wait_ms": 200}, timeout=TIMEOUT + 1))
    emit(event="batch_fetched_none", no_matching_message=no_match, messages=len(messages))


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats-url", default=env("NATS_URL", "nats://127.0.0.1:4222"))
    p.add_argument("--inbox-prefix", default=env("NATS_INBOX_PREFIX", "_INBOX"))
    p.add_argument("--producer-id", default=env("MSGTRAIL_PRODUCER_ID"))
    p.add_argument("--producer-seed", default=env("MSGTRAIL_PRODUCER_SEED"))
    p.add_argument("--consumer-id", default=env("MSGTRAIL_CONSUMER_ID"))
    p.add_argument("--consumer-seed", default=env("MSGTRAIL_CONSUMER_SEED"))
    p.add_argument("--topic", default=env("MSGTRAIL_TOPIC", "orders.eu"))
    p.add_argument("--group", default=env("MSGTRAIL_GROUP"))
    p.add_argument("--payload", default=env("MSGTRAIL_PAYLOAD", '{"order": 42, "amount": "9.90"}'))
    p.add_argument("--request-id", default=env("MSGTRAIL_REQUEST_ID"))
    p.add_argument("--trace", action="store_true", help="print every request and reply on stderr")
    args = p.parse_args(argv)
    missing = [
        flag
        for flag, value in [
            ("--producer-id", args.producer_id),
            ("--producer-seed", args.producer_seed),
            ("--consumer-id", args.consumer_id),
            ("--consumer-seed", args.consumer_seed),
        ]
        if not value
    ]
    if missing:
        p.error("missing " + ", ".join(missing) + " (or their environment variables)")
    return args


def main(argv=None):
    global TRACE
    args = parse_args(sys.argv[1:] if argv is None else argv)
    TRACE = args.trace
    try:
        asyncio.run(run(args))
    except Refused as e:
        emit(event="error", subject=e.subject, code=e.code, status=e.status, message=e.message)
        return 1
    except Exception as e:  # noqa: BLE001 - print any failure as one JSON line
        emit(event="error", code=type(e).__name__, message=str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
