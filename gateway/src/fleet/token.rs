//! The fleet view's opaque tokens: the continue token of a merged LIST (the cluster to resume in
//! and that member's own continue) and the composite resourceVersion (cluster -> the member's
//! resourceVersion). Both are base64url (no padding) of compact JSON, so they are URL-safe and
//! need no escaping in a query. A client may send any bytes as either: decoding never panics and
//! refuses what it did not write with a reason.

use std::collections::BTreeMap;

use base64::Engine as _;
use fleetgate_config_watcher::request_info;
use serde::{Deserialize, Serialize};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a query value added by the gateway leaves as it is: RFC 3986's unreserved characters.
const QUERY_VALUE: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Longest token accepted (a member's continue token is a few hundred bytes).
const MAX_TOKEN: usize = 8 * 1024;

/// Where the next page of a merged LIST starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Continue {
    /// The cluster to resume in.
    #[serde(rename = "c")]
    pub cluster: String,
    /// That member's continue token; empty: from its start.
    #[serde(rename = "k", default, skip_serializing_if = "String::is_empty")]
    pub member: String,
}

impl Continue {
    pub fn encode(&self) -> String {
        B64.encode(serde_json::to_vec(self).unwrap_or_default())
    }

    pub fn decode(token: &str) -> Result<Continue, &'static str> {
        if token.len() > MAX_TOKEN {
            return Err("continue token is too long");
        }
        let bytes = B64
            .decode(token)
            .map_err(|_| "continue token was not written by the fleet view")?;
        let parsed: Continue = serde_json::from_slice(&bytes)
            .map_err(|_| "continue token was not written by the fleet view")?;
        if !valid_cluster_name(&parsed.cluster) {
            return Err("continue token names no cluster");
        }
        Ok(parsed)
    }
}

/// The composite resourceVersion of a merged LIST: each member's, by cluster.
pub fn encode_versions(versions: &BTreeMap<String, String>) -> String {
    B64.encode(serde_json::to_vec(versions).unwrap_or_default())
}

/// Reads a composite resourceVersion back (a merged watch resumes from one): cluster -> the
/// member's resourceVersion. Refuses what the fleet view did not write.
pub fn decode_versions(token: &str) -> Result<BTreeMap<String, String>, &'static str> {
    const NOT_OURS: &str = "resourceVersion was not written by the fleet view (each member has its own; use one from a fleet LIST or WATCH, or 0)";
    if token.len() > MAX_TOKEN {
        return Err("resourceVersion is too long");
    }
    let bytes = B64.decode(token).map_err(|_| NOT_OURS)?;
    let versions: BTreeMap<String, String> =
        serde_json::from_slice(&bytes).map_err(|_| NOT_OURS)?;
    let sound = |(cluster, version): (&String, &String)| {
        valid_cluster_name(cluster)
            && !version.is_empty()
            && version.len() <= 256
            && version.bytes().all(|b| b.is_ascii_graphic())
    };
    if !versions.iter().all(sound) {
        return Err(NOT_OURS);
    }
    Ok(versions)
}

fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The value of `key` in a raw query (`?a=1&b=2`), percent-decoded; `None` when absent. The
/// same reading of a query as the request info's.
pub fn query_value(query: &[u8], key: &str) -> Option<String> {
    let query = query.strip_prefix(b"?").unwrap_or(query);
    let value = request_info::param(query, key.as_bytes())?;
    let bytes: Vec<u8> = request_info::Unescaped::new(value).collect();
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// A whole-number parameter where absent, empty and `0` all mean none (`limit`,
/// `timeoutSeconds`); `Err(reason)` when it is not a whole number.
pub fn query_count(
    query: &[u8],
    key: &str,
    reason: &'static str,
) -> Result<Option<u64>, &'static str> {
    match query_value(query, key).as_deref() {
        None | Some("") | Some("0") => Ok(None),
        Some(n) => n.parse().map(Some).map_err(|_| reason),
    }
}

