//! A Table LIST's rows from a Table hub's objects (`kubectl get` without `-o`): each object is
//! a one-row Table as the member rendered it when the object last changed, so its `Age` cell is
//! as old as that change. The row goes out with `Age` computed again, as kube-apiserver computes
//! it when it renders (Go's `duration.HumanDuration` of the time since the row's
//! `metadata.creationTimestamp`). Other cells that tell a time relative to now (a pod's
//! `Restarts` since kube 1.24 says "(5m ago)") are the member's, as of its rendering.

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Where the `Age` column is among the column definitions (JSON), if there is one.
pub fn age_column(columns: &[u8]) -> Option<usize> {
    let columns: Vec<Value> = serde_json::from_slice(columns).ok()?;
    columns
        .iter()
        .position(|c| c.get("name").and_then(Value::as_str) == Some("Age"))
}

/// The row of a one-row Table object, its `Age` cell (at `age`) computed for `now`; None when
/// the object is no such Table.
pub fn row(table: &[u8], age: Option<usize>, now: OffsetDateTime) -> Option<Vec<u8>> {
    let mut table: Value = serde_json::from_slice(table).ok()?;
    let row = table.get_mut("rows")?.get_mut(0)?;
    if let Some(age) = age {
        let created = row
            .get("object")
            .and_then(|o| o.get("metadata"))
            .and_then(|m| m.get("creationTimestamp"))
            .and_then(Value::as_str)
            .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok());
        if let (Some(created), Some(cell)) =
            (created, row.get_mut("cells").and_then(|c| c.get_mut(age)))
        {
            *cell = Value::String(human_duration((now - created).whole_seconds()));
        }
    }
    serde_json::to_vec(row).ok()
}

/// Go's `k8s.io/apimachinery/pkg/util/duration.HumanDuration`, in whole seconds.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = minutes / 60;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        for (seconds, text) in [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (29, "29s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (599, "9m59s"),
            (600, "10m"),
            (3600 * 3 - 1, "179m"),
            (3600 * 3, "3h"),
            (3600 * 5 + 60 * 7, "5h7m"),
            (3600 * 8, "8h"),
            (3600 * 47, "47h"),
            (3600 * 48, "2d"),
            (3600 * 50, "2d2h"),
            (86400 * 8, "8d"),
            (86400 * 729, "729d"),
            (86400 * 730, "2y"),
            (86400 * 731, "2y1d"),
            (86400 * 365 * 8, "8y"),
        ] {
            assert_eq!(human_duration(seconds), text, "{seconds}");
        }
    }

    #[test]
    fn a_rows_age_is_computed_again_and_the_rest_kept() {
        let table = br#"{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"5"},"rows":[{"cells":["cm",1,"3s"],"object":{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":"cm","creationTimestamp":"2026-11-29T10:00:00Z"}}}]}"#;
        let now = OffsetDateTime::parse("2026-11-29T10:05:07Z", &Rfc3339).unwrap();
        let row: Value = serde_json::from_slice(&row(table, Some(2), now).unwrap()).unwrap();
        assert_eq!(row["cells"], serde_json::json!(["cm", 1, "5m7s"]));
        assert_eq!(row["object"]["metadata"]["name"], "cm");
        // No Age column, or no timestamp: the cells as the member rendered them.
        let kept: Value = serde_json::from_slice(&super::row(table, None, now).unwrap()).unwrap();
        assert_eq!(kept["cells"][2], "3s");
        assert!(super::row(b"{\"rows\":[]}", Some(2), now).is_none());
        assert!(super::row(b"not json", Some(2), now).is_none());
    }

    #[test]
    fn the_age_column_is_found_by_name() {
        let columns = br#"[{"name":"Name"},{"name":"Data"},{"name":"Age"}]"#;
        assert_eq!(age_column(columns), Some(2));
        assert_eq!(age_column(br#"[{"name":"Name"}]"#), None);
        assert_eq!(age_column(b"{}"), None);
    }

    proptest! {
        #[test]
        fn any_duration_is_printed_without_a_panic(seconds in any::<i64>()) {
            prop_assert!(!human_duration(seconds).is_empty());
        }
    }
}
