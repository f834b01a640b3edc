//! Field selectors on any field: kube's grammar case by case (written down from
//! `fields/selector.go`: operators, escapes, empty terms and values, no trimming, the error kube
//! reports first), hostile inputs (deep paths, a MiB of selector, unterminated escapes), how
//! values read (strings, numbers, bools, missing, objects, labels with dots), the member's own
//! reading of the fields it serves, and a property: on random objects the selector selects
//! exactly what a plain filter over `serde_json::Value::pointer` selects.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::super::member::{member_field, member_supports, MemberField};
use super::*;

fn sel(text: &str) -> AnyFieldSelector {
    parse_any(text).unwrap_or_else(|e| panic!("{text:?} refused: {e:?}"))
}

fn refused(text: &str) -> String {
    match parse_any(text) {
        Ok(selector) => panic!("{text:?} accepted as {selector:?}"),
        Err(Refused(message)) => message,
    }
}

fn selects(text: &str, object: &Value) -> bool {
    sel(text).matches(Reading::Json, object)
}

fn pod() -> Value {
    json!({
        "metadata": {
            "name": "web-1", "namespace": "prod",
            "labels": {"app.kubernetes.io/name": "web", "tier": "front"},
            "annotations": {"example.com/owner": "team a", "note": "x=y,z"}
        },
        "spec": {
            "nodeName": "node-1", "replicas": 3, "paused": false, "ratio": 1.5,
            "containers": [{"name": "main", "image": "busybox"}, {"name": "side", "image": "envoy"}],
            "empty": null
        },
        "status": {"phase": "Running", "podIP": "10.0.0.7"}
    })
}

#[test]
fn kubes_grammar_operators_and_empty_terms() {
    let pod = pod();
    // An empty selector, and empty terms, select everything.
    for everything in [
        "",
        ",",
        ",,,",
        "status.phase=Running,",
        ",status.phase=Running",
    ] {
        assert!(selects(everything, &pod), "{everything:?}");
    }
    assert!(sel("").is_everything());
    assert!(sel(",,").is_everything());
    assert!(selects("status.phase=Running,,spec.nodeName=node-1", &pod));
    assert!(!selects("status.phase=Running,,spec.nodeName=node-2", &pod));
    // `=` and `==` are the same; `!=` is the negation.
    assert!(selects("status.phase==Running", &pod));
    assert!(!selects("status.phase!=Running", &pod));
    assert!(selects("status.phase!=Pending", &pod));
    // The empty value: a missing field reads as empty.
    assert!(selects("spec.schedulerName=", &pod));
    assert!(!selects("spec.nodeName=", &pod));
    assert!(selects("spec.nodeName!=", &pod));
    assert!(selects("spec.empty=", &pod), "null reads as empty");
    // The first operator from the left cuts the term: `!` elsewhere is text.
    assert!(selects("metadata.name=web-1", &pod));
    assert!(!selects("metadata.name=!web-1", &pod));
    assert_eq!(sel("a!b=c").paths().next().unwrap().as_str(), "a!b");
    // Nothing is trimmed: ` status.phase` is another field (the key ` status`).
    assert!(!selects(" status.phase=Running", &pod));
    assert!(!selects("status.phase= Running", &pod));
    assert!(selects("status.phase!= Running", &pod));
}

