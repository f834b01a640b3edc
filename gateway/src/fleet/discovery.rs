//! Discovery through the fleet view (`/api`, `/api/v1`, `/apis`, `/apis/GROUP`,
//! `/apis/GROUP/VERSION`): the first member the user may reach that answers is asked, as the
//! user, and its document is answered filtered to the kinds the fleet view merges, so kubectl
//! (`api-resources`, the resource names it accepts) knows only what the view serves:
//! - an APIResourceList keeps the merged resources and their subresources (`pods/log`,
//!   `deployments/scale`);
//! - an APIGroupList, an APIGroup and APIVersions keep the groups and versions that have a
//!   merged kind (a group's preferred version, if left out, becomes its first kept one);
//! - a group or version with no merged kind is kube's 404, and no member is asked.
//!
//! Aggregated discovery (`as=APIGroupDiscoveryList`) is not served, as a kube-apiserver 1.24
//! does not serve it: the member is asked for `application/json`, and the client gets the
//! legacy document with `Content-Type: application/json`, from which kubectl and client-go go
//! on with legacy discovery. A client whose `Accept` admits no plain JSON gets kube's 406.
//!
//! A member's address (`serverAddressByClientCIDRs`) is left out: a client must not learn of a
//! way around the gateway. Called by the pipeline (`handle`) for a `Decision::FleetDiscovery`;
//! documents are small (tens of KiB) and read whole.

use serde_json::{Map, Value};

use super::{FleetClient, View};
use crate::errors::GatewayError;
use crate::exchange::Failure;
use crate::member::ask::{ask_accepting, Asked, Missed};
use crate::request::discovery::{Document, MergedKind};
use crate::request::FleetDiscovery;

impl Document<'_> {
    /// A member's document, filtered to `kinds`; `Ok(None)` when nothing is left (a 404).
    pub fn filter(
        &self,
        body: &[u8],
        kinds: &[MergedKind<'_>],
    ) -> Result<Option<Vec<u8>>, &'static str> {
        let Value::Object(mut doc) =
            serde_json::from_slice::<Value>(body).map_err(|_| "its discovery is not JSON")?
        else {
            return Err("its discovery is not a JSON object");
        };
        let merged =
            |group: &str, version: &str| kinds.iter().any(|(g, v, _)| *g == group && *v == version);
        let kept = match *self {
            Document::Versions => {
                keep(&mut doc, "versions", |v| {
                    v.as_str().is_some_and(|v| merged("", v))
                })?;
                // A member's own address: never a way around the gateway.
                if doc.contains_key("serverAddressByClientCIDRs") {
                    doc.insert(
                        "serverAddressByClientCIDRs".into(),
                        Value::Array(Vec::new()),
                    );
                }
                true
            }
            Document::Groups => {
                keep(&mut doc, "groups", |group| match group {
                    Value::Object(group) => filter_group(group, &merged),
                    _ => false,
                })?;
                true
            }
            Document::Group(_) => filter_group(&mut doc, &merged),
            Document::Resources { group, version } => {
                keep(&mut doc, "resources", |resource| {
                    let name = resource.get("name").and_then(Value::as_str).unwrap_or("");
                    let plural = name.split('/').next().unwrap_or("");
                    kinds
                        .iter()
                        .any(|(g, v, r)| *g == group && *v == version && *r == plural)
                })?;
                !doc.get("resources")
                    .and_then(Value::as_array)
                    .is_none_or(Vec::is_empty)
            }
            Document::Nothing => false,
        };
        if !kept {
            return Ok(None);
        }
        let mut out = serde_json::to_vec(&Value::Object(doc)).map_err(|_| "unwritable")?;
        out.push(b'\n');
        Ok(Some(out))
    }
}

/// Keeps the entries of the array `doc[key]` that `wanted` says so.
fn keep(
    doc: &mut Map<String, Value>,
    key: &str,
    wanted: impl FnMut(&mut Value) -> bool,
) -> Result<(), &'static str> {
    match doc.get_mut(key) {
        Some(Value::Array(entries)) => {
            let mut wanted = wanted;
            entries.retain_mut(|entry| wanted(entry));
            Ok(())
        }
        Some(Value::Null) | None => Ok(()),
        Some(_) => Err("its discovery document is not what kube writes"),
    }
}

