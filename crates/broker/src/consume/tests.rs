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
