//! Label and field selectors as the kube-apiserver parses them (`labelSelector=`,
//! `fieldSelector=`), and matching them against stored objects.
//!
//! Pure functions; parse errors carry the apiserver's message so the router can return the same
//! 400. Called by the router (`api`) for list, watch and deletecollection.

use serde_json::Value;

/// A `matchLabels` map as the text of a label selector (`app=web,tier=front`), as kubectl's
/// columns and a Scale's `status.selector` show it; empty when it is not a map.
pub(crate) fn match_labels_text(match_labels: &Value) -> String {
    match_labels
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default()
}

/// A parse error, with the message the apiserver would print.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelOp {
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    /// `key > n`, `key < n`: the label's value read as a whole number.
    Greater(i64),
    Less(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

fn is_value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')
}

impl LabelSelector {
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        let chars: Vec<char> = input.chars().collect();
        let mut pos = 0;
        let skip_ws = |pos: &mut usize| {
            while *pos < chars.len() && chars[*pos] == ' ' {
                *pos += 1;
            }
        };
        let read_while = |pos: &mut usize, f: fn(char) -> bool| {
            let start = *pos;
            while *pos < chars.len() && f(chars[*pos]) {
                *pos += 1;
            }
            chars[start..*pos].iter().collect::<String>()
        };
        skip_ws(&mut pos);
        if pos == chars.len() {
            return Ok(Self::default());
        }
        loop {
            skip_ws(&mut pos);
            let negated = pos < chars.len() && chars[pos] == '!';
            if negated {
                pos += 1;
                skip_ws(&mut pos);
            }
            let key = read_while(&mut pos, is_key_char);
            if key.is_empty() {
                let found = chars
                    .get(pos)
                    .map_or("EOS".to_string(), |c| format!("'{c}'"));
                return Err(SelectorError(format!(
                    "unable to parse requirement: found {found}, expected: identifier"
                )));
            }
            skip_ws(&mut pos);
            let op = if negated {
                LabelOp::DoesNotExist
            } else if pos >= chars.len() || chars[pos] == ',' {
                LabelOp::Exists
            } else if chars[pos..].starts_with(&['!', '=']) {
                pos += 2;
                LabelOp::NotEquals(Self::value(&chars, &mut pos)?)
            } else if chars[pos..].starts_with(&['=', '=']) {
                pos += 2;
                LabelOp::Equals(Self::value(&chars, &mut pos)?)
            } else if chars[pos] == '=' {
                pos += 1;
                LabelOp::Equals(Self::value(&chars, &mut pos)?)
            } else if matches!(chars[pos], '>' | '<') {
                let greater = chars[pos] == '>';
                pos += 1;
                let value = Self::value(&chars, &mut pos)?;
                let n = value.parse::<i64>().map_err(|_| {
                    SelectorError(format!(
                        "values[0][{key}]: Invalid value: {value:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                    ))
                })?;
                if greater {
                    LabelOp::Greater(n)
                } else {
                    LabelOp::Less(n)
                }
            } else {
                let word = read_while(&mut pos, |c| c.is_ascii_alphabetic());
                let values = match word.as_str() {
                    "in" | "notin" => Self::set(&chars, &mut pos)?,
                    _ => {
                        return Err(SelectorError(format!(
                            "unable to parse requirement: found '{word}', expected: in, notin, =, ==, !=, gt, lt"
                        )))
                    }
                };
                if word == "in" {
                    LabelOp::In(values)
                } else {
                    LabelOp::NotIn(values)
                }
            };
            requirements.push(LabelRequirement { key, op });
            skip_ws(&mut pos);
            if pos >= chars.len() {
                break;
            }
            if chars[pos] != ',' {
                return Err(SelectorError(format!(
                    "found '{}', expected: ',' or 'end of string'",
                    chars[pos]
                )));
            }
            pos += 1;
        }
        Ok(Self { requirements })
    }

    fn value(chars: &[char], pos: &mut usize) -> Result<String, SelectorError> {
        while *pos < chars.len() && chars[*pos] == ' ' {
            *pos += 1;
        }
        let start = *pos;
        while *pos < chars.len() && is_value_char(chars[*pos]) {
            *pos += 1;
        }
        if *pos < chars.len() && !matches!(chars[*pos], ',' | ' ') {
            return Err(SelectorError(format!(
                "unable to parse requirement: found '{}', expected: identifier",
                chars[*pos]
            )));
        }
        Ok(chars[start..*pos].iter().collect())
    }

    fn set(chars: &[char], pos: &mut usize) -> Result<Vec<String>, SelectorError> {
        while *pos < chars.len() && chars[*pos] == ' ' {
            *pos += 1;
        }
        if chars.get(*pos) != Some(&'(') {
            return Err(SelectorError(
                "unable to parse requirement: found EOS, expected: '('".into(),
            ));
        }
        *pos += 1;
        let mut values = Vec::new();
        loop {
            while *pos < chars.len() && chars[*pos] == ' ' {
                *pos += 1;
            }
            let start = *pos;
            while *pos < chars.len() && is_value_char(chars[*pos]) {
                *pos += 1;
            }
            values.push(chars[start..*pos].iter().collect());
            while *pos < chars.len() && chars[*pos] == ' ' {
                *pos += 1;
            }
            match chars.get(*pos) {
                Some(',') => *pos += 1,
                Some(')') => {
                    *pos += 1;
                    return Ok(values);
                }
                other => {
                    return Err(SelectorError(format!(
                        "found '{}', expected: ',' or ')'",
                        other.map_or("EOS".to_string(), |c| c.to_string())
                    )))
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        // An empty selector reads nothing: a LIST counts every object after its page
        // (remainingItemCount), and looking each one's labels up touches memory that large
        // members do not keep in cache (two thirds of a member's CPU in fleet-list's paged lists).
        if self.requirements.is_empty() {
            return true;
        }
        let labels = &object["metadata"]["labels"];
        self.requirements.iter().all(|req| {
            let value = labels.get(&req.key).and_then(Value::as_str);
            match &req.op {
                LabelOp::Exists => value.is_some(),
                LabelOp::DoesNotExist => value.is_none(),
                LabelOp::Equals(v) => value == Some(v.as_str()),
                LabelOp::NotEquals(v) => value != Some(v.as_str()),
                LabelOp::In(set) => value.is_some_and(|x| set.iter().any(|s| s == x)),
                LabelOp::NotIn(set) => value.is_none_or(|x| !set.iter().any(|s| s == x)),
                LabelOp::Greater(n) => value
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                LabelOp::Less(n) => value
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct FieldRequirement {
    field: Selectable,
    value: String,
    equal: bool,
}

/// How the apiserver reads a field it serves from a stored object (its kind's
/// `ToSelectableFields`, kube v1.24).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Selectable {
    /// A string field; `""` when absent.
    Text(&'static [&'static str]),
    /// A bool field printed by `fmt.Sprint`: `false` when absent.
    Bool(&'static [&'static str]),
    /// Events' `source`: `source.component`, or the reporting component when that is empty.
    EventSource,
    /// A label the conversion accepts that the field set never holds: always `""`.
    Absent,
}

impl Selectable {
    fn read(self, object: &Value) -> String {
        fn at<'v>(object: &'v Value, path: &[&str]) -> &'v Value {
            path.iter().fold(object, |node, key| &node[*key])
        }
        match self {
            Selectable::Text(path) => at(object, path).as_str().unwrap_or("").to_owned(),
            Selectable::Bool(path) => at(object, path).as_bool().unwrap_or(false).to_string(),
            Selectable::EventSource => {
                let component = object["source"]["component"].as_str().unwrap_or("");
                if component.is_empty() {
                    object["reportingComponent"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned()
                } else {
                    component.to_owned()
                }
            }
            Selectable::Absent => String::new(),
        }
    }
}

/// The field labels `resource`'s field-label conversion function accepts (kube v1.24,
/// `pkg/apis/core/v1/conversion.go`), with how each is read; `None` for a kind without one,
/// which gets the default conversion (`metadata.name` and `metadata.namespace`).
fn conversion(resource: &str) -> Option<&'static [(&'static str, Selectable)]> {
    use Selectable::{Absent, Bool, EventSource, Text};
    const NAME: (&str, Selectable) = ("metadata.name", Text(&["metadata", "name"]));
    const NAMESPACE: (&str, Selectable) = ("metadata.namespace", Text(&["metadata", "namespace"]));
    Some(match resource {
        "pods" => &[
            NAME,
            NAMESPACE,
            ("spec.nodeName", Text(&["spec", "nodeName"])),
            ("spec.restartPolicy", Text(&["spec", "restartPolicy"])),
            ("spec.schedulerName", Text(&["spec", "schedulerName"])),
            (
                "spec.serviceAccountName",
                Text(&["spec", "serviceAccountName"]),
            ),
            ("status.phase", Text(&["status", "phase"])),
            ("status.podIP", Text(&["status", "podIP"])),
            ("status.podIPs", Absent),
            (
                "status.nominatedNodeName",
                Text(&["status", "nominatedNodeName"]),
            ),
            ("spec.host", Text(&["spec", "nodeName"])),
        ],
        "nodes" => &[
            NAME,
            ("spec.unschedulable", Bool(&["spec", "unschedulable"])),
        ],
        "namespaces" => &[NAME, ("status.phase", Text(&["status", "phase"]))],
        "secrets" => &[NAME, NAMESPACE, ("type", Text(&["type"]))],
        "events" => &[
            NAME,
            NAMESPACE,
            ("involvedObject.kind", Text(&["involvedObject", "kind"])),
            (
                "involvedObject.namespace",
                Text(&["involvedObject", "namespace"]),
            ),
            ("involvedObject.name", Text(&["involvedObject", "name"])),
            ("involvedObject.uid", Text(&["involvedObject", "uid"])),
            (
                "involvedObject.apiVersion",
                Text(&["involvedObject", "apiVersion"]),
            ),
            (
                "involvedObject.resourceVersion",
                Text(&["involvedObject", "resourceVersion"]),
            ),
            (
                "involvedObject.fieldPath",
                Text(&["involvedObject", "fieldPath"]),
            ),
            ("reason", Text(&["reason"])),
            ("reportingComponent", Text(&["reportingComponent"])),
            ("source", EventSource),
            ("type", Text(&["type"])),
        ],
        _ => return None,
    })
}

/// The field a selector names, as `resource`'s conversion reads it, or the apiserver's
/// refusal: `field label not supported: X` from a kind's own conversion, the default
/// conversion's message otherwise.
fn selectable(resource: &str, label: &str) -> Result<Selectable, SelectorError> {
    match conversion(resource) {
        Some(fields) => fields
            .iter()
            .find(|(name, _)| *name == label)
            .map(|(_, field)| *field)
            .ok_or_else(|| SelectorError(format!("field label not supported: {label}"))),
        None => match label {
            "metadata.name" => Ok(Selectable::Text(&["metadata", "name"])),
            "metadata.namespace" => Ok(Selectable::Text(&["metadata", "namespace"])),
            _ => Err(SelectorError(format!(
                "{} is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
                go_quote(label)
            ))),
        },
    }
}

/// Go's `%q` of a string: double quotes, `\"` and `\\`, the short escapes, `\xNN` for other
/// ASCII control bytes; printable text as it is.
fn go_quote(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A parsed field selector for one resource; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `input` for `resource` (which decides the supported fields), as the apiserver
    /// does: the terms in sorted order (so the first error is the one kube reports), each field
    /// exactly as written (nothing trimmed) through the kind's field-label conversion.
    pub fn parse(input: &str, resource: &str) -> Result<Self, SelectorError> {
        let mut terms: Vec<&str> = field_terms(input).filter(|t| !t.is_empty()).collect();
        terms.sort_unstable();
        let mut parsed = Vec::new();
        for term in terms {
            let Some((field, value, equal)) = field_term(term) else {
                return Err(SelectorError(format!(
                    "invalid selector: '{input}'; can't understand '{term}'"
                )));
            };
            parsed.push((field, unescape_field_value(value)?, equal));
        }
        // kube converts the labels once the whole text parsed.
        let requirements = parsed
            .into_iter()
            .map(|(field, value, equal)| {
                Ok(FieldRequirement {
                    field: selectable(resource, field)?,
                    value,
                    equal,
                })
            })
            .collect::<Result<_, SelectorError>>()?;
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, object: &Value) -> bool {
        self.requirements
            .iter()
            .all(|req| (req.field.read(object) == req.value) == req.equal)
    }
}

/// A field selector's terms: `input` cut at every comma no backslash escapes (kube's
/// `splitTerms`); the escapes stay for [`unescape_field_value`].
fn field_terms(input: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(input);
    std::iter::from_fn(move || {
        let text = rest?;
        let mut escaped = false;
        for (at, c) in text.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                ',' => {
                    rest = Some(&text[at + 1..]);
                    return Some(&text[..at]);
                }
                _ => {}
            }
        }
        rest = None;
        Some(text)
    })
}

/// `(field, value, equal)` of one term, cut at the first operator from the left, an escape
/// before it or not (kube's `splitTerm`: at each position `!=`, then `==`, then `=`).
fn field_term(term: &str) -> Option<(&str, &str, bool)> {
    (0..term.len())
        .filter(|&at| term.is_char_boundary(at))
        .find_map(|at| {
            let rest = &term[at..];
            if let Some(value) = rest.strip_prefix("!=") {
                Some((&term[..at], value, false))
            } else if let Some(value) = rest.strip_prefix("==") {
                Some((&term[..at], value, true))
            } else {
                rest.strip_prefix('=')
                    .map(|value| (&term[..at], value, true))
            }
        })
}

/// kube's `UnescapeValue`: `\\`, `\,` and `\=` stand for the character; any other escape, a
/// trailing backslash, or a bare `,` or `=` is the apiserver's error.
fn unescape_field_value(value: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(other) => {
                    return Err(SelectorError(format!(
                        "invalid field selector: invalid escape sequence: \\{other}"
                    )))
                }
                None => {
                    return Err(SelectorError(
                        "invalid field selector: invalid escape sequence: \\".into(),
                    ))
                }
            },
            // Go prints the rune with `%v`: its number.
            ',' | '=' => {
                return Err(SelectorError(format!(
                    "invalid field selector: unescaped character in value: {}",
                    u32::from(c)
                )))
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata":{"name":"x","namespace":"ns","labels":labels}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app":"web","tier":"config","n":"7"}));
        for (sel, want) in [
            ("n>6", true),
            ("n > 7", false),
            ("n<8", true),
            ("app<8", false),
            ("missing>1", false),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("tier in (config,other)", true),
            ("tier notin (config)", false),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier=config", true),
            ("app=web,tier=x", false),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn no_input_makes_the_parsers_panic() {
        // Every string of up to four characters over the selector alphabet.
        let alphabet: Vec<char> = "a=!(), in".chars().collect();
        let mut inputs = vec![String::new()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for prefix in &inputs {
                for c in &alphabet {
                    next.push(format!("{prefix}{c}"));
                }
            }
            inputs.extend(next.clone());
            inputs = inputs
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
        }
        let object = obj(json!({"a": "a"}));
        for input in &inputs {
            if let Ok(selector) = LabelSelector::parse(input) {
                let _ = selector.matches(&object);
            }
            if let Ok(selector) = FieldSelector::parse(input, "pods") {
                let _ = selector.matches(&object);
            }
        }
        assert!(inputs.len() > 1000);
    }

    #[test]
    fn bad_label_selector_is_an_error() {
        let err = LabelSelector::parse("app===x!").unwrap_err();
        assert_eq!(
            err.0,
            "unable to parse requirement: found '=', expected: identifier"
        );
    }

    #[test]
    fn field_selector_on_pods() {
        let pod = json!({"metadata":{"name":"p","namespace":"ns"},"spec":{"nodeName":"n1"}});
        assert!(FieldSelector::parse("spec.nodeName=n1", "pods")
            .unwrap()
            .matches(&pod));
        assert!(!FieldSelector::parse("spec.nodeName!=n1", "pods")
            .unwrap()
            .matches(&pod));
        assert!(FieldSelector::parse("data.k1=v1", "configmaps").is_err());
    }

    #[test]
    fn field_labels_are_the_apiservers_per_kind() {
        let refusal =
            |input: &str, resource: &str| FieldSelector::parse(input, resource).unwrap_err().0;
        for field in [
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
            "spec.host",
        ] {
            assert!(
                FieldSelector::parse(&format!("{field}=x"), "pods").is_ok(),
                "{field}"
            );
        }
        // A kind with its own conversion function says so in its own words.
        assert_eq!(
            refusal("status.hostIP=1", "pods"),
            "field label not supported: status.hostIP"
        );
        // Nothing is trimmed: a blank before the field makes another label.
        assert_eq!(
            refusal(" spec.nodeName=n1", "pods"),
            "field label not supported:  spec.nodeName"
        );
        assert_eq!(
            refusal("metadata.namespace=x", "namespaces"),
            "field label not supported: metadata.namespace"
        );
        assert_eq!(
            refusal("metadata.namespace=x", "nodes"),
            "field label not supported: metadata.namespace"
        );
        assert_eq!(
            refusal("a\"b\u{1}=x", "configmaps"),
            "\"a\\\"b\\x01\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
        // Grammar errors first, then labels, each in sorted order.
        assert_eq!(
            refusal("zz=1,spec.x=1,b", "pods"),
            "invalid selector: 'zz=1,spec.x=1,b'; can't understand 'b'"
        );
        assert_eq!(
            refusal("zz=1,spec.x=1", "pods"),
            "field label not supported: spec.x"
        );
        // How the fields read.
        let pod = json!({"metadata":{"name":"p"},"spec":{"nodeName":"n1"},"status":{"podIPs":[{"ip":"1.2.3.4"}]}});
        for (input, want) in [
            ("spec.host=n1", true),
            ("status.podIPs=", true),
            ("status.phase=", true),
            ("spec.nodeName!=", true),
            ("spec.nodeName=", false),
        ] {
            assert_eq!(
                FieldSelector::parse(input, "pods").unwrap().matches(&pod),
                want,
                "{input}"
            );
        }
        let node = json!({"metadata":{"name":"n1"},"spec":{}});
        assert!(FieldSelector::parse("spec.unschedulable=false", "nodes")
            .unwrap()
            .matches(&node));
        let event = json!({"source":{},"reportingComponent":"kubelet"});
        assert!(FieldSelector::parse("source=kubelet", "events")
            .unwrap()
            .matches(&event));
    }

    #[test]
    fn field_values_take_kubes_escapes_and_nothing_else() {
        let named = |name: &str| json!({"metadata":{"name": name, "namespace":"ns"}});
        // An escaped comma or equals sign is part of the value, not a new term or operator.
        let selector = FieldSelector::parse(r"metadata.name=a\,b\=c\\d", "configmaps").unwrap();
        assert!(selector.matches(&named(r"a,b=c\d")));
        // Characters a query would carry encoded are the value's own.
        let hostile = "x&labelSelector\\=app #f%41+;?\n";
        let selector =
            FieldSelector::parse(&format!("metadata.name!={hostile}"), "configmaps").unwrap();
        assert!(!selector.matches(&named("x&labelSelector=app #f%41+;?\n")));
        assert!(selector.matches(&named("seed")));
        // The first operator from the left cuts the term; values are not trimmed.
        assert!(FieldSelector::parse("metadata.name= seed", "configmaps")
            .unwrap()
            .matches(&named(" seed")));
        for (bad, message) in [
            (
                "metadata.name=a=b",
                "invalid field selector: unescaped character in value: 61",
            ),
            (
                r"metadata.name=a\x",
                r"invalid field selector: invalid escape sequence: \x",
            ),
            (
                r"metadata.name=a\",
                r"invalid field selector: invalid escape sequence: \",
            ),
        ] {
            assert_eq!(
                FieldSelector::parse(bad, "configmaps").unwrap_err().0,
                message,
                "{bad}"
            );
        }
        // Two terms, both applied.
        let both = FieldSelector::parse("metadata.name=seed,metadata.namespace!=ns", "configmaps");
        assert!(!both.unwrap().matches(&named("seed")));
    }
}
