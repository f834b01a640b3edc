//! The selectors read as kube reads them: cases written down from kube's parser
//! (`labels/selector.go`, `fields/selector.go`), hostile inputs that must be refused without a
//! panic, and properties: a selector rendered from a model (with blanks wherever kube allows
//! them) selects exactly what the model says, on any labels.

use proptest::prelude::*;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (Box::from(*k), Box::from(*v)))
        .collect()
}

fn selects(selector: &str, pairs: &[(&str, &str)]) -> bool {
    LabelSelector::parse(selector)
        .unwrap_or_else(|_| panic!("{selector:?} refused"))
        .matches(&labels(pairs))
}

#[test]
fn label_operators_select_as_kube_does() {
    let app = [("app", "web"), ("tier", "front"), ("n", "7")];
    assert!(selects("", &app));
    assert!(selects("   ", &app));
    assert!(selects("app", &app));
    assert!(!selects("!app", &app));
    assert!(selects("!missing", &app));
    assert!(selects("app=web", &app));
    assert!(selects("app==web", &app));
    assert!(!selects("app!=web", &app));
    assert!(selects("missing!=web", &app));
    assert!(selects("app in (web, api)", &app));
    assert!(!selects("app notin (web,api)", &app));
    assert!(selects("missing notin (web)", &app));
    assert!(!selects("missing in (web)", &app));
    assert!(selects("n>6", &app));
    assert!(!selects("n>7", &app));
    assert!(selects("n<8", &app));
    assert!(
        !selects("app>1", &app),
        "a value that is not a number never matches"
    );
    assert!(!selects("missing<9", &app));
    assert!(selects(" app = web , tier in ( front ) ", &app));
    assert!(!selects("app=web,tier=back", &app));
    // The empty value: `a=`, `a in ()`, `a in (,x)`.
    assert!(selects("e=", &[("e", "")]));
    assert!(!selects("e=", &app));
    assert!(selects("e in ()", &[("e", "")]));
    assert!(selects("e in (,x)", &[("e", "")]));
    assert!(selects("e in (x,)", &[("e", "")]));
    // `in` and `notin` are names where a key or value is read.
    assert!(selects("in=notin", &[("in", "notin")]));
    assert!(selects("k in (in, notin)", &[("k", "in")]));
    assert!(selects(
        "example.com/app=web",
        &[("example.com/app", "web")]
    ));
}

#[test]
fn what_kube_refuses_is_not_served() {
    for bad in [
        ",",
        "a,",
        ",a",
        "a,,b",
        "a=b=c",
        "app===x!",
        "!a=b",
        "!",
        "a in",
        "a in (",
        "a in (b",
        "a in b",
        "a in (b c)",
        "a notin",
        "a >",
        "a > x",
        "a > 1.5",
        "a > -1",
        "a > +1",
        "a > 99999999999999999999",
        "a >= 1",
        "a <> 1",
        "=b",
        "a b",
        "a=b c",
        "(a)",
        "A_",
        "-a",
        "a-",
        "Example.com/a",
        "/a",
        "a/",
        "a/b/c",
        "a=-b",
        "a=b_",
        "a=\u{e9}",
        "\u{e9}",
        "a\u{0}",
        "a=b\u{0},c",
    ] {
        assert_eq!(LabelSelector::parse(bad), Err(Unsupported), "{bad:?}");
    }
    let long = "a".repeat(64);
    assert_eq!(LabelSelector::parse(&long), Err(Unsupported));
    assert!(LabelSelector::parse(&"a".repeat(63)).is_ok());
    assert_eq!(LabelSelector::parse(&format!("a={long}")), Err(Unsupported));
    let prefix = format!("{}/a", "b".repeat(254));
    assert_eq!(LabelSelector::parse(&prefix), Err(Unsupported));
}