/// An APIGroup (or an APIGroupList's entry) with only its merged versions; whether any is left.
fn filter_group(group: &mut Map<String, Value>, merged: &impl Fn(&str, &str) -> bool) -> bool {
    let name = group
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let version_of = |entry: &Value| {
        entry
            .get("version")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let Some(Value::Array(versions)) = group.get_mut("versions") else {
        return false;
    };
    versions.retain(|entry| merged(&name, &version_of(entry)));
    let Some(first) = versions.first().cloned() else {
        return false;
    };
    let preferred_kept = group
        .get("preferredVersion")
        .is_some_and(|p| merged(&name, &version_of(p)));
    if !preferred_kept {
        group.insert("preferredVersion".into(), first);
    }
    if group.contains_key("serverAddressByClientCIDRs") {
        group.insert(
            "serverAddressByClientCIDRs".into(),
            Value::Array(Vec::new()),
        );
    }
    true
}

/// Whether an `Accept` (every value of the field) admits a plain JSON document: no field,
/// `application/json`, `application/*` or `*/*` without `as=` / `g=` / `v=` and not `q=0`.
pub fn accepts_json<'h>(values: impl Iterator<Item = &'h [u8]>) -> bool {
    let mut any = false;
    for value in values {
        any = true;
        for range in value.split(|b| *b == b',') {
            let range = String::from_utf8_lossy(range);
            let mut params = range.split(';').map(str::trim);
            let media = params.next().unwrap_or_default().to_ascii_lowercase();
            if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
                continue;
            }
            let plain = params.all(|param| {
                let (key, value) = param.split_once('=').unwrap_or((param, ""));
                match key.trim().to_ascii_lowercase().as_str() {
                    "as" | "g" | "v" => false,
                    "q" => value.trim().parse::<f32>().is_ok_and(|q| q > 0.0),
                    _ => true,
                }
            });
            if plain {
                return true;
            }
        }
    }
    !any
}

