//! Which field selectors kube-apiserver itself serves, per resource, and how it reads each of
//! those fields from an object: so a selector on a field the member serves behaves exactly as
//! the member, and a gateway can tell a selector the member would refuse (a 400) from one it
//! would answer. `watch::plan` asks it whether the member answers a selector (then a metadata
//! one is served on any shared resource, and a LIST the cache cannot serve fresh enough is the
//! member's); the any-field reading ([`super::any_field::Reading::Member`], `super::lazy`) reads
//! the member's fields its way.
//!
//! The table is kube-apiserver v1.24's (the version the simulated fleet and the recorded
//! fixtures are), from kubernetes/kubernetes:
//! - the fields accepted: each kind's field-label conversion function
//!   (`pkg/apis/core/v1/conversion.go` `addConversionFuncs` and `AddFieldLabelConversionsFor*`,
//!   `pkg/apis/events/v1/conversion.go`, `pkg/apis/batch/v1/conversion.go`,
//!   `pkg/apis/certificates/v1/conversion.go`); a kind without one (every other built-in kind
//!   and every custom resource) gets `runtime.DefaultMetaV1FieldSelectorConversion`:
//!   `metadata.name` and `metadata.namespace` only;
//! - how each reads: the kind's `ToSelectableFields` in `pkg/registry/*/strategy.go` (a
//!   missing count reads `0` through `strconv.Itoa`, a missing bool `false` through
//!   `fmt.Sprint`, events' `source` falls back to the reporting controller).
//!
//! Later versions serve more (pods `spec.hostNetwork` from v1.28, services `spec.clusterIP`
//! from v1.30 and `spec.type` from v1.31); each reads as its JSON path, so the any-field
//! reading already selects on them as those members do.

use serde_json::Value;

use super::field_text::{walk, FieldText};

/// How the member reads one field it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberField {
    /// The value at this dot-separated JSON path: a string as itself, missing as `""`.
    Path(&'static str),
    /// A whole number at this path, missing as `0`.
    Count(&'static str),
    /// A bool at this path, missing as `false`.
    Flag(&'static str),
    /// The first path's string, or the second's when the first is empty or missing.
    Either(&'static str, &'static str),
    /// Accepted, never set by the member: always `""` (pods' `status.podIPs`).
    Unset,
}

impl MemberField {
    /// This field of `object`, as the member reads it.
    pub fn read(self, object: &Value) -> FieldText<'_> {
        let at = |path: &'static str| walk(object, path.split('.'));
        let or = |path, default: &'static str| match at(path) {
            None | Some(Value::Null) => FieldText::Text(default.into()),
            found => FieldText::of(found),
        };
        match self {
            MemberField::Path(path) => FieldText::of(at(path)),
            MemberField::Count(path) => or(path, "0"),
            MemberField::Flag(path) => or(path, "false"),
            MemberField::Either(first, second) => match FieldText::of(at(first)) {
                FieldText::Text(text) if text.is_empty() => FieldText::of(at(second)),
                text => text,
            },
            MemberField::Unset => FieldText::of(None),
        }
    }
}

use MemberField::{Count, Either, Flag, Path, Unset};

const NAME: (&str, MemberField) = ("metadata.name", Path("metadata.name"));
const NAMESPACE: (&str, MemberField) = ("metadata.namespace", Path("metadata.namespace"));

/// The fields one kind serves: each label a selector may name, and how the member reads it.
type Fields = &'static [(&'static str, MemberField)];

/// `runtime.DefaultMetaV1FieldSelectorConversion`: a kind without a conversion function.
const DEFAULT: Fields = &[NAME, NAMESPACE];

