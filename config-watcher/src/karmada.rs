//! Karmada `cluster.karmada.io/v1alpha1` Cluster objects and the `v1` Secrets they reference,
//! translated into fleetgate clusters, so that a Karmada control plane can be pointed at as it is.
//!
//! The translation (Karmada field -> fleetgate field):
//! - `spec.apiEndpoint` -> `server`;
//! - `spec.secretRef` -> a Secret whose `caBundle` is the member's CA and whose `token` is the
//!   credential, unless `spec.impersonatorSecretRef` names a Secret whose `token` is used instead
//!   (Karmada's proxy authenticates with the impersonator token and impersonates the user, and so
//!   does fleetgate: impersonation is always on for Karmada clusters);
//! - `spec.insecureSkipTLSVerification` -> `insecureSkipTLSVerify`;
//! - `spec.proxyURL` / `spec.proxyHeader` -> the egress proxy and its CONNECT headers;
//! - `metadata.labels` -> labels (AccessPolicy selectors match them).
//!
//! Fields fleetgate has no use for (provider, region, taints, resource models, status) are
//! accepted and ignored: these objects are written by Karmada, not by a fleetgate operator.
//!
//! Pure functions over parsed objects: both the file source and the Kubernetes API source call
//! [`karmada_cluster_config`] with their own way of finding Secrets. Nothing here does I/O.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::checks::{check_cluster_name, check_proxy_headers, check_proxy_url, check_token};
use crate::error::ConfigError;
use crate::objects::{ConnectMode, ObjectMeta};
use crate::settings::ClusterConfig;

/// The API version of Karmada's Cluster objects.
pub const KARMADA_API_VERSION: &str = "cluster.karmada.io/v1alpha1";

/// How errors name a Karmada Cluster (`resource.group`, as kubectl does).
pub const KARMADA_CLUSTER_KIND: &str = "Cluster.cluster.karmada.io";

/// `cluster.karmada.io/v1alpha1` `Cluster`: the fields fleetgate reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KarmadaClusterObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: KarmadaClusterSpec,
}

/// The part of Karmada's `ClusterSpec` that says how to reach the member.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KarmadaClusterSpec {
    /// `Push` or `Pull`; both are reached at `apiEndpoint` (as Karmada's own proxy does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretReference>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub impersonator_secret_ref: Option<SecretReference>,
    #[serde(default, rename = "insecureSkipTLSVerification")]
    pub insecure_skip_tls_verification: bool,
    #[serde(default, rename = "proxyURL", skip_serializing_if = "Option::is_none")]
    pub proxy_url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub proxy_header: BTreeMap<String, String>,
}

/// Karmada's `LocalSecretReference`: a Secret in the control plane, by namespace and name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretReference {
    #[serde(default)]
    pub namespace: String,
    pub name: String,
}

/// A `v1` Secret as written in a file or returned by the API: `data` is base64, `stringData`
/// (files only) is plain text and wins over `data` for the same key, as the API server merges it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretObject {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub data: BTreeMap<String, String>,
    #[serde(default)]
    pub string_data: BTreeMap<String, String>,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
}

/// A Secret's decoded keys. `Debug` never prints values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretData {
    pub namespace: String,
    pub name: String,
    pub values: BTreeMap<String, Vec<u8>>,
}

impl std::fmt::Debug for SecretData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretData")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("keys", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// The namespace an object without one is in.
fn namespace_or_default(namespace: Option<&str>) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => ns.to_owned(),
        _ => "default".to_owned(),
    }
}

impl SecretData {
    /// Decodes a Secret object; an error names the key that is not base64.
    pub fn from_object(obj: &SecretObject, origin: &str) -> Result<SecretData, ConfigError> {
        let name = obj.metadata.name.clone();
        let mut values = BTreeMap::new();
        for (key, encoded) in &obj.data {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|e| ConfigError::Invalid {
                    origin: origin.to_owned(),
                    kind: "Secret",
                    name: name.clone(),
                    field: "data",
                    message: format!("key {key:?} is not base64: {e}"),
                })?;
            values.insert(key.clone(), decoded);
        }
        for (key, text) in &obj.string_data {
            values.insert(key.clone(), text.clone().into_bytes());
        }
        Ok(SecretData {
            namespace: namespace_or_default(obj.metadata.namespace.as_deref()),
            name,
            values,
        })
    }

    fn text(&self, key: &str) -> Option<Result<String, String>> {
        self.values.get(key).map(|v| {
            String::from_utf8(v.clone())
                .map(|s| s.trim().to_owned())
                .map_err(|_| {
                    format!(
                        "Secret {}/{}: {key} is not UTF-8",
                        self.namespace, self.name
                    )
                })
        })
    }
}

