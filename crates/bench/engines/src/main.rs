//! `engine_once <engine> <messages> [records-per-transaction]`: the listener's write
//! pattern on one storage engine, for `valgrind --tool=callgrind` (instructions per record)
//! and for the bytes it writes (the process's `wchar` from `/proc/self/io`: every byte passed
//! to `write`/`pwrite`, journal and compaction included) and leaves on disk.
//!
//! ## The pattern
//! Ten records per message (~25 B each, the listener's compact form; a few distinct fields
//! vary per record, the rest repeats as in real records), 17-byte message keys ordered by
//! time (UUIDv7). A message's records arrive over three transactions, as a pipeline's do
//! (upload and store; delivery; processing and ack), interleaved with other messages: a
//! transaction carries records 0–3 of one block of messages, 4–6 of the block before and
//! 7–9 of the one before that. Each transaction is committed durably (fsync) before the next.
//!
//! ## The engines
//! - `redb-today`: what the listener's store does now (crates/listener/src/store): per touched
//!   message, read its records value, append, write it back; write its summary (~128 B); move
//!   its state-index row; at first touch, a topic-index, a time-index and a request row.
//! - `redb-append`: the v3 shape on redb: the records a transaction brings a message inserted
//!   once, as one value, under (message key, arrival sequence); the per-message state (64 B) written when it changes (once per transaction
//!   that touches the message); time and topic index rows once per message, keyed by a
//!   one-hour partition first.
//! - `fjall-append`: the same v3 shape on fjall (LSM, one keyspace per table, one atomic
//!   write batch per transaction, `persist(SyncAll)` after it).

use redb::ReadableTable;
use std::io::Read;
use std::path::Path;

/// Records per message.
const RECORDS: usize = 10;
/// Bytes of a summary row as the listener writes it today (10-record messages, BENCHMARKS.md).
const SUMMARY_BYTES: usize = 128;
/// Bytes of the v3 per-message state row (fixed fields).
const STATE_BYTES: usize = 64;
/// Which records of a message arrive in which of its three transactions.
const PHASES: [std::ops::Range<usize>; 3] = [0..4, 4..7, 7..10];