#[test]
fn field_selectors_on_name_and_namespace() {
    let sel = |text: &str| FieldSelector::parse(text).unwrap_or_else(|_| panic!("{text:?}"));
    assert!(sel("").is_everything());
    assert!(sel(",").is_everything());
    assert!(sel("metadata.name=a").matches("ns", "a"));
    assert!(!sel("metadata.name=a").matches("ns", "b"));
    assert!(sel("metadata.name==a").matches("ns", "a"));
    assert!(sel("metadata.name!=a").matches("ns", "b"));
    assert!(sel("metadata.namespace=ns,metadata.name=a").matches("ns", "a"));
    assert!(!sel("metadata.namespace=ns,metadata.name=a").matches("other", "a"));
    assert!(sel("metadata.namespace=").matches("", "node-1"));
    assert!(sel(r"metadata.name=a\,b").matches("ns", "a,b"));
    assert!(sel(r"metadata.name=a\=b\\").matches("ns", r"a=b\"));
    for unserved in [
        "spec.nodeName=n",
        " metadata.name=a",
        "metadata.name",
        "metadata.name=a=b",
        r"metadata.name=a\b",
        r"metadata.name=a\",
        "metadata.name=a,status.phase=Running",
        r"metadata.name\=x",
    ] {
        assert_eq!(
            FieldSelector::parse(unserved),
            Err(Unsupported),
            "{unserved:?}"
        );
    }
}

/// A requirement of the model, rendered as kube text and judged on its own.
#[derive(Debug, Clone)]
enum Model {
    Exists(String),
    NotExists(String),
    Equals(String, String, &'static str),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Greater(String, i64),
    Less(String, i64),
}

impl Model {
    fn render(&self, blank: &str) -> String {
        let set = |values: &[String]| values.join(&format!("{blank},{blank}"));
        match self {
            Model::Exists(k) => k.clone(),
            Model::NotExists(k) => format!("!{blank}{k}"),
            Model::Equals(k, v, op) => format!("{k}{blank}{op}{blank}{v}"),
            Model::NotEquals(k, v) => format!("{k}{blank}!={blank}{v}"),
            Model::In(k, vs) => format!("{k} in{blank}({blank}{}{blank})", set(vs)),
            Model::NotIn(k, vs) => format!("{k} notin{blank}({blank}{}{blank})", set(vs)),
            Model::Greater(k, n) => format!("{k}{blank}>{blank}{n}"),
            Model::Less(k, n) => format!("{k}{blank}<{blank}{n}"),
        }
    }

    fn holds(&self, labels: &Labels) -> bool {
        let get = |k: &String| labels.get(k.as_str()).map(|v| v.to_string());
        match self {
            Model::Exists(k) => get(k).is_some(),
            Model::NotExists(k) => get(k).is_none(),
            Model::Equals(k, v, _) => get(k).as_ref() == Some(v),
            Model::NotEquals(k, v) => get(k).as_ref() != Some(v),
            Model::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
            Model::NotIn(k, vs) => !get(k).is_some_and(|x| vs.contains(&x)),
            Model::Greater(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            Model::Less(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        }
    }
}

/// One of a few `common` strings (so that terms and labels meet) or, as often as any one of
/// them, a random one matching `pattern`.
fn common_or(
    common: &'static [&'static str],
    pattern: &'static str,
) -> impl Strategy<Value = String> {
    prop_oneof![
        common.len() as u32 => prop::sample::select(common).prop_map(str::to_owned),
        1 => pattern,
    ]
}

fn key() -> impl Strategy<Value = String> {
    common_or(
        &["app", "tier", "n", "example.com/team"],
        "[a-z][a-z0-9._-]{0,8}[a-z0-9]",
    )
}

fn value() -> impl Strategy<Value = String> {
    common_or(
        &["web", "1", "42"],
        "[A-Za-z0-9]([A-Za-z0-9._-]{0,6}[A-Za-z0-9])?",
    )
}

fn model() -> impl Strategy<Value = Model> {
    prop_oneof![
        key().prop_map(Model::Exists),
        key().prop_map(Model::NotExists),
        (key(), value(), prop_oneof![Just("="), Just("==")])
            .prop_map(|(k, v, op)| Model::Equals(k, v, op)),
        (key(), value()).prop_map(|(k, v)| Model::NotEquals(k, v)),
        (key(), prop::collection::vec(value(), 1..4)).prop_map(|(k, v)| Model::In(k, v)),
        (key(), prop::collection::vec(value(), 1..4)).prop_map(|(k, v)| Model::NotIn(k, v)),
        (key(), 0i64..100).prop_map(|(k, n)| Model::Greater(k, n)),
        (key(), 0i64..100).prop_map(|(k, n)| Model::Less(k, n)),
    ]
}

fn label_set() -> impl Strategy<Value = Labels> {
    prop::collection::btree_map(key(), value(), 0..5).prop_map(|m| {
        m.into_iter()
            .map(|(k, v)| (k.into_boxed_str(), v.into_boxed_str()))
            .collect()
    })
}

proptest! {
    #[test]
    fn a_rendered_model_selects_what_the_model_says(
        models in prop::collection::vec(model(), 1..5),
        blank in prop_oneof![Just(""), Just(" "), Just("\t "), Just("\n")],
        sets in prop::collection::vec(label_set(), 1..8),
    ) {
        let text = models
            .iter()
            .map(|m| m.render(blank))
            .collect::<Vec<_>>()
            .join(&format!("{blank},{blank}"));
        let parsed = LabelSelector::parse(&text);
        prop_assert!(parsed.is_ok(), "{:?} refused", text);
        let parsed = parsed.unwrap();
        for labels in &sets {
            let want = models.iter().all(|m| m.holds(labels));
            prop_assert_eq!(parsed.matches(labels), want, "{:?} on {:?}", text, labels);
        }
    }

    #[test]
    fn no_text_makes_the_label_parser_panic(text in "[ -~\\t\\n\u{e9}\u{0}]{0,40}") {
        let _ = LabelSelector::parse(&text);
    }

    #[test]
    fn no_text_makes_the_field_parser_panic(text in "(metadata\\.name|metadata\\.namespace|[ -~\u{e9}\\\\]{0,6})([!=]{0,3})[ -~\u{e9}\\\\,=]{0,20}") {
        let _ = FieldSelector::parse(&text);
    }

    #[test]
    fn an_escaped_name_round_trips(name in "[ -~\u{e9}]{0,20}") {
        let escaped = name.replace('\\', "\\\\").replace(',', "\\,").replace('=', "\\=");
        let text = format!("metadata.name={escaped}");
        let selector = FieldSelector::parse(&text);
        prop_assert!(selector.is_ok(), "{:?}", text);
        prop_assert!(selector.unwrap().matches("ns", &name));
    }
}