#[test]
fn kubes_escapes_and_its_errors() {
    let pod = pod();
    assert!(selects(r"metadata.annotations.note=x\=y\,z", &pod));
    let o = json!({"v": r"a\b,c=d"});
    assert!(selects(r"v=a\\b\,c\=d", &o));
    for (text, message) in [
        (
            "status.phase",
            "invalid selector: 'status.phase'; can't understand 'status.phase'",
        ),
        ("a=b,c", "invalid selector: 'a=b,c'; can't understand 'c'"),
        // kube visits the terms sorted: `a` is reported before `z`.
        ("z,a", "invalid selector: 'z,a'; can't understand 'a'"),
        // `==` is taken before `=`, so `===` leaves a bare `=` in the value (Go prints the rune's number).
        (
            "a===b",
            "invalid field selector: unescaped character in value: 61",
        ),
        (
            "a!==b",
            "invalid field selector: unescaped character in value: 61",
        ),
        (
            "a=b=c",
            "invalid field selector: unescaped character in value: 61",
        ),
        (
            "a=b!=c",
            "invalid field selector: unescaped character in value: 61",
        ),
        (
            r"a=b\",
            r"invalid field selector: invalid escape sequence: \",
        ),
        (
            r"a=\x",
            r"invalid field selector: invalid escape sequence: \x",
        ),
        (
            "a=\\\u{e9}",
            "invalid field selector: invalid escape sequence: \\\u{e9}",
        ),
        // An escaped `=` in the field still cuts the term there.
        (
            r"a\=b=c",
            "invalid field selector: unescaped character in value: 61",
        ),
    ] {
        assert_eq!(refused(text), message, "{text:?}");
    }
    // A backslash before a comma keeps the comma in the term (in a value, the comma itself).
    assert!(selects(
        r"metadata.annotations.note=x\=y\,z,status.phase=Running",
        &pod
    ));
}

#[test]
fn paths_and_how_values_read() {
    let pod = pod();
    // Numbers and bools as their JSON text.
    assert!(selects("spec.replicas=3", &pod));
    assert!(selects("spec.paused=false", &pod));
    assert!(selects("spec.ratio=1.5", &pod));
    assert!(!selects("spec.replicas=03", &pod));
    // Objects and arrays equal no value, not even the empty one.
    assert!(!selects("spec=", &pod));
    assert!(selects("spec!=", &pod));
    assert!(!selects("spec.containers=busybox", &pod));
    assert!(selects("spec.containers!=busybox", &pod));
    // Array elements by decimal index; no sign, no leading zero.
    assert!(selects("spec.containers.1.image=envoy", &pod));
    assert!(selects("spec.containers.01.image=", &pod));
    assert!(selects("spec.containers.+1.image=", &pod));
    assert!(selects("spec.containers.9.image=", &pod));
    // Through a scalar: missing.
    assert!(selects("status.phase.x=", &pod));
    // Labels and annotations: the rest of the path is one key, dots and all.
    assert!(selects("metadata.labels.app.kubernetes.io/name=web", &pod));
    assert!(selects(
        r"metadata.labels.app\.kubernetes\.io/name=web",
        &pod
    ));
    assert!(selects(
        "metadata.annotations.example.com/owner=team a",
        &pod
    ));
    assert!(selects("metadata.labels.tier!=back", &pod));
    // Elsewhere `\.` is a dot inside a key.
    let dotted = json!({"data": {"app.properties": "k=v", "a": {"properties": "no"}}});
    assert!(selects(r"data.app\.properties=k\=v", &dotted));
    assert!(selects(r"data.a.properties=no", &dotted));
    // Unicode anywhere.
    let unicode = json!({"metadata": {"annotations": {"ключ": "значение ✓"}}});
    assert!(selects("metadata.annotations.ключ=значение ✓", &unicode));
    // Paths the any-field reading refuses (kube's grammar reads them; no member serves them).
    for bad in ["=x", ".a=x", "a.=x", "a..b=x", r"a\x=y", "a\\=x"] {
        assert!(refused(bad).starts_with("invalid field path"), "{bad:?}");
    }
}

#[test]
fn hostile_sizes_stay_linear_and_refusals_never_panic() {
    // Deep paths: up to MAX_DEPTH keys.
    let deep = vec!["a"; MAX_DEPTH].join(".");
    assert!(selects(&format!("{deep}="), &json!({})));
    let deeper = vec!["a"; MAX_DEPTH + 1].join(".");
    assert!(refused(&format!("{deeper}=")).contains("too deep"));
    // A MiB-long value, a MiB of terms, a MiB of escapes.
    let long = "v".repeat(1 << 20);
    assert!(selects(&format!("s={long}"), &json!({ "s": long })));
    let terms = "a=b,".repeat((1 << 20) / 4);
    assert!(selects(&terms, &json!({"a": "b"})));
    assert!(!selects(&terms, &json!({"a": "c"})));
    let escapes = format!("a={}", r"\\".repeat(1 << 19));
    assert!(selects(&escapes, &json!({ "a": "\\".repeat(1 << 19) })));
    assert!(refused(&format!("{escapes}\\")).ends_with("sequence: \\"));
    let many_dots = ".".repeat(1 << 20);
    assert!(refused(&format!("{many_dots}=x")).starts_with("invalid field path"));
    let commas = ",".repeat(1 << 20);
    assert!(sel(&commas).is_everything());
}