/// The raw query without `keys`, then `extra`, with its `?`. A key is matched as the member's Go
/// reads it (`l%69mit` is `limit`: it goes, or the member would take the client's value before
/// the gateway's), and a pair Go drops (a `;`, a broken escape) goes too. `extra`'s values are
/// percent-encoded here, every byte but ASCII letters, digits and `-._~`: a value from a token
/// the client sent back (a member's continue token or resourceVersion) stays one query value,
/// whatever it holds (`&`, `#`, CR LF), and never frames the member's request line.
pub fn rewrite_query(query: &[u8], keys: &[&str], extra: &[(&str, &str)]) -> Vec<u8> {
    let query = query.strip_prefix(b"?").unwrap_or(query);
    let mut out = Vec::with_capacity(query.len() + 64);
    let mut push = |pair: &[u8]| {
        out.push(if out.is_empty() { b'?' } else { b'&' });
        out.extend_from_slice(pair);
    };
    for pair in query.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
        let key = pair.split(|b| *b == b'=').next().unwrap_or(pair);
        let replaced = keys
            .iter()
            .any(|k| request_info::Unescaped::new(key).eq(k.bytes()));
        if request_info::go_keeps(pair) && !replaced {
            push(pair);
        }
    }
    for (k, v) in extra {
        let value = percent_encoding::utf8_percent_encode(v, QUERY_VALUE);
        push(format!("{k}={value}").as_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_continue_token_round_trips_and_is_url_safe() {
        let token = Continue {
            cluster: "member-2".into(),
            member: "eyJ2IjoibWV0YS5rOHMuaW8vdjEiLCJydiI6MTIzfQ==".into(),
        };
        let text = token.encode();
        assert!(text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(Continue::decode(&text), Ok(token));
    }

    #[test]
    fn a_composite_resource_version_round_trips() {
        let versions = BTreeMap::from([
            ("member-1".to_string(), "1043".to_string()),
            ("member-2".to_string(), "77".to_string()),
        ]);
        let text = encode_versions(&versions);
        assert!(text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_eq!(decode_versions(&text), Ok(versions));
        assert_eq!(
            decode_versions(&encode_versions(&BTreeMap::new())),
            Ok(BTreeMap::new())
        );
    }

    #[test]
    fn resource_versions_it_did_not_write_are_refused() {
        for bad in [
            "12345",
            "!!!",
            &B64.encode(b"[]"),
            &B64.encode(br#"{"../x":"1"}"#),
            &B64.encode(br#"{"m":""}"#),
            &B64.encode(br#"{"m":"1 2"}"#),
            &B64.encode(br#"{"m":1}"#),
            &"A".repeat(MAX_TOKEN + 1),
        ] {
            assert!(decode_versions(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tokens_it_did_not_write_are_refused() {
        for bad in [
            "",
            "!!!",
            "e30",                                  // {}
            &B64.encode(br#"{"c":"../x","k":""}"#), // not a cluster name
            &B64.encode(br#"{"c":"","k":"a"}"#),
            &B64.encode(b"[1,2]"),
            &"A".repeat(MAX_TOKEN + 1),
        ] {
            assert!(Continue::decode(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn query_values_and_rewrites() {
        let q = b"?limit=500&labelSelector=app%3Dweb&continue=abc";
        assert_eq!(query_value(q, "limit").as_deref(), Some("500"));
        assert_eq!(query_value(q, "labelSelector").as_deref(), Some("app=web"));
        assert_eq!(query_value(q, "watch"), None);
        assert_eq!(query_count(q, "limit", "bad"), Ok(Some(500)));
        assert_eq!(query_count(b"?limit=0&t=", "limit", "bad"), Ok(None));
        assert_eq!(query_count(b"?limit=0&t=", "t", "bad"), Ok(None));
        assert_eq!(query_count(b"?t=-1", "t", "bad"), Err("bad"));
        assert_eq!(
            query_count(b"?t=99999999999999999999", "t", "bad"),
            Err("bad")
        );
        assert_eq!(
            rewrite_query(q, &["limit", "continue"], &[("limit", "1")]),
            b"?labelSelector=app%3Dweb&limit=1"
        );
        assert_eq!(rewrite_query(b"", &["limit"], &[]), b"");
        // As Go's url.Query(): a pair with a broken escape or a `;` is not there.
        assert_eq!(query_value(b"?x=%zz%4", "x"), None);
        assert_eq!(query_value(b"?x=1;&x=2", "x").as_deref(), Some("2"));
        // A value the gateway adds is one query value, whatever it holds.
        assert_eq!(
            rewrite_query(
                b"?a=1",
                &["continue"],
                &[("continue", "x y\r\nH: v&limit=9#f+/=")]
            ),
            b"?a=1&continue=x%20y%0D%0AH%3A%20v%26limit%3D9%23f%2B%2F%3D".as_slice()
        );
        // A key the gateway sets goes however the client spelled it; pairs Go drops go too.
        assert_eq!(
            rewrite_query(
                b"?l%69mit=9&a=%zz&b=;&c=1&limit=8",
                &["limit"],
                &[("limit", "1")]
            ),
            b"?c=1&limit=1"
        );
    }

    proptest! {
        #[test]
        fn decoding_any_text_never_panics(text in ".{0,200}") {
            let _ = Continue::decode(&text);
            let _ = decode_versions(&text);
            let _ = decode_versions(&B64.encode(text.as_bytes()));
            let _ = query_value(text.as_bytes(), "continue");
            let _ = rewrite_query(text.as_bytes(), &["limit"], &[("limit", "5")]);
        }

        #[test]
        fn any_cluster_and_member_token_round_trip(
            cluster in "[a-z0-9-]{1,63}",
            member in "[ -~]{0,300}",
        ) {
            let token = Continue { cluster, member };
            prop_assert_eq!(Continue::decode(&token.encode()), Ok(token));
        }
    }
}
