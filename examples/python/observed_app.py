#!/usr/bin/env python3
"""A plain JetStream application written with nats-py that knows nothing of msgtrail.

It is what msgtrail's observe mode (`msgtrail listener --observe ORDERS`, README "Trace an
existing JetStream application") traces without a code change; the end-to-end test
crates/listener/tests/observe_python.rs runs it beside an observing listener.

What it does, on the stream ORDERS (subjects orders.>), which it creates:
  - consumers: "billing" and "shipping", durable pull consumers with explicit acks
    (billing: ack wait 1 s, max deliver 3), and "audit", a durable push consumer with
    explicit acks; each samples every ack (sample_freq 100 %), so nats-server reports them;
  - publishes four messages on orders.eu: "ok" with Nats-Msg-Id and traceparent,
    "nak-once" with neither, "term" with a Nats-Msg-Id only, "poison" with a traceparent
    only;
  - shipping and audit ack every message once;
  - billing acks "ok", naks "nak-once" with a delay on its first delivery and acks it on the
    second, terminates "term", and fails "poison" until max deliveries: a nak on its first
    delivery, nothing on its second (its ack wait expires), a nak on its third.

It prints one JSON line per message published ({"published": seq, ...}) and per settle
({"consumer", "seq", "delivered", "did"}), then {"done": true}.

Needs `nats-py` (scripts/test.sh installs it):  python3 -m pip install nats-py
"""

import argparse
import asyncio
import json
import sys
import time

import nats
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig


def say(**fields):
    print(json.dumps(fields), flush=True)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    ap.add_argument("--traceparent", required=True, help="the W3C traceparent of the app's own trace")
    ap.add_argument("--poison-traceparent", required=True, help="the traceparent of the poison message")
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds before giving up")
    args = ap.parse_args()

    nc = await nats.connect(args.nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="ORDERS", subjects=["orders.>"]))
    await js.add_consumer("ORDERS", ConsumerConfig(
        durable_name="billing", ack_policy=AckPolicy.EXPLICIT, ack_wait=1.0,
        max_deliver=3, sample_freq="100%"))
    await js.add_consumer("ORDERS", ConsumerConfig(
        durable_name="shipping", ack_policy=AckPolicy.EXPLICIT, ack_wait=10.0,
        sample_freq="100%"))
    await js.add_consumer("ORDERS", ConsumerConfig(
        durable_name="audit", ack_policy=AckPolicy.EXPLICIT, ack_wait=10.0,
        deliver_subject="app.audit.deliver", sample_freq="100%"))

    messages = [
        ("ok", {"Nats-Msg-Id": "py-ok", "traceparent": args.traceparent}),
        ("nak-once", None),
        ("term", {"Nats-Msg-Id": "py-term"}),
        ("poison", {"traceparent": args.poison_traceparent}),
    ]
    for body, headers in messages:
        ack = await js.publish("orders.eu", body.encode(), headers=headers)
        say(published=ack.seq, body=body, headers=headers or {})

    # audit: a push consumer, acks what it is pushed.
    audited = asyncio.Event()
    seen_by_audit = set()

    async def on_audit(msg):
        md = msg.metadata
        await msg.ack()
        say(consumer="audit", seq=md.sequence.stream, delivered=md.num_delivered, did="ack")
        seen_by_audit.add(md.sequence.stream)
        if len(seen_by_audit) == len(messages):
            audited.set()

    # Bound to the push consumer's deliver subject, as an app with a push consumer is.
    await nc.subscribe("app.audit.deliver", cb=on_audit)

    # shipping: a pull consumer, acks everything once.
    shipping = await js.pull_subscribe_bind("shipping", stream="ORDERS")
    shipped = 0
    while shipped < len(messages):
        for msg in await shipping.fetch(len(messages) - shipped, timeout=5):
            md = msg.metadata
            await msg.ack()
            say(consumer="shipping", seq=md.sequence.stream, delivered=md.num_delivered, did="ack")
            shipped += 1

    # billing: a pull consumer with its failures.
    billing = await js.pull_subscribe_bind("billing", stream="ORDERS")
    poison_seen, settled = 0, set()
    deadline = time.monotonic() + args.timeout
    while (poison_seen < 3 or len(settled) < 3) and time.monotonic() < deadline:
        try:
            batch = await billing.fetch(1, timeout=0.5)
        except nats.errors.TimeoutError:
            continue
        for msg in batch:
            md = msg.metadata
            body, n = msg.data.decode(), md.num_delivered
            if body == "nak-once" and n == 1:
                await msg.nak(delay=0.3)
                did = "nak"
            elif body == "term":
                await msg.term()
                did = "term"
                settled.add(body)
            elif body == "poison":
                poison_seen += 1
                if n == 2:
                    did = "none"  # its ack wait expires
                else:
                    await msg.nak()
                    did = "nak"
            else:
                await msg.ack()
                did = "ack"
                settled.add(body)
            say(consumer="billing", seq=md.sequence.stream, delivered=n, did=did)
    # Billing goes on pulling, as a running app does: nats-server declares max deliveries
    # (its advisory) when it would deliver the poison message a fourth time.
    try:
        extra = await billing.fetch(1, timeout=1.5)
        say(consumer="billing", unexpected=[m.metadata.sequence.stream for m in extra])
        poison_seen = -1
    except nats.errors.TimeoutError:
        pass
    await asyncio.wait_for(audited.wait(), timeout=max(1.0, deadline - time.monotonic()))
    await nc.flush()
    await nc.drain()
    ok = poison_seen == 3 and len(settled) == 3
    say(done=ok, poison_deliveries=poison_seen)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