/// Translates a Karmada Cluster into a fleetgate cluster. `secret` finds a Secret by namespace and
/// name; `origin` names where the object came from (a file, or `karmada:NAME` for the API).
pub fn karmada_cluster_config(
    obj: &KarmadaClusterObject,
    origin: &str,
    secret: &dyn Fn(&str, &str) -> Option<SecretData>,
) -> Result<ClusterConfig, ConfigError> {
    let name = obj.metadata.name.clone();
    let invalid = |field: &'static str, message: String| ConfigError::Invalid {
        origin: origin.to_owned(),
        kind: KARMADA_CLUSTER_KIND,
        name: name.clone(),
        field,
        message,
    };
    check_cluster_name(&name).map_err(|m| invalid("metadata.name", m))?;
    let spec = &obj.spec;
    let server = spec
        .api_endpoint
        .clone()
        .filter(|e| !e.is_empty())
        .ok_or_else(|| invalid("spec.apiEndpoint", "required".into()))?;
    crate::table::parse_server(&server).map_err(|m| invalid("spec.apiEndpoint", m))?;
    let find = |field: &'static str, r: &SecretReference| {
        let namespace = namespace_or_default(Some(&r.namespace));
        secret(&namespace, &r.name)
            .ok_or_else(|| invalid(field, format!("Secret {namespace}/{} not found", r.name)))
    };
    let cluster_secret = spec
        .secret_ref
        .as_ref()
        .map(|r| find("spec.secretRef", r))
        .transpose()?;
    let impersonator_secret = spec
        .impersonator_secret_ref
        .as_ref()
        .map(|r| find("spec.impersonatorSecretRef", r))
        .transpose()?;
    let ca_pem = match cluster_secret
        .as_ref()
        .and_then(|s| s.values.get("caBundle"))
    {
        Some(pem) if !pem.is_empty() => {
            crate::table::parse_certs(pem)
                .map_err(|m| invalid("spec.secretRef", format!("caBundle: {m}")))?;
            Some(pem.clone())
        }
        _ => None,
    };
    let token = match (&impersonator_secret, &cluster_secret) {
        (Some(s), _) => Some(
            s.text("token")
                .ok_or_else(|| {
                    invalid(
                        "spec.impersonatorSecretRef",
                        format!("Secret {}/{} has no token", s.namespace, s.name),
                    )
                })?
                .map_err(|m| invalid("spec.impersonatorSecretRef", m))?,
        ),
        (None, Some(s)) => s
            .text("token")
            .transpose()
            .map_err(|m| invalid("spec.secretRef", m))?,
        (None, None) => None,
    };
    if let Some(t) = &token {
        let field = if impersonator_secret.is_some() {
            "spec.impersonatorSecretRef"
        } else {
            "spec.secretRef"
        };
        check_token(t).map_err(|m| invalid(field, format!("token: {m}")))?;
    }
    if ca_pem.is_none() && !spec.insecure_skip_tls_verification && server.starts_with("https:") {
        return Err(invalid(
            "spec.secretRef",
            "an https apiEndpoint needs a caBundle in the referenced Secret (or insecureSkipTLSVerification)"
                .into(),
        ));
    }
    let proxy_url = spec.proxy_url.clone().filter(|u| !u.is_empty());
    if let Some(url) = &proxy_url {
        check_proxy_url(url).map_err(|m| invalid("spec.proxyURL", m))?;
    }
    check_proxy_headers(proxy_url.as_deref(), &spec.proxy_header)
        .map_err(|m| invalid("spec.proxyHeader", m))?;
    Ok(ClusterConfig {
        name: name.clone(),
        labels: obj.metadata.labels.clone(),
        origin: origin.to_owned(),
        server,
        ca_pem,
        insecure_skip_tls_verify: spec.insecure_skip_tls_verification,
        token,
        client_cert_pem: None,
        client_key_pem: None,
        impersonation: true,
        pass_through: false,
        mode: ConnectMode::Direct,
        proxy_url,
        proxy_headers: spec.proxy_header.clone(),
        tunnel_address: None,
    })
}