/// Serves a fleet discovery request: the first member (in `request.members`' order) whose
/// answer can be read, filtered; members that failed before it are named in `Warning` fields.
pub(crate) async fn serve(
    view: &View<'_>,
    request: &FleetDiscovery<'_>,
    client: &mut impl FleetClient,
) -> Result<(), Failure> {
    if !accepts_json(view.client_request.header_values(b"accept")) {
        return Err(Failure::Answer(GatewayError::FleetDiscoveryNotAcceptable));
    }
    let not_found = || {
        Failure::Answer(GatewayError::NoRoute {
            path: String::from_utf8_lossy(request.rest).into_owned(),
        })
    };
    if !request.document.shows_any(&request.kinds) {
        return Err(not_found());
    }
    let asked = Asked {
        rest: request.rest,
        query: request.query,
        verb: request.verb,
    };
    let mut warnings = Vec::new();
    let mut all_not_found = true;
    let (ctx, client_request) = (view.ctx, &view.client_request);
    for (cluster, identity) in &request.members {
        let accept = Some(&b"application/json"[..]);
        let missed =
            match ask_accepting(ctx, &asked, accept, client_request, cluster, identity).await {
                Ok(body) => match request.document.filter(&body, &request.kinds) {
                    Ok(Some(filtered)) => {
                        client.head("application/json", &warnings).await?;
                        client.body(filtered.into()).await?;
                        return client.end().await;
                    }
                    Ok(None) => Missed::Answered(404, String::new()),
                    Err(reason) => Missed::Failed(reason.to_owned()),
                },
                Err(missed) => missed,
            };
        all_not_found &= matches!(missed, Missed::Answered(404, _));
        warnings.push(match missed {
            Missed::Answered(code, message) => {
                format!("cluster {} answered {code}: {message}", cluster.name)
            }
            Missed::Failed(reason) => format!("cluster {}: {reason}", cluster.name),
        });
    }
    if all_not_found {
        return Err(not_found());
    }
    Err(Failure::Answer(GatewayError::FleetDiscoveryUnavailable {
        reasons: warnings.join("; "),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::recorded;

    /// What the demo merges, and a kind in a second version of a group.
    const KINDS: &[MergedKind<'static>] = &[
        ("", "v1", "pods"),
        ("", "v1", "configmaps"),
        ("apps", "v1", "deployments"),
        ("events.k8s.io", "v1beta1", "events"),
    ];

    fn filtered(document: Document<'_>, file: &str) -> Value {
        let body = document
            .filter(&recorded(&format!("discovery/{file}")), KINDS)
            .unwrap()
            .unwrap();
        assert_eq!(body.last(), Some(&b'\n'));
        serde_json::from_slice(&body).unwrap()
    }

    fn names(list: &Value, key: &str, field: &str) -> Vec<String> {
        list[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e[field].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn a_recorded_resource_list_keeps_merged_resources_and_their_subresources() {
        let core = filtered(
            Document::Resources {
                group: "",
                version: "v1",
            },
            "api-v1.json",
        );
        assert_eq!(core["kind"], "APIResourceList");
        assert!(
            core.get("apiVersion").is_none(),
            "kept as the member wrote it"
        );
        let kept = names(&core, "resources", "name");
        assert!(kept.contains(&"pods".to_owned()), "{kept:?}");
        assert!(kept.contains(&"pods/log".to_owned()), "{kept:?}");
        assert!(kept.contains(&"pods/exec".to_owned()), "{kept:?}");
        assert!(kept.contains(&"configmaps".to_owned()), "{kept:?}");
        assert!(kept
            .iter()
            .all(|n| n.starts_with("pods") || n == "configmaps"));
        let apps = filtered(
            Document::Resources {
                group: "apps",
                version: "v1",
            },
            "apis-apps-v1.json",
        );
        let kept = names(&apps, "resources", "name");
        assert!(kept.contains(&"deployments/scale".to_owned()), "{kept:?}");
        assert!(kept
            .iter()
            .all(|n| n.starts_with("deployments/") || n == "deployments"));
    }

    #[test]
    fn recorded_group_lists_keep_groups_and_versions_with_a_merged_kind() {
        let groups = filtered(Document::Groups, "apis.json");
        assert_eq!(names(&groups, "groups", "name"), ["apps", "events.k8s.io"]);
        let events = &groups["groups"][1];
        assert_eq!(events["versions"].as_array().unwrap().len(), 1);
        assert_eq!(events["versions"][0]["version"], "v1beta1");
        assert_eq!(
            events["preferredVersion"]["version"], "v1beta1",
            "the preferred version is one the view serves"
        );
        let apps = filtered(Document::Group("apps"), "apis-apps.json");
        assert_eq!(apps["kind"], "APIGroup");
        assert_eq!(apps["preferredVersion"]["groupVersion"], "apps/v1");
        let versions = filtered(Document::Versions, "api.json");
        assert_eq!(versions["versions"], serde_json::json!(["v1"]));
        assert_eq!(
            versions["serverAddressByClientCIDRs"],
            serde_json::json!([]),
            "no member address"
        );
    }

    #[test]
    fn unmerged_groups_and_versions_are_not_found() {
        let none: &[MergedKind<'_>] = &[("apps", "v1", "deployments")];
        assert!(!Document::Versions.shows_any(none));
        assert!(Document::Groups.shows_any(none));
        assert!(!Document::Group("batch").shows_any(none));
        assert!(!Document::Resources {
            group: "apps",
            version: "v1beta1"
        }
        .shows_any(none));
        // A member whose document has none of them left.
        let core = Document::Resources {
            group: "",
            version: "v1",
        };
        assert_eq!(
            core.filter(&recorded("discovery/api-v1.json"), &[("", "v1", "nothing")]),
            Ok(None)
        );
        assert_eq!(
            Document::Group("apps")
                .filter(&recorded("discovery/apis-apps.json"), &[("", "v1", "pods")]),
            Ok(None)
        );
    }

    #[test]
    fn hostile_documents_are_refused_without_panicking() {
        for bad in crate::testing::byte_cases("member-json-hostile") {
            for doc in [
                Document::Groups,
                Document::Versions,
                Document::Resources {
                    group: "",
                    version: "v1",
                },
            ] {
                let _ = doc.filter(&bad, KINDS);
            }
        }
        let odd = br#"{"groups":[1,{"name":"apps","versions":5},{"name":"apps"},{"name":"apps","versions":[{"version":"v1"}],"preferredVersion":7}]}"#;
        let out = Document::Groups.filter(odd, KINDS).unwrap().unwrap();
        let out: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(out["groups"].as_array().unwrap().len(), 1);
        assert_eq!(out["groups"][0]["preferredVersion"]["version"], "v1");
    }

    #[test]
    fn only_a_plain_json_accept_is_served() {
        let accepts = |values: &[&str]| accepts_json(values.iter().map(|v| v.as_bytes()));
        // What kubectl 1.32 sends for /api and /apis, and for the rest.
        assert!(accepts(&["application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"]));
        assert!(accepts(&["application/json, */*"]));
        assert!(accepts(&[]));
        assert!(accepts(&["*/*"]));
        assert!(accepts(&["text/html", "Application/JSON; charset=utf-8"]));
        assert!(!accepts(&[
            "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
        ]));
        assert!(!accepts(&["application/json;as=Table;v=v1;g=meta.k8s.io"]));
        assert!(!accepts(&["application/yaml"]));
        assert!(!accepts(&["application/json;q=0"]));
        assert!(!accepts(&["application/vnd.kubernetes.protobuf"]));
    }
}