#[test]
fn the_fast_path_and_read_values_agree_with_the_object() {
    let pod = pod();
    let fast = sel("metadata.name=web-1,metadata.namespace!=dev")
        .metadata_only()
        .unwrap();
    assert!(fast.matches("prod", "web-1"));
    assert!(!fast.matches("dev", "web-1"));
    assert!(sel("metadata.name=a,status.phase=Running")
        .metadata_only()
        .is_none());
    assert!(sel("").metadata_only().unwrap().is_everything());
    for text in [
        "status.phase=Running,spec.replicas!=2",
        "spec=,metadata.labels.tier=front",
        "spec.containers.0.name=main,missing.field=",
    ] {
        let selector = sel(text);
        let values = FieldValues::read(Reading::Json, &pod, selector.paths());
        assert_eq!(
            selector.matches_values(&values),
            selector.matches(Reading::Json, &pod),
            "{text:?}"
        );
    }
    // A path the values lack reads as missing.
    assert!(sel("spec.nodeName=").matches_values(&FieldValues::default()));
}

#[test]
fn the_member_reads_its_own_fields_its_own_way() {
    let member = |group, resource| Reading::Member { group, resource };
    let node = json!({"metadata": {"name": "n1"}, "spec": {}});
    // A missing bool is false to the member, missing (empty) to the JSON reading.
    assert!(sel("spec.unschedulable=false").matches(member("", "nodes"), &node));
    assert!(!sel("spec.unschedulable=false").matches(Reading::Json, &node));
    let job = json!({"status": {"succeeded": 2}});
    assert!(sel("status.successful=2").matches(member("batch", "jobs"), &job));
    assert!(sel("status.successful=0").matches(member("batch", "jobs"), &json!({})));
    let event = json!({"source": {}, "reportingComponent": "kubelet"});
    assert!(sel("source=kubelet").matches(member("", "events"), &event));
    let sourced = json!({"source": {"component": "scheduler"}, "reportingComponent": "kubelet"});
    assert!(sel("source=scheduler").matches(member("", "events"), &sourced));
    let pod = pod();
    let pods = member("", "pods");
    assert!(sel("spec.host=node-1").matches(pods, &pod));
    assert!(
        sel("status.podIPs=").matches(pods, &json!({"status": {"podIPs": [{"ip": "1.2.3.4"}]}}))
    );
    // A field the member does not serve reads as JSON.
    assert!(sel("spec.containers.0.image=busybox").matches(pods, &pod));
}

/// Which fields the member serves (pods field by field: tests/field_selectors.rs, against the
/// simulated member).
#[test]
fn which_fields_the_member_serves() {
    for (group, resource, field, served) in [
        ("", "pods", "spec.host", true),
        ("", "pods", "status.hostIP", false),
        ("", "pods", "spec.hostNetwork", false),
        ("", "pods", " spec.nodeName", false),
        ("", "pods", "metadata.labels.app", false),
        ("", "configmaps", "metadata.namespace", true),
        ("", "configmaps", "data.k1", false),
        ("", "secrets", "type", true),
        ("", "namespaces", "status.phase", true),
        ("", "namespaces", "metadata.namespace", false),
        ("", "nodes", "spec.unschedulable", true),
        ("", "nodes", "metadata.namespace", false),
        ("", "events", "involvedObject.kind", true),
        ("", "events", "source", true),
        ("", "events", "regarding.name", false),
        ("events.k8s.io", "events", "regarding.name", true),
        ("events.k8s.io", "events", "involvedObject.name", false),
        ("batch", "jobs", "status.successful", true),
        (
            "certificates.k8s.io",
            "certificatesigningrequests",
            "spec.signerName",
            true,
        ),
        ("apps", "deployments", "status.replicas", false),
        ("example.com", "widgets", "metadata.name", true),
        ("example.com", "widgets", "spec.size", false),
    ] {
        assert_eq!(
            member_supports(group, resource, field),
            served,
            "{group}/{resource} {field}"
        );
    }
    assert_eq!(
        member_field("", "pods", "spec.host"),
        Some(MemberField::Path("spec.nodeName"))
    );
}

