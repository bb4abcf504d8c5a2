//! The spans msgtrail exports, checked against the semantic conventions without any tool
//! beside the repository: every attribute of every span, span event and link the mapping
//! emits for the fixtures' trajectories is defined — in msgtrail's registry
//! (`semconv/registry.yaml`) or in the official model vendored in `semconv/official/model` —
//! with the type its value has, and not deprecated; every attribute msgtrail's registry
//! defines is emitted by some fixture (so the registry says nothing the exporter never does);
//! every `msgtrail.*` key written in the crate's sources is defined; and each span's kind is
//! the one the messaging conventions give its `messaging.operation.type`.
//!
//! OTel Weaver's own live-check of the same spans is `tests/semconv.rs` (run when Weaver is
//! present: `WEAVER_BIN`).

mod common;

use common::*;
use msgtrail_otel::ServiceSpan;
use opentelemetry::trace::SpanKind;
use opentelemetry::{Array, KeyValue, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The repository root.
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The type a registry gives an attribute, as far as a value can show it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum AttrType {
    String,
    Int,
    Double,
    Boolean,
    StringArray,
    IntArray,
    DoubleArray,
    BooleanArray,
    /// An enum of strings. The official conventions' enums are open (a custom value of low
    /// cardinality is allowed); msgtrail's own are closed: it emits only their members.
    StringEnum {
        members: BTreeSet<String>,
        open: bool,
    },
    IntEnum,
    /// `template[T]`: the key is a prefix (`<prefix>.<anything>`).
    Template(Box<AttrType>),
}

#[derive(Debug, Clone)]
struct Definition {
    ty: AttrType,
    deprecated: bool,
    /// The file that defines it (for messages).
    file: String,
}

fn scalar_type(name: &str) -> Option<AttrType> {
    Some(match name {
        "string" => AttrType::String,
        "int" => AttrType::Int,
        "double" => AttrType::Double,
        "boolean" => AttrType::Boolean,
        "string[]" => AttrType::StringArray,
        "int[]" => AttrType::IntArray,
        "double[]" => AttrType::DoubleArray,
        "boolean[]" => AttrType::BooleanArray,
        "any" => return None,
        _ => {
            let inner = name.strip_prefix("template[")?.strip_suffix(']')?;
            AttrType::Template(Box::new(scalar_type(inner)?))
        }
    })
}

fn attr_type(ty: &serde_norway::Value) -> Option<AttrType> {
    match ty {
        serde_norway::Value::String(s) => scalar_type(s),
        serde_norway::Value::Mapping(m) => {
            let members = m.get("members")?.as_sequence()?;
            let mut strings = BTreeSet::new();
            for member in members {
                match member.get("value")? {
                    serde_norway::Value::String(s) => {
                        strings.insert(s.clone());
                    }
                    serde_norway::Value::Number(_) => return Some(AttrType::IntEnum),
                    _ => return None,
                }
            }
            Some(AttrType::StringEnum {
                members: strings,
                open: true,
            })
        }
        _ => None,
    }
}

/// Every attribute definition of one registry file: `groups[].attributes[]` with `id`
/// (Weaver's first file format) and top-level `attributes[]` with `key` (`definition/2`).
/// References (`ref:`) define nothing.
fn definitions_in(path: &Path, out: &mut BTreeMap<String, Definition>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_norway::Value =
        serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut lists: Vec<&serde_norway::Value> = Vec::new();
    if let Some(groups) = doc.get("groups").and_then(|g| g.as_sequence()) {
        lists.extend(groups.iter().filter_map(|g| g.get("attributes")));
    }
    if let Some(attrs) = doc.get("attributes") {
        lists.push(attrs);
    }
    for attr in lists.into_iter().filter_map(|l| l.as_sequence()).flatten() {
        let Some(id) = attr
            .get("id")
            .or_else(|| attr.get("key"))
            .and_then(|v| v.as_str())
        else {
            continue;
        };
        let Some(ty) = attr.get("type").and_then(attr_type) else {
            continue;
        };
        out.insert(
            id.to_owned(),
            Definition {
                ty,
                deprecated: attr.get("deprecated").is_some(),
                file: path
                    .strip_prefix(root())
                    .unwrap_or(path)
                    .display()
                    .to_string(),
            },
        );
    }
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml")
            && path.file_name().is_some_and(|n| n != "manifest.yaml")
        {
            out.push(path);
        }
    }
}