/// A message's key: a tag byte and 16 bytes of a time-ordered ID.
fn message_key(i: u64) -> [u8; 17] {
    let mut k = [0u8; 17];
    k[0] = 1;
    // UUIDv7-like: milliseconds first, then a counter and noise.
    k[1..9].copy_from_slice(&(1_700_000_000_000u64 + i / 50).to_be_bytes());
    k[9..17].copy_from_slice(&(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_be_bytes());
    k
}

/// Record `r` of message `i`, in a compact form of the listener's size: stage code, time
/// delta, group and consumer names, attempt, an outcome on the last.
fn record(i: u64, r: usize, out: &mut Vec<u8>) {
    out.clear();
    out.push(r as u8);
    out.extend_from_slice(&((i * 7919 + r as u64 * 131) % 100_000).to_le_bytes()[..4]);
    out.extend_from_slice(b"\x07billing\x03b-1");
    out.push(1);
    if r.is_multiple_of(3) {
        out.extend_from_slice(b"\x06broker");
    } else {
        out.extend_from_slice(&i.to_le_bytes()[..3]);
        out.extend_from_slice(b"\x03ack");
    }
}

/// What a run wrote.
#[derive(Debug, Default)]
struct Counts {
    records: u64,
    record_bytes: u64,
    transactions: u64,
}

/// One transaction's work: (message index, which of its three phases).
fn transaction(block: u64, per_block: u64, messages: u64) -> Vec<(u64, usize)> {
    let mut work = Vec::new();
    for (phase, back) in [(0usize, 0u64), (1, 1), (2, 2)] {
        let Some(b) = block.checked_sub(back) else {
            continue;
        };
        for i in b * per_block..((b + 1) * per_block).min(messages) {
            work.push((i, phase));
        }
    }
    work
}

/// The engine under test.
trait Engine {
    /// Writes one transaction's records and commits it durably.
    fn commit(&mut self, work: &[(u64, usize)], counts: &mut Counts);
    /// Closes the engine, waiting for its background work.
    fn close(self: Box<Self>);
}

struct RedbToday {
    db: redb::Database,
}

const RECORDS_T: redb::TableDefinition<'static, &[u8], &[u8]> =
    redb::TableDefinition::new("records");
const SUMMARIES_T: redb::TableDefinition<'static, &[u8], &[u8]> =
    redb::TableDefinition::new("summaries");
const BY_STATE_T: redb::TableDefinition<'static, (u8, u64, &[u8]), ()> =
    redb::TableDefinition::new("by_state");
const BY_TOPIC_T: redb::TableDefinition<'static, (&str, u64, &[u8]), ()> =
    redb::TableDefinition::new("by_topic");
const BY_TIME_T: redb::TableDefinition<'static, (u64, &[u8]), ()> =
    redb::TableDefinition::new("by_time");
const REQUESTS_T: redb::TableDefinition<'static, &[u8], &[u8]> =
    redb::TableDefinition::new("requests");
const RECORDS_V3: redb::TableDefinition<'static, &[u8], &[u8]> =
    redb::TableDefinition::new("records_v3");
const STATES_V3: redb::TableDefinition<'static, &[u8], &[u8]> =
    redb::TableDefinition::new("states_v3");
const INDEX_V3: redb::TableDefinition<'static, &[u8], ()> = redb::TableDefinition::new("index_v3");

fn at(i: u64) -> u64 {
    1_700_000_000_000_000_000 + i * 20_000
}

impl Engine for RedbToday {
    fn commit(&mut self, work: &[(u64, usize)], counts: &mut Counts) {
        let tx = self.db.begin_write().unwrap();
        {
            let mut records = tx.open_table(RECORDS_T).unwrap();
            let mut summaries = tx.open_table(SUMMARIES_T).unwrap();
            let mut by_state = tx.open_table(BY_STATE_T).unwrap();
            let mut by_topic = tx.open_table(BY_TOPIC_T).unwrap();
            let mut by_time = tx.open_table(BY_TIME_T).unwrap();
            let mut requests = tx.open_table(REQUESTS_T).unwrap();
            let mut rec = Vec::new();
            let summary = [0x5au8; SUMMARY_BYTES];
            for &(i, phase) in work {
                let key = message_key(i);
                let mut value = records
                    .get(key.as_slice())
                    .unwrap()
                    .map(|v| v.value().to_vec())
                    .unwrap_or_default();
                for r in PHASES[phase].clone() {
                    record(i, r, &mut rec);
                    value.push(rec.len() as u8);
                    value.extend_from_slice(&rec);
                    counts.records += 1;
                    counts.record_bytes += rec.len() as u64;
                }
                records.insert(key.as_slice(), value.as_slice()).unwrap();
                summaries
                    .insert(key.as_slice(), summary.as_slice())
                    .unwrap();
                let t = at(i);
                if phase > 0 {
                    by_state
                        .remove((phase as u8 - 1, t + phase as u64 - 1, key.as_slice()))
                        .unwrap();
                } else {
                    by_topic
                        .insert(("orders.eu", t, key.as_slice()), ())
                        .unwrap();
                    by_time.insert((t, key.as_slice()), ()).unwrap();
                    requests.insert(&key[1..], &key[..]).unwrap();
                }
                by_state
                    .insert((phase as u8, t + phase as u64, key.as_slice()), ())
                    .unwrap();
            }
        }
        tx.commit().unwrap();
        counts.transactions += 1;
    }

    fn close(self: Box<Self>) {}
}

struct RedbAppend {
    db: redb::Database,
}

/// The records of message `i` that arrive in its transaction `phase`, as one value
/// (length-prefixed records, as they came in the stage batches).
fn arrivals(i: u64, phase: usize, rec: &mut Vec<u8>, value: &mut Vec<u8>, counts: &mut Counts) {
    value.clear();
    for r in PHASES[phase].clone() {
        record(i, r, rec);
        value.push(rec.len() as u8);
        value.extend_from_slice(rec);
        counts.records += 1;
        counts.record_bytes += rec.len() as u64;
    }
}

/// The v3 records key: message key, then the arrival's sequence in the message (records
/// appended once per transaction that brings the message some; one range scan per message).
fn record_key(key: &[u8; 17], r: usize) -> [u8; 19] {
    let mut k = [0u8; 19];
    k[..17].copy_from_slice(key);
    k[17..].copy_from_slice(&(r as u16).to_be_bytes());
    k
}

/// A v3 index key: one-hour partition, index kind, time, message key.
fn index_key(kind: u8, t: u64, key: &[u8; 17]) -> Vec<u8> {
    let mut k = Vec::with_capacity(4 + 1 + 8 + 17 + 10);
    k.extend_from_slice(&((t / 3_600_000_000_000) as u32).to_be_bytes());
    k.push(kind);
    if kind == 1 {
        k.extend_from_slice(b"orders.eu\0");
    }
    k.extend_from_slice(&t.to_be_bytes());
    k.extend_from_slice(key);
    k
}

impl Engine for RedbAppend {
    fn commit(&mut self, work: &[(u64, usize)], counts: &mut Counts) {
        let tx = self.db.begin_write().unwrap();
        {
            let mut records = tx.open_table(RECORDS_V3).unwrap();
            let mut states = tx.open_table(STATES_V3).unwrap();
            let mut index = tx.open_table(INDEX_V3).unwrap();
            let mut rec = Vec::new();
            let state = [0x33u8; STATE_BYTES];
            let mut value = Vec::new();
            for &(i, phase) in work {
                let key = message_key(i);
                arrivals(i, phase, &mut rec, &mut value, counts);
                records
                    .insert(record_key(&key, phase).as_slice(), value.as_slice())
                    .unwrap();
                states.insert(key.as_slice(), state.as_slice()).unwrap();
                if phase == 0 {
                    index
                        .insert(index_key(0, at(i), &key).as_slice(), ())
                        .unwrap();
                    index
                        .insert(index_key(1, at(i), &key).as_slice(), ())
                        .unwrap();
                }
            }
        }
        tx.commit().unwrap();
        counts.transactions += 1;
    }

    fn close(self: Box<Self>) {}
}

struct FjallAppend {
    db: fjall::Database,
    records: fjall::Keyspace,
    states: fjall::Keyspace,
    index: fjall::Keyspace,
}

impl Engine for FjallAppend {
    fn commit(&mut self, work: &[(u64, usize)], counts: &mut Counts) {
        let mut batch = self.db.batch();
        let mut rec = Vec::new();
        let state = [0x33u8; STATE_BYTES];
        let mut value = Vec::new();
        for &(i, phase) in work {
            let key = message_key(i);
            arrivals(i, phase, &mut rec, &mut value, counts);
            batch.insert(&self.records, record_key(&key, phase), value.as_slice());
            batch.insert(&self.states, key, state);
            if phase == 0 {
                batch.insert(&self.index, index_key(0, at(i), &key), []);
                batch.insert(&self.index, index_key(1, at(i), &key), []);
            }
        }
        batch.commit().unwrap();
        self.db.persist(fjall::PersistMode::SyncAll).unwrap();
        counts.transactions += 1;
    }

    fn close(self: Box<Self>) {
        let FjallAppend {
            db,
            records,
            states,
            index,
        } = *self;
        // Flush what the memtables hold, as a long run would have by now.
        for ks in [&records, &states, &index] {
            ks.rotate_memtable_and_wait().unwrap();
        }
        drop((records, states, index));
        drop(db);
    }
}

/// `wchar` of this process: bytes passed to write calls so far.
fn written() -> u64 {
    let mut s = String::new();
    std::fs::File::open("/proc/self/io")
        .and_then(|mut f| f.read_to_string(&mut s))
        .expect("/proc/self/io (Linux)");
    s.lines()
        .find_map(|l| l.strip_prefix("wchar: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// Bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let m = e.metadata().unwrap();
        // Allocated blocks, not the apparent size: fjall preallocates its journal sparsely.
        total += if m.is_dir() {
            disk_bytes(&e.path())
        } else {
            std::os::unix::fs::MetadataExt::blocks(&m) * 512
        };
    }
    total
}

fn open(engine: &str, dir: &Path) -> Box<dyn Engine> {
    match engine {
        "redb-today" => Box::new(RedbToday {
            db: redb::Database::create(dir.join("store.redb")).unwrap(),
        }),
        "redb-append" => Box::new(RedbAppend {
            db: redb::Database::create(dir.join("store.redb")).unwrap(),
        }),
        "fjall-append" => {
            let db = fjall::Database::builder(dir.join("fjall"))
                .cache_size(64 << 20)
                .open()
                .unwrap();
            let ks = |name: &str| {
                db.keyspace(name, fjall::KeyspaceCreateOptions::default)
                    .unwrap()
            };
            Box::new(FjallAppend {
                records: ks("records"),
                states: ks("states"),
                index: ks("index"),
                db,
            })
        }
        other => {
            eprintln!("unknown engine {other}: redb-today, redb-append or fjall-append");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!(
            "usage: engine_once <redb-today|redb-append|fjall-append> <messages> [records-per-transaction]"
        );
        std::process::exit(2);
    }
    let messages: u64 = args[2].parse().expect("messages: a number");
    let per_tx: u64 = args.get(3).map_or(6000, |v| v.parse().expect("a number"));
    let per_block = (per_tx / RECORDS as u64).max(1);
    let dir =
        tempfile::tempdir_in(std::env::var("ENGINE_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let before = written();
    let mut engine = open(&args[1], dir.path());
    let mut counts = Counts::default();
    let blocks = messages.div_ceil(per_block);
    for block in 0..blocks + 2 {
        let work = transaction(block, per_block, messages);
        if !work.is_empty() {
            engine.commit(&work, &mut counts);
        }
    }
    engine.close();
    let wrote = written() - before;
    let disk = disk_bytes(dir.path());
    // fjall's sorted tables alone (its journal is dropped once its memtables are flushed).
    let tables = dir.path().join("fjall/keyspaces");
    let tables = if tables.exists() {
        disk_bytes(&tables)
    } else {
        disk
    };
    if std::env::var_os("ENGINE_KEEP").is_some() {
        eprintln!("kept {}", dir.keep().display());
        return;
    }
    println!(
        "engine={} messages={} records={} transactions={} record_bytes={} written_bytes={} write_amplification={:.2} disk_bytes={} disk_bytes_per_message={:.0} table_bytes_per_message={:.0}",
        args[1],
        messages,
        counts.records,
        counts.transactions,
        counts.record_bytes,
        wrote,
        wrote as f64 / counts.record_bytes as f64,
        disk,
        disk as f64 / messages as f64,
        tables as f64 / messages as f64,
    );
}
