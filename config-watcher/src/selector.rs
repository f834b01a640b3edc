//! Kubernetes label selectors (matchLabels and matchExpressions) evaluated against a cluster's
//! labels: which clusters an AccessPolicy covers and which a FleetResource merges from.

use crate::objects::LabelSelector;

/// Evaluates a label selector (matchLabels and matchExpressions; an empty selector matches
/// every cluster, as in Kubernetes).
pub fn matches(
    selector: &LabelSelector,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<bool, String> {
    for (key, value) in &selector.match_labels {
        if labels.get(key) != Some(value) {
            return Ok(false);
        }
    }
    for req in &selector.match_expressions {
        let value = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" => value.is_some_and(|v| req.values.contains(v)),
            "NotIn" => value.is_none_or(|v| !req.values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => {
                return Err(format!(
                    "operator {other:?} is not In, NotIn, Exists or DoesNotExist"
                ))
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}