/// A key of the random objects: plain, with a dot, a comma, a backslash, a blank, a digit.
fn key() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["a", "b", "c.d", "e,f", r"g\h", "i j", "0", "1", "é"])
        .prop_map(str::to_owned)
}

/// A string value of the random objects and selectors: with the characters kube escapes.
fn text() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "", "x", "x=y", "a,b", r"\", "3", "true", "1.5", " x", "é",
    ])
    .prop_map(str::to_owned)
}

fn object() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        text().prop_map(Value::String),
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![Just(json!(3)), Just(json!(1.5)), Just(json!(0))],
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map(key(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// One requirement of the model: keys, operator, value.
#[derive(Debug, Clone)]
struct Term {
    keys: Vec<String>,
    op: &'static str,
    value: String,
}

impl Term {
    fn render(&self) -> String {
        let path = self
            .keys
            .iter()
            .map(|k| {
                k.replace('\\', r"\\")
                    .replace('.', r"\.")
                    .replace(',', r"\,")
            })
            .collect::<Vec<_>>()
            .join(".");
        let value = self
            .value
            .replace('\\', r"\\")
            .replace(',', r"\,")
            .replace('=', r"\=");
        format!("{path}{}{value}", self.op)
    }

    /// The plain filter: `Value::pointer`, a string as itself, other scalars as their text,
    /// missing or null as empty, an object or array equal to nothing.
    fn holds(&self, object: &Value) -> bool {
        let pointer: String = self
            .keys
            .iter()
            .map(|k| format!("/{}", k.replace('~', "~0").replace('/', "~1")))
            .collect();
        let equal = self.op != "!=";
        let text = match object.pointer(&pointer) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::Object(_) | Value::Array(_)) => return !equal,
        };
        (text == self.value) == equal
    }
}

fn term() -> impl Strategy<Value = Term> {
    (
        prop::collection::vec(key(), 1..4),
        prop::sample::select(vec!["=", "==", "!="]),
        text(),
    )
        .prop_map(|(keys, op, value)| Term { keys, op, value })
}

proptest! {
    #[test]
    fn the_selector_selects_what_a_plain_filter_selects(
        terms in prop::collection::vec(term(), 1..4),
        objects in prop::collection::vec(object(), 1..6),
        empty_terms in 0usize..3,
    ) {
        let mut text = terms.iter().map(Term::render).collect::<Vec<_>>();
        text.extend(std::iter::repeat_n(String::new(), empty_terms));
        let text = text.join(",");
        let parsed = parse_any(&text);
        prop_assert!(parsed.is_ok(), "{:?} refused: {:?}", text, parsed);
        let selector = parsed.unwrap();
        for object in &objects {
            let want = terms.iter().all(|t| t.holds(object));
            prop_assert_eq!(selector.matches(Reading::Json, object), want, "{:?} on {}", text, object);
            let values = FieldValues::read(Reading::Json, object, selector.paths());
            prop_assert_eq!(selector.matches_values(&values), want);
        }
    }

    #[test]
    fn no_text_makes_parse_any_panic(text in r"[ -~\t\u{e9}\u{0}\\.,=!]{0,60}") {
        if let Ok(selector) = parse_any(&text) {
            let _ = selector.matches(Reading::Json, &pod());
            let _ = selector.matches(Reading::Member { group: "", resource: "pods" }, &pod());
        }
    }
}