/// msgtrail's registry alone, and msgtrail's registry over the official model.
fn registries() -> (BTreeMap<String, Definition>, BTreeMap<String, Definition>) {
    let own_file = root().join("semconv/registry.yaml");
    let mut own = BTreeMap::new();
    definitions_in(&own_file, &mut own);
    for d in own.values_mut() {
        if let AttrType::StringEnum { open, .. } = &mut d.ty {
            *open = false;
        }
    }
    let mut files = Vec::new();
    let official = root().join("semconv/official/model");
    assert!(
        official.is_dir(),
        "the official model is missing at {} (scripts/refresh-semconv.sh restores it)",
        official.display()
    );
    yaml_files(&official, &mut files);
    let mut all = BTreeMap::new();
    for f in &files {
        definitions_in(f, &mut all);
    }
    assert!(
        all.contains_key("messaging.message.id"),
        "the official model has no messaging.message.id: {} files read",
        files.len()
    );
    for (k, d) in &own {
        assert!(
            !all.contains_key(k),
            "{k} is defined by msgtrail's registry and the official model"
        );
        all.insert(k.clone(), d.clone());
    }
    (own, all)
}

/// Finds a key's definition: itself, or a template it is an instance of.
fn lookup<'a>(defs: &'a BTreeMap<String, Definition>, key: &str) -> Option<&'a Definition> {
    defs.get(key).or_else(|| {
        defs.iter()
            .find(|(k, d)| {
                matches!(d.ty, AttrType::Template(_))
                    && key.len() > k.len() + 1
                    && key.starts_with(k.as_str())
                    && key.as_bytes()[k.len()] == b'.'
            })
            .map(|(_, d)| d)
    })
}

/// Whether a value is of a defined type (the `what` names it in failures).
fn type_matches(ty: &AttrType, value: &Value) -> bool {
    match (ty, value) {
        (AttrType::String, Value::String(_))
        | (AttrType::Int, Value::I64(_))
        | (AttrType::Double, Value::F64(_))
        | (AttrType::Boolean, Value::Bool(_))
        | (AttrType::IntEnum, Value::I64(_))
        | (AttrType::StringArray, Value::Array(Array::String(_)))
        | (AttrType::IntArray, Value::Array(Array::I64(_)))
        | (AttrType::DoubleArray, Value::Array(Array::F64(_)))
        | (AttrType::BooleanArray, Value::Array(Array::Bool(_))) => true,
        (AttrType::StringEnum { members, open }, Value::String(s)) => {
            *open || members.contains(s.as_str())
        }
        (AttrType::Template(inner), v) => type_matches(inner, v),
        _ => false,
    }
}

/// Every attribute of a span with where it was found: the span, its events, its links.
fn attributes(span: &ServiceSpan) -> Vec<(String, &KeyValue)> {
    let name = &span.span.name;
    let mut out: Vec<(String, &KeyValue)> = span
        .span
        .attributes
        .iter()
        .map(|kv| (format!("span {name:?}"), kv))
        .collect();
    for e in span.span.events.iter() {
        out.extend(
            e.attributes
                .iter()
                .map(|kv| (format!("event {:?} of span {name:?}", e.name), kv)),
        );
    }
    for l in span.span.links.iter() {
        out.extend(
            l.attributes
                .iter()
                .map(|kv| (format!("a link of span {name:?}"), kv)),
        );
    }
    out
}

