use super::*;
use crate::ids::{ClientId, RequestId};

fn full_record() -> StageRecord {
    let mut r = StageRecord::at(Stage::UploadReceived, 1_700_000_000_123_456_789);
    r.message_id = Some(MessageId::new());
    r.request_id = Some(RequestId::new("order-1").unwrap());
    r.producer = Some(ClientId::new("shop").unwrap());
    r.consumer = Some(ClientId::new("billing-1").unwrap());
    r.group = Some(crate::GroupId::new("billing").unwrap());
    r.topic = Some("orders.eu".into());
    r.attempt = Some(2);
    r.stream_seq = Some(77);
    r.outcome = Some("ok".into());
    r.detail = Some("détail ✓".into());
    r.service = Some("msgtrail-broker".into());
    r.traceparent = Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into());
    r.attrs.insert("category".into(), "refund".into());
    r.payload_size = Some(128);
    r.payload_head = Some("aGVsbG8=".into());
    r
}

#[test]
fn stage_batches_round_trip_every_field_and_stage() {
    let mut records = vec![full_record()];
    for s in Stage::ALL {
        records.push(StageRecord::at(*s, 5));
    }
    let bytes = Bytes::from(encode_stage_batch(&records));
    assert_eq!(frame_kind(&bytes), Some(FrameKind::StageBatch));
    assert_eq!(decode_stage_batch(&bytes).unwrap(), records);
    // The same records as JSON are several times larger.
    let json = crate::record::encode_batch(&records);
    assert!(
        bytes.len() * 2 < json.len(),
        "{} vs {}",
        bytes.len(),
        json.len()
    );
}

