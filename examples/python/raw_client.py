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
 8. closes both channels.

Every step prints one JSON line on stdout ({"event": ...}); a refusal prints
{"event": "error", ...} on stdout and exits with status 1.

Install:  python3 -m pip install "nats-py>=2.6" "nkeys>=0.2.1"

Arguments (each flag may come from the environment variable in brackets):
  --nats-url       [NATS_URL]                 default nats://127.0.0.1:4222
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


async def request(nc, subject, body=b"", headers=None, timeout=TIMEOUT):
    """Sends a request; returns the reply body as JSON, raises Refused on an error reply."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    reply = await nc.request(subject, body, timeout=timeout, headers=headers)
    if TRACE:
        print(
            json.dumps(
                {
                    "subject": subject,
                    "headers": headers or {},
                    "body": body.decode(errors="replace"),
                    "reply_headers": reply.headers or {},
                    "reply": reply.data.decode(errors="replace"),
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
    return json.loads(reply.data)


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


async def run(args):
    nc = await nats.connect(args.nats_url, connect_timeout=5, max_reconnect_attempts=0)
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


def parse_args(argv):
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats-url", default=env("NATS_URL", "nats://127.0.0.1:4222"))
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