#[test]
fn every_exported_attribute_is_defined_with_its_type() {
    let (_, defs) = registries();
    let spans = every_fixture_spans();
    assert!(spans.len() >= 10, "too few spans: {}", spans.len());
    let mut problems = Vec::new();
    for span in &spans {
        for (place, kv) in attributes(span) {
            let key = kv.key.as_str();
            match lookup(&defs, key) {
                None => problems.push(format!("{key} (on {place}) is defined nowhere")),
                Some(d) if d.deprecated => {
                    problems.push(format!("{key} (on {place}) is deprecated in {}", d.file))
                }
                Some(d) if !type_matches(&d.ty, &kv.value) => problems.push(format!(
                    "{key} (on {place}) = {:?} is not of its type {:?} ({})",
                    kv.value, d.ty, d.file
                )),
                Some(_) => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_attribute_of_the_registry_is_emitted() {
    let (own, _) = registries();
    let emitted: BTreeSet<String> = every_fixture_spans()
        .iter()
        .flat_map(|s| {
            attributes(s)
                .into_iter()
                .map(|(_, kv)| kv.key.as_str().to_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    let never: Vec<&String> = own.keys().filter(|k| !emitted.contains(*k)).collect();
    assert!(
        never.is_empty(),
        "defined in semconv/registry.yaml but never emitted by a fixture: {never:?}"
    );
}

/// The crate's sources name no `msgtrail.*` attribute its registry lacks (a key a fixture
/// does not reach is still caught here).
#[test]
fn every_msgtrail_key_in_the_sources_is_defined() {
    let (own, _) = registries();
    let src = root().join("crates/otel/src");
    let mut files = Vec::new();
    fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                rust_files(&p, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                out.push(p);
            }
        }
    }
    rust_files(&src, &mut files);
    let mut missing = BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, _) in text.match_indices("\"msgtrail.") {
            let rest = &text[i + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '_'))
                .unwrap_or(rest.len());
            let key = &rest[..end];
            // Keys that end in a dot are prefixes, and tests may name keys on purpose.
            if key.ends_with('.') || rest[end..].starts_with(' ') {
                continue;
            }
            if !own.contains_key(key) {
                missing.insert(format!(
                    "{key} ({})",
                    f.strip_prefix(root()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "msgtrail.* keys in the sources that semconv/registry.yaml does not define: {missing:?}"
    );
}

/// The messaging conventions' span kinds by operation type ("Span kind" in the messaging
/// spans document of the semantic conventions): create and send are PRODUCER (send may be
/// CLIENT when it is not the creation context), receive and settle are CLIENT, process is
/// CONSUMER.
fn kinds_for(operation_type: &str) -> &'static [SpanKind] {
    match operation_type {
        "create" => &[SpanKind::Producer],
        "send" => &[SpanKind::Producer, SpanKind::Client],
        "receive" | "settle" => &[SpanKind::Client],
        "process" => &[SpanKind::Consumer],
        _ => &[],
    }
}

#[test]
fn span_kinds_match_the_messaging_operation_types() {
    let spans = every_fixture_spans();
    let mut seen = BTreeSet::new();
    for span in &spans {
        let op = span
            .span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "messaging.operation.type")
            .unwrap_or_else(|| panic!("span {:?} has no operation type", span.span.name))
            .value
            .as_str()
            .into_owned();
        let allowed = kinds_for(&op);
        assert!(
            allowed.contains(&span.span.span_kind),
            "span {:?}: operation type {op} with kind {:?}, the conventions give {allowed:?}",
            span.span.name,
            span.span.span_kind
        );
        seen.insert(op);
    }
    assert!(
        seen.contains("send") && seen.contains("process"),
        "fixtures should cover send and process: {seen:?}"
    );
}

/// The checker itself refuses what it must: an undefined key, a wrong type, a value outside
/// an enum.
#[test]
fn the_check_refuses_undefined_keys_and_wrong_types() {
    let (_, defs) = registries();
    assert!(lookup(&defs, "msgtrail.no.such.key").is_none());
    let id = lookup(&defs, "messaging.message.id").unwrap();
    assert!(type_matches(&id.ty, &Value::from("x")));
    assert!(!type_matches(&id.ty, &Value::I64(1)));
    let status = lookup(&defs, "msgtrail.hop.status").unwrap();
    assert!(type_matches(&status.ty, &Value::from("ok")));
    assert!(!type_matches(&status.ty, &Value::from("fine")));
    let attempt = lookup(&defs, "msgtrail.attempt").unwrap();
    assert!(!type_matches(&attempt.ty, &Value::from("1")));
}