#[test]
fn by_id_is_a_flag_without_bytes_and_absent_records_encode_as_before() {
    let mut r = StageRecord::at(Stage::PullSent, 5);
    let plain = encode_stage_batch([&r]);
    let plain_json = r.to_json();
    r.by_id = true;
    let flagged = encode_stage_batch([&r]);
    assert_eq!(plain.len(), flagged.len(), "no value bytes, one flag bit");
    assert_eq!(
        decode_stage_batch(&Bytes::from(flagged)).unwrap(),
        vec![r.clone()]
    );
    assert!(!plain_json.contains("by_id"));
    assert!(r.to_json().ends_with(r#","by_id":true}"#));
    let back: StageRecord = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(back, r);
}

#[test]
fn broker_instance_and_stored_time_ride_in_an_extension_byte() {
    let mut r = StageRecord::at(Stage::PullSent, 5);
    r.message_id = Some(MessageId::new());
    // A record without them is encoded as by a broker that predates them, and such a
    // record (written before the extension existed) decodes to none of them.
    let old = encode_stage_batch([&r]);
    assert_eq!(old[8], stage_byte(Stage::PullSent));
    let decoded = decode_stage_batch(&old).unwrap();
    assert_eq!(
        (decoded[0].broker.as_ref(), decoded[0].stored_at),
        (None, None)
    );
    r.broker = Some(crate::ids::BrokerInstance::new("b-1a2b3c4d").unwrap());
    r.stored_at = Some(4);
    let new = encode_stage_batch([&r]);
    assert_eq!(new[8], stage_byte(Stage::PullSent) | 0x80);
    assert_eq!(new.len(), old.len() + 1 + 1 + 10 + 8);
    assert_eq!(decode_stage_batch(&new).unwrap(), vec![r.clone()]);
    // An extension bit this code does not know is refused, naming where.
    let mut unknown = new.clone();
    unknown[8 + 1 + 8 + 2] |= 0x40;
    let err = decode_stage_batch(&unknown).unwrap_err();
    assert!(err.what.contains("extension"), "{err}");
    // Every field together still round-trips.
    let mut full = full_record();
    full.broker = r.broker.clone();
    full.stored_at = Some(u64::MAX);
    full.by_id = true;
    let bytes = encode_stage_batch([&full]);
    assert_eq!(decode_stage_batch(&bytes).unwrap(), vec![full]);
}

#[test]
fn truncated_and_trailing_bytes_are_refused_with_an_offset() {
    let bytes = Bytes::from(encode_stage_batch(&[full_record()]));
    for cut in [3, 8, 20, bytes.len() - 1] {
        let err = decode_stage_batch(&bytes.slice(..cut)).unwrap_err();
        assert!(err.offset <= cut, "{err}");
    }
    let mut long = bytes.to_vec();
    long.push(0);
    let err = decode_stage_batch(&Bytes::from(long)).unwrap_err();
    assert!(err.what.contains("trailing"), "{err}");
    let err = decode_stage_batch(&Bytes::from_static(b"MTT\x09\0\0\0\0")).unwrap_err();
    assert!(err.what.contains("version"), "{err}");
    assert_eq!(frame_kind(b"{\"stage\":\"P1\"}"), None);
}

#[test]
fn upload_batches_round_trip_with_empty_and_large_payloads() {
    let mut report = StageRecord::at(Stage::StoreConfirmed, 9);
    report.message_id = Some(MessageId::new());
    let batch = UploadBatch {
        entries: vec![
            UploadEntry {
                request_id: "r1".into(),
                topic: "orders.eu".into(),
                attempt: 1,
                sent_at: 42,
                traceparent: String::new(),
                attrs: vec![("category".into(), "refund".into())],
                payload: Bytes::new(),
            },
            UploadEntry {
                request_id: "r2".into(),
                topic: "orders.us".into(),
                attempt: 3,
                sent_at: 0,
                traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
                attrs: vec![],
                payload: Bytes::from(vec![7u8; 512 * 1024]),
            },
        ],
        reports: vec![ReportedRecord {
            record: report,
            token: "receipt".into(),
        }],
        reports_invalid: None,
    };
    let bytes = batch.encode();
    assert_eq!(UploadBatch::decode(&bytes).unwrap(), batch);

    let results = UploadResults {
        results: vec![
            UploadResult::Stored {
                message_id: MessageId::new(),
                stream_seq: 4,
                duplicate: true,
                receipt: "abc".into(),
            },
            UploadResult::Refused(WireError::new(ErrorCode::InvalidTopic, "bad topic")),
        ],
        reports: ReportsOutcome {
            accepted: 0,
            error: Some(WireError::new(ErrorCode::RecordNotOwned, "record 1: no")),
        },
    };
    assert_eq!(UploadResults::decode(&results.encode()).unwrap(), results);
}

#[test]
fn deliveries_and_settles_round_trip() {
    let d = DeliveryBatch {
        no_matching_message: false,
        messages: vec![DeliveredMessage {
            message_id: MessageId::new(),
            topic: "orders.eu".into(),
            producer: "shop".into(),
            group: "billing".into(),
            delivery_attempt: 2,
            stream_seq: 9,
            ack_token: "tok".into(),
            attributes: vec![("k".into(), "v".into())],
            payload: Bytes::from_static(b"hello"),
        }],
    };
    assert_eq!(DeliveryBatch::decode(&d.encode()).unwrap(), d);
    let none = DeliveryBatch {
        no_matching_message: true,
        messages: vec![],
    };
    assert_eq!(DeliveryBatch::decode(&none.encode()).unwrap(), none);

    let s = SettleBatch {
        entries: vec![
            SettleEntry {
                token: "a".into(),
                kind: SettleKind::Ack,
                delay_ms: None,
                reason: String::new(),
                records: vec![],
                records_invalid: None,
            },
            SettleEntry {
                token: "b".into(),
                kind: SettleKind::Nack,
                delay_ms: Some(0),
                reason: "later".into(),
                records: vec![],
                records_invalid: None,
            },
            SettleEntry {
                token: "c".into(),
                kind: SettleKind::Term,
                delay_ms: None,
                reason: "poison".into(),
                records: vec![],
                records_invalid: None,
            },
        ],
        reports: vec![],
        reports_invalid: None,
    };
    assert_eq!(SettleBatch::decode(&s.encode()).unwrap(), s);
    let r = SettleResults {
        results: vec![None, Some(WireError::new(ErrorCode::BadAckToken, "forged"))],
        reports: ReportsOutcome::default(),
    };
    assert_eq!(SettleResults::decode(&r.encode()).unwrap(), r);
}

#[test]
fn an_invalid_reported_record_refuses_the_records_not_the_batch() {
    let mut bad = StageRecord::at(Stage::StoreConfirmed, 9);
    bad.request_id = Some(RequestId::new("r1").unwrap());
    let good = ReportedRecord {
        record: bad.clone(),
        token: "t".into(),
    };
    let batch = UploadBatch {
        entries: vec![UploadEntry {
            request_id: "r2".into(),
            topic: "t".into(),
            attempt: 1,
            sent_at: 1,
            traceparent: String::new(),
            attrs: vec![],
            payload: Bytes::from_static(b"x"),
        }],
        reports: vec![good.clone(), good],
        reports_invalid: None,
    };
    // Make the second record's request ID break the grammar (same length, a space).
    let mut bytes = batch.encode().to_vec();
    let pos = bytes.windows(2).rposition(|w| w == b"r1").unwrap();
    bytes[pos] = b' ';
    let decoded = UploadBatch::decode(&Bytes::from(bytes)).unwrap();
    assert_eq!(decoded.entries, batch.entries);
    assert!(decoded.reports.is_empty());
    let why = decoded.reports_invalid.unwrap();
    assert!(why.starts_with("record 2:"), "{why}");
}

#[test]
fn reported_records_travel_grouped_by_token() {
    let rec = |stage, token: &str| ReportedRecord {
        record: StageRecord::at(stage, 5),
        token: token.into(),
    };
    let long = "t".repeat(300);
    let reports = vec![
        rec(Stage::PullReceived, &long),
        rec(Stage::StoreConfirmed, "receipt"),
        rec(Stage::ProcessStarted, &long),
        rec(Stage::PullAckSent, &long),
    ];
    let bytes = encode_report(&reports);
    assert!(
        bytes.len() < 2 * long.len(),
        "the long token is written once"
    );
    let got = decode_report(&bytes).unwrap().unwrap();
    let stages: Vec<Stage> = got.iter().map(|r| r.record.stage).collect();
    assert_eq!(
        stages,
        [
            Stage::PullReceived,
            Stage::ProcessStarted,
            Stage::PullAckSent,
            Stage::StoreConfirmed
        ]
    );
    assert!(got[..3].iter().all(|r| r.token == long));
    assert_eq!(got[3].token, "receipt");
}

#[test]
fn counts_beyond_the_limits_are_refused() {
    let mut w = Writer::new(FrameKind::UploadBatch, 8);
    w.u16((MAX_BATCH_ENTRIES + 1) as u16);
    let err = UploadBatch::decode(&w.finish()).unwrap_err();
    assert!(err.what.contains("at most"), "{err}");
}

/// docs/PROTOCOL.md, read by the tests that check its examples against the encoder.
const PROTOCOL_MD: &str = include_str!("../../../../docs/PROTOCOL.md");

/// The bytes of the hex dump (`0000  4d 54 …` lines) in the first text block after `marker`.
fn documented_hex(marker: &str) -> Vec<u8> {
    let after = &PROTOCOL_MD[PROTOCOL_MD
        .find(marker)
        .unwrap_or_else(|| panic!("PROTOCOL.md has the marker {marker}"))..];
    let start = after.find("```text\n").expect("a text block follows") + 8;
    let len = after[start..].find("```").expect("the text block ends");
    let mut out = vec![];
    for line in after[start..start + len].lines() {
        let mut tokens = line.split_whitespace();
        let offset = tokens.next().expect("each line starts with its offset");
        assert_eq!(
            usize::from_str_radix(offset, 16).ok(),
            Some(out.len()),
            "{line:?}"
        );
        out.extend(tokens.map(|t| u8::from_str_radix(t, 16).expect("a hex byte")));
    }
    out
}

/// Prints bytes the way PROTOCOL.md dumps them.
fn hex_dump(bytes: &[u8]) -> String {
    bytes
        .chunks(16)
        .enumerate()
        .map(|(i, c)| {
            let hex: Vec<String> = c.iter().map(|b| format!("{b:02x}")).collect();
            format!("{:04x}  {}\n", i * 16, hex.join(" "))
        })
        .collect()
}

/// The C5 of §18.6's extension example: broker `b-1a2b`, stored time, in the record's own bytes.
fn documented_c5() -> StageRecord {
    let mut r = StageRecord::at(Stage::PullSent, 1_796_129_311_004_043_022);
    r.message_id = Some("01a231a6-491c-76c3-aae6-cb02704bf130".parse().unwrap());
    r.consumer = Some(ClientId::new("billing-1").unwrap());
    r.group = Some(crate::GroupId::new("billing").unwrap());
    r.attempt = Some(1);
    r.stream_seq = Some(6);
    r.broker = Some(crate::ids::BrokerInstance::new("b-1a2b").unwrap());
    r.stored_at = Some(1_796_129_311_002_000_000);
    r
}

#[test]
fn the_documented_extension_example_is_what_the_encoder_writes() {
    let r = documented_c5();
    let batch = encode_stage_batch([&r]);
    // The record alone: after the frame head (4 bytes) and the count (4 bytes).
    let record = &batch[8..];
    let documented = documented_hex("<!-- frame-hex: c5-extension");
    assert_eq!(
        record,
        &documented[..],
        "PROTOCOL.md §18.6 should show:\n{}",
        hex_dump(record)
    );
    // What the prose says of it: stage 8 with the high bit, ext 03, `06 "b-1a2b"` and the
    // stored time's eight bytes at the end.
    assert_eq!(record[0], 0x88);
    assert_eq!(record[1 + 8 + 2], 0x03);
    let tail = &record[record.len() - 15..];
    assert_eq!(tail[0], 6);
    assert_eq!(&tail[1..7], b"b-1a2b");
    assert_eq!(tail[7..], 1_796_129_311_002_000_000u64.to_be_bytes());
    assert_eq!(decode_stage_batch(&batch).unwrap(), vec![r]);
}

#[test]
fn the_documented_sizes_of_the_stage_batch_example_hold() {
    let batch = documented_hex("<!-- frame-hex: stage-batch");
    let records = decode_stage_batch(&batch).unwrap();
    let json = serde_json::to_string(&records[0]).unwrap();
    let claim = format!(
        "({} bytes; the same record in JSON is {}, without a newline)",
        batch.len(),
        json.len()
    );
    assert!(
        PROTOCOL_MD.contains(&claim),
        "PROTOCOL.md §18.6 should say {claim}"
    );
    assert_eq!((batch.len(), json.len()), (69, 146));
    assert!(PROTOCOL_MD.contains(&format!("```json\n{json}\n```")));
}

/// A settle's own records: C6, X1, X2 (failed, with its detail) and C7 of one delivery.
fn delivery_records() -> Vec<StageRecord> {
    let mut x2 = StageRecord::at(Stage::ProcessFinished, 3);
    x2.outcome = Some("failed".into());
    x2.detail = Some("db down ✗".into());
    let mut c7 = StageRecord::at(Stage::PullAckSent, 4);
    c7.outcome = Some("nack".into());
    vec![
        StageRecord::at(Stage::PullReceived, 1),
        StageRecord::at(Stage::ProcessStarted, 2),
        x2,
        c7,
    ]
}

#[test]
fn settles_carrying_their_records_are_version_2_and_round_trip() {
    let mut with = SettleEntry::new("a", SettleKind::Nack);
    with.records = delivery_records();
    let bare = SettleEntry::new("b", SettleKind::Ack);
    let s = SettleBatch {
        entries: vec![with, bare.clone()],
        reports: vec![ReportedRecord {
            record: StageRecord::at(Stage::PullReceived, 9),
            token: "c".into(),
        }],
        reports_invalid: None,
    };
    let bytes = s.encode();
    assert_eq!(&bytes[..4], b"MTS\x02");
    assert_eq!(SettleBatch::decode(&bytes).unwrap(), s);
    // Without records of its own a batch is written as version 1, byte for byte as before.
    let plain = SettleBatch {
        entries: vec![bare],
        ..Default::default()
    };
    let v1 = plain.encode();
    assert_eq!(&v1[..], b"MTS\x01\x00\x01\x00\x00\x00\x01b\x00\x00\x00\x00");
    assert_eq!(SettleBatch::decode(&v1).unwrap(), plain);
}

#[test]
fn a_bad_record_refuses_its_settles_records_only_and_unknown_versions_fail() {
    let mut one = SettleEntry::new("a", SettleKind::Ack);
    one.records = vec![StageRecord::at(Stage::PullReceived, 1)];
    let mut two = SettleEntry::new("b", SettleKind::Ack);
    two.records = delivery_records();
    let mut bytes = SettleBatch {
        entries: vec![one, two],
        ..Default::default()
    }
    .encode()
    .to_vec();
    // The first settle's record: after head (4), count (2), kind, has_delay, token "a" (3),
    // empty reason (2) and the record count (1) comes its stage byte.
    let at = 4 + 2 + 1 + 1 + 3 + 2 + 1;
    assert_eq!(bytes[at], stage_byte(Stage::PullReceived));
    bytes[at] = 50;
    let b = SettleBatch::decode(&Bytes::from(bytes.clone())).unwrap();
    assert!(b.entries[0].records.is_empty());
    assert_eq!(
        b.entries[0].records_invalid.as_deref(),
        Some("record 1: unknown stage byte 50")
    );
    assert_eq!(b.entries[1].records, delivery_records());
    assert_eq!(b.entries[1].records_invalid, None);
    // A truncated record fails the frame; so does a version this code does not know.
    let cut = Bytes::from(bytes[..bytes.len() - 3].to_vec());
    assert!(SettleBatch::decode(&cut).is_err());
    bytes[3] = 3;
    let e = SettleBatch::decode(&Bytes::from(bytes)).unwrap_err();
    assert_eq!(
        (e.offset, e.what.as_str()),
        (3, "unsupported frame version 3")
    );
    // Only settle batches have a version 2.
    let mut upload = UploadBatch::default().encode().to_vec();
    upload[3] = 2;
    assert!(UploadBatch::decode(&Bytes::from(upload)).is_err());
}

#[test]
fn a_group_that_is_not_a_group_name_is_refused_with_an_offset_not_a_panic() {
    let mut r = StageRecord::at(Stage::ProcessStarted, 7);
    r.group = Some(crate::GroupId::new("billing").unwrap());
    let mut bytes = encode_stage_batch(&[r.clone()]).to_vec();
    assert_eq!(decode_stage_batch(&bytes).unwrap(), vec![r]);
    // The same length, a space: the bytes read on, the name breaks the grammar.
    let pos = bytes.windows(7).position(|w| w == b"billing").unwrap();
    bytes[pos + 3] = b' ';
    let e = decode_stage_batch(&bytes).unwrap_err();
    assert!(e.to_string().contains("bil ing"), "{e}");
}
