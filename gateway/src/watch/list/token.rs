//! kube-apiserver's own continue tokens (`k8s.io/apiserver/pkg/storage` `encodeContinue`): base64url
//! without padding of `{"v":"meta.k8s.io/v1","rv":RV,"start":"KEY\u0000"}`, where KEY is the last
//! returned object's storage key below the list's scope (`name` in a namespace, `namespace/name`
//! across namespaces, `name` for a cluster-scoped resource). A page served from the cache carries
//! such a token, so the next page may be served by the cache or, as well, by the member itself
//! (its storage at RV holds the same objects). A client may send any bytes: reading never panics
//! and refuses (None: the member answers, its 400 or 410) what is not such a token.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;
const VERSION: &str = "meta.k8s.io/v1";
/// Longest token read (the member's are a few hundred bytes).
const MAX_TOKEN: usize = 8 * 1024;

#[derive(Debug, Serialize, Deserialize)]
struct Wire {
    v: String,
    rv: i64,
    start: String,
}

/// A continue token read: the resourceVersion of the list it continues and the key it starts at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Continue {
    pub rv: u64,
    /// The storage key below the list's scope, as the token gives it (its `\0` kept: it starts
    /// right after the last key returned).
    pub start: String,
}

/// Reads a client's continue token; None for anything the member should judge itself.
pub fn read(token: &str) -> Option<Continue> {
    if token.is_empty() || token.len() > MAX_TOKEN {
        return None;
    }
    let bytes = B64.decode(token.trim_end_matches('=')).ok()?;
    let wire: Wire = serde_json::from_slice(&bytes).ok()?;
    if wire.v != VERSION || wire.rv <= 0 {
        return None;
    }
    // kube refuses a key that would leave the list's prefix.
    if wire.start.is_empty()
        || wire.start.starts_with('/')
        || wire.start.split('/').any(|p| p == "..")
    {
        return None;
    }
    Some(Continue {
        rv: wire.rv as u64,
        start: wire.start,
    })
}

/// The token of a page that ended at `last` (a storage key below the list's scope) at `rv`.
pub fn write(rv: u64, last: &str) -> String {
    let wire = Wire {
        v: VERSION.into(),
        rv: i64::try_from(rv).unwrap_or(i64::MAX),
        start: format!("{last}\u{0}"),
    };
    B64.encode(serde_json::to_vec(&wire).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn kube_apiservers_token_reads_and_writes_the_same() {
        // fixtures: configmap-list-limit1.json.
        let recorded =
            "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MjU3LCJzdGFydCI6ImZpeHR1cmUtY21cdTAwMDAifQ";
        let read = read(recorded).unwrap();
        assert_eq!(
            read,
            Continue {
                rv: 257,
                start: "fixture-cm\u{0}".into()
            }
        );
        assert_eq!(write(257, "fixture-cm"), recorded);
    }

    #[test]
    fn hostile_tokens_are_left_to_the_member() {
        let token = |json: &str| B64.encode(json);
        for hostile in [
            String::new(),
            "garbage".into(),
            "%%%".into(),
            "a".repeat(MAX_TOKEN + 1),
            token("{}"),
            token("null"),
            token(r#"{"v":"meta.k8s.io/v2","rv":5,"start":"a\u0000"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"a\u0000"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":-3,"start":"a\u0000"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":1e3,"start":"a\u0000"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":5,"start":""}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"/etc/passwd"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"../other/x"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":5,"start":"ns/../../x"}"#),
            token(r#"{"v":"meta.k8s.io/v1","rv":99999999999999999999,"start":"a"}"#),
        ] {
            assert_eq!(read(&hostile), None, "{hostile}");
        }
    }

    proptest! {
        #[test]
        fn any_text_is_read_or_refused_without_a_panic(text in ".{0,200}") {
            let _ = read(&text);
        }

        #[test]
        fn what_the_gateway_writes_reads_back(rv in 1u64..i64::MAX as u64, key in "[a-z0-9-]{1,20}(/[a-z0-9.-]{1,20})?") {
            prop_assert_eq!(read(&write(rv, &key)), Some(Continue { rv, start: format!("{key}\u{0}") }));
        }
    }
}
