//! The CLI shows and applies the configuration types' defaults: an option left out gives the
//! same value as `BrokerConfig::default()` / `ListenerConfig::default()`, and `--help` says so.

use crate::{Cli, Command};
use clap::{CommandFactory, Parser};
use msgtrail_broker::BrokerConfig;
use msgtrail_listener::ListenerConfig;
use std::time::Duration;

fn help_of(sub: &str) -> String {
    let mut cli = Cli::command();
    cli.find_subcommand_mut(sub)
        .expect("subcommand exists")
        .render_long_help()
        .to_string()
}

/// Whether `--option`'s paragraph of the help shows `default` (quoted when it has a space).
fn shows(help: &str, option: &str, default: impl std::fmt::Display) {
    let default = default.to_string();
    let default = if default.contains(' ') {
        format!("[default: {default:?}]")
    } else {
        format!("[default: {default}]")
    };
    let at = help
        .find(&format!("--{option} "))
        .unwrap_or_else(|| panic!("--{option} in the help:\n{help}"));
    let rest = &help[at..];
    let next = rest[2..].find("\n  -").map_or(rest.len(), |i| i + 2);
    assert!(
        rest[..next].contains(&default),
        "--{option} should show {default}:\n{}",
        &rest[..next]
    );
}

#[test]
fn broker_options_default_to_the_broker_config() {
    let cli = Cli::try_parse_from(["msgtrail", "broker", "--clients", "clients.json"]).unwrap();
    let Command::Broker(a) = cli.command else {
        panic!("parsed as broker")
    };
    let d = BrokerConfig::default();
    assert_eq!(a.replicas, d.replicas);
    assert_eq!(a.max_payload, d.max_payload);
    assert_eq!(Duration::from(a.ack_wait), d.ack_wait);
    assert_eq!(a.max_deliver, d.max_deliver);
    assert_eq!(Duration::from(a.dedup_window), d.dedup_window);
    assert_eq!(a.record_payload_bytes, d.record_payload_bytes);
    assert_eq!(a.max_concurrent_requests, d.max_concurrent_requests);
    let help = help_of("broker");
    shows(&help, "ack-wait", humantime::format_duration(d.ack_wait));
    shows(
        &help,
        "dedup-window",
        humantime::format_duration(d.dedup_window),
    );
    shows(&help, "max-payload", d.max_payload);
    shows(&help, "max-deliver", d.max_deliver);
    shows(&help, "replicas", d.replicas);
}

#[test]
fn listener_options_default_to_the_listener_config() {
    let cli = Cli::try_parse_from(["msgtrail", "listener"]).unwrap();
    let Command::Listener(a) = cli.command else {
        panic!("parsed as listener")
    };
    let got = a.config(msgtrail_nats::NatsOptions::default());
    let d = ListenerConfig::default();
    assert_eq!(got.data_dir, d.data_dir);
    assert_eq!(got.http_addr, d.http_addr);
    assert_eq!(got.durable_name, d.durable_name);
    assert_eq!(got.batch_size, d.batch_size);
    assert_eq!(got.batch_bytes, d.batch_bytes);
    assert_eq!(got.payload_head_bytes, d.payload_head_bytes);
    assert_eq!(got.cache_messages, d.cache_messages);
    assert_eq!(got.store_cache_bytes, d.store_cache_bytes);
    assert_eq!(got.deadlines, d.deadlines);
    assert_eq!(got.retention_max_age, d.retention_max_age);
    assert_eq!(got.retention_max_bytes, d.retention_max_bytes);
    assert_eq!(got.stats_window, d.stats_window);
    assert_eq!(got.ack_wait, d.ack_wait);
    assert_eq!(got.store_evidence, d.store_evidence);
    let help = help_of("listener");
    let retention = d.retention_max_age.expect("kept 7 days by default");
    shows(
        &help,
        "retention-max-age",
        humantime::format_duration(retention),
    );
    let size = bytesize::ByteSize(d.retention_max_bytes.expect("1 GiB by default"));
    shows(&help, "retention-max-size", size);
    shows(
        &help,
        "store-cache",
        bytesize::ByteSize(d.store_cache_bytes as u64),
    );
    shows(
        &help,
        "stats-window",
        humantime::format_duration(d.stats_window),
    );
    shows(&help, "ack-wait", humantime::format_duration(d.ack_wait));
    shows(&help, "batch-size", d.batch_size);
    shows(
        &help,
        "batch-bytes",
        bytesize::ByteSize(d.batch_bytes as u64),
    );
    shows(&help, "data-dir", d.data_dir.display());
    let stored = Duration::from_millis(d.deadlines.stored_ms);
    shows(&help, "deadline-stored", humantime::format_duration(stored));
}