/// `(group, resource)`: the fields its conversion function accepts, and how each reads.
const KINDS: &[(&str, &str, Fields)] = &[
    (
        "",
        "pods",
        &[
            NAME,
            NAMESPACE,
            ("spec.nodeName", Path("spec.nodeName")),
            ("spec.restartPolicy", Path("spec.restartPolicy")),
            ("spec.schedulerName", Path("spec.schedulerName")),
            ("spec.serviceAccountName", Path("spec.serviceAccountName")),
            ("status.phase", Path("status.phase")),
            // The member reads status.podIPs[0]; v1 keeps status.podIP equal to it.
            ("status.podIP", Path("status.podIP")),
            // Accepted by the conversion function, absent from PodToSelectableFields.
            ("status.podIPs", Unset),
            ("status.nominatedNodeName", Path("status.nominatedNodeName")),
            // Old v1 clients' name for spec.nodeName.
            ("spec.host", Path("spec.nodeName")),
        ],
    ),
    (
        "",
        "nodes",
        &[NAME, ("spec.unschedulable", Flag("spec.unschedulable"))],
    ),
    (
        "",
        "namespaces",
        &[NAME, ("status.phase", Path("status.phase"))],
    ),
    ("", "secrets", &[NAME, NAMESPACE, ("type", Path("type"))]),
    (
        "",
        "replicationcontrollers",
        &[
            NAME,
            NAMESPACE,
            ("status.replicas", Count("status.replicas")),
        ],
    ),
    (
        "",
        "events",
        &[
            NAME,
            NAMESPACE,
            ("involvedObject.kind", Path("involvedObject.kind")),
            ("involvedObject.namespace", Path("involvedObject.namespace")),
            ("involvedObject.name", Path("involvedObject.name")),
            ("involvedObject.uid", Path("involvedObject.uid")),
            (
                "involvedObject.apiVersion",
                Path("involvedObject.apiVersion"),
            ),
            (
                "involvedObject.resourceVersion",
                Path("involvedObject.resourceVersion"),
            ),
            ("involvedObject.fieldPath", Path("involvedObject.fieldPath")),
            ("reason", Path("reason")),
            ("reportingComponent", Path("reportingComponent")),
            ("source", Either("source.component", "reportingComponent")),
            ("type", Path("type")),
        ],
    ),
    // The same events in events.k8s.io/v1's shape: the labels are its own field names.
    (
        "events.k8s.io",
        "events",
        &[
            NAME,
            NAMESPACE,
            ("regarding.kind", Path("regarding.kind")),
            ("regarding.namespace", Path("regarding.namespace")),
            ("regarding.name", Path("regarding.name")),
            ("regarding.uid", Path("regarding.uid")),
            ("regarding.apiVersion", Path("regarding.apiVersion")),
            (
                "regarding.resourceVersion",
                Path("regarding.resourceVersion"),
            ),
            ("regarding.fieldPath", Path("regarding.fieldPath")),
            ("reason", Path("reason")),
            ("reportingController", Path("reportingController")),
            ("type", Path("type")),
        ],
    ),
    // The label says successful; the member reads status.succeeded.
    (
        "batch",
        "jobs",
        &[
            NAME,
            NAMESPACE,
            ("status.successful", Count("status.succeeded")),
        ],
    ),
    (
        "certificates.k8s.io",
        "certificatesigningrequests",
        &[NAME, ("spec.signerName", Path("spec.signerName"))],
    ),
];

/// How the member reads `field` (as a selector writes it) of `resource` in `group` (`""`: the
/// core group), or `None` when the member refuses a selector on it with a 400.
pub fn member_field(group: &str, resource: &str, field: &str) -> Option<MemberField> {
    let fields = KINDS
        .iter()
        .find(|(g, r, _)| *g == group && *r == resource)
        .map_or(DEFAULT, |(_, _, fields)| *fields);
    fields
        .iter()
        .find(|(label, _)| *label == field)
        .map(|(_, read)| *read)
}

/// Whether kube-apiserver serves a field selector on `field` of `resource` in `group`.
pub fn member_supports(group: &str, resource: &str, field: &str) -> bool {
    member_field(group, resource, field).is_some()
}
