use super::*;

#[test]
fn the_settle_deadline_is_the_ack_wait_less_a_small_margin() {
    let now = 1_764_000_000_000;
    // A tenth of a short ack wait, at most 50 ms of a long one.
    assert_eq!(
        settle_deadline_ms(now, Duration::from_millis(200)),
        now + 180
    );
    assert_eq!(settle_deadline_ms(now, Duration::from_secs(1)), now + 950);
    assert_eq!(
        settle_deadline_ms(now, Duration::from_secs(30)),
        now + 29_950
    );
}

#[test]
fn durable_names_depend_on_the_whole_subscription() {
    let mut sub = Subscription {
        group: msgtrail_core::GroupId::new("billing-eu").unwrap(),
        topic: "orders.*".into(),
        filter: BTreeMap::new(),
        message_id: None,
    };
    let a = durable_name(&sub);
    sub.filter.insert("category".into(), "refund".into());
    let b = durable_name(&sub);
    assert_ne!(a, b);
    assert!(a.starts_with("g-billing-eu-"));
    assert_eq!(group_of_durable(&a), Some("billing-eu"));
}

/// Stored headers as a broker wrote them: `compact` with `Msgtrail-Stored` (this broker),
/// else with the separate headers of earlier brokers.
fn stored_message(id: MessageId, compact: bool) -> async_nats::HeaderMap {
    let mut hs = async_nats::HeaderMap::new();
    hs.insert(h::NATS_MSG_ID, "shop:ord-1:x");
    hs.insert(h::MESSAGE_ID, id.to_string().as_str());
    if compact {
        hs.insert(h::STORED, "1;ord-1:x;shop-svc;1;42;broker-a");
    } else {
        hs.insert(h::REQUEST_ID, "ord-1:x");
        hs.insert(h::PRODUCER, "shop");
        hs.insert(h::PRODUCER_SERVICE, "shop-svc");
        hs.insert(h::TOPIC, "orders.eu");
        hs.insert(h::ATTEMPT, "1");
        hs.insert(h::RECEIVED_AT, "42");
        hs.insert(h::BROKER_SERVICE, "broker-a");
    }
    hs.insert("Msgtrail-Attr-category", "refund");
    hs
}

#[test]
fn a_delivery_reads_both_stored_layouts() {
    for compact in [true, false] {
        let id = MessageId::new();
        let (got, producer, topic, attrs) =
            take::delivery_fields(&stored_message(id, compact), "msgtrail.msg.orders.eu").unwrap();
        assert_eq!(got, id);
        assert_eq!((producer.as_str(), topic.as_str()), ("shop", "orders.eu"));
        assert_eq!(attrs.get("category").map(String::as_str), Some("refund"));
    }
}

#[test]
fn a_delivery_needs_a_producer_and_ignores_msgtrail_stored() {
    let id = MessageId::new();
    let mut hs = stored_message(id, true);
    // A malformed Msgtrail-Stored does not stop a delivery: it needs nothing of it.
    hs.insert(h::STORED, "9;whatever");
    assert!(take::delivery_fields(&hs, "msgtrail.msg.orders.eu").is_some());
    hs.insert(h::NATS_MSG_ID, "no-colon");
    assert!(take::delivery_fields(&hs, "msgtrail.msg.orders.eu").is_none());
}

#[test]
fn a_dead_letter_keeps_the_producer_of_both_layouts() {
    let group = GroupId::new("billing").unwrap();
    for compact in [true, false] {
        let original = stored_message(MessageId::new(), compact);
        let dead = dead_letter::dead_letter_headers(&original, &group, 7, "poison\r\npill");
        let get = |n: &str| dead.get(n).map(|v| v.as_str());
        assert_eq!(get(h::NATS_MSG_ID), Some("dlq:billing:7"));
        assert_eq!(get(h::PRODUCER), Some("shop"));
        assert_eq!(get(h::GROUP), Some("billing"));
        assert_eq!(get("Msgtrail-Dead-Letter-Reason"), Some("poison  pill"));
        let fields = msgtrail_core::stored::read(get).unwrap();
        assert_eq!(fields.request_id, Some("ord-1:x"));
        assert_eq!(fields.compact, compact);
        assert_eq!(fields.evidence.unwrap().received_at, 42);
    }
}
