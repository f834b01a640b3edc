//! One member's page of a LIST, as the fleet view reads and re-writes it: the items (or a
//! Table's rows) each stamped with the cluster it came from, and the page's own metadata (the
//! member's resourceVersion and continue token, a Table's column definitions).
//!
//! A page is a member's answer, bounded by the page size the fleet view asked for; it is parsed
//! whole, its items written out one by one, and dropped before the next page is asked for.

use serde_json::{Map, Value};

/// Annotations every object served through the fleet view carries: fleetgate's, and
/// karmada-search's so that tools written for it keep working.
pub const CLUSTER_ANNOTATIONS: [&str; 2] = [
    "fleetgate.io/cluster",
    "resource.karmada.io/cached-from-cluster",
];

/// The column the fleet view puts first in a Table.
pub fn cluster_column() -> Value {
    serde_json::json!({
        "name": "Cluster",
        "type": "string",
        "format": "",
        "description": "The member cluster the object is in (fleetgate fleet view).",
        "priority": 0
    })
}

/// A member's page, parsed.
pub struct Page {
    /// `PodList` or `Table`, and its apiVersion.
    pub kind: String,
    pub api_version: String,
    pub resource_version: String,
    /// The member's continue token; empty at its last page.
    pub continue_token: String,
    /// A Table's column definitions (without the cluster column).
    pub columns: Option<Value>,
    /// Items, or a Table's rows.
    pub entries: Vec<Value>,
}

impl Page {
    pub fn is_table(&self) -> bool {
        self.kind == "Table"
    }

    /// The continue token of a member's 200 answer to a LIST, without parsing its items.
    pub fn continue_token(body: &[u8]) -> Result<String, &'static str> {
        #[derive(serde::Deserialize)]
        struct List {
            #[serde(default)]
            metadata: Meta,
        }
        #[derive(serde::Deserialize, Default)]
        struct Meta {
            #[serde(rename = "continue", default)]
            continue_token: String,
        }
        serde_json::from_slice::<List>(body)
            .map(|list| list.metadata.continue_token)
            .map_err(|_| "its list is not JSON")
    }

    /// Parses a member's 200 answer to a LIST.
    pub fn parse(body: &[u8]) -> Result<Page, &'static str> {
        let Value::Object(mut top) =
            serde_json::from_slice::<Value>(body).map_err(|_| "its list is not JSON")?
        else {
            return Err("its list is not a JSON object");
        };
        let text = |top: &Map<String, Value>, key: &str| {
            top.get(key)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let kind = text(&top, "kind");
        let api_version = text(&top, "apiVersion");
        let (resource_version, continue_token) = match top.get("metadata") {
            Some(Value::Object(meta)) => (text(meta, "resourceVersion"), text(meta, "continue")),
            _ => (String::new(), String::new()),
        };
        let table = kind == "Table";
        let entries = match top.remove(if table { "rows" } else { "items" }) {
            Some(Value::Array(entries)) => entries,
            Some(Value::Null) | None => Vec::new(),
            Some(_) => return Err("its list's items are not an array"),
        };
        let columns = if table {
            Some(
                top.remove("columnDefinitions")
                    .unwrap_or(Value::Array(Vec::new())),
            )
        } else {
            None
        };
        if kind.is_empty() || api_version.is_empty() {
            return Err("its list has no kind or apiVersion");
        }
        Ok(Page {
            kind,
            api_version,
            resource_version,
            continue_token,
            columns,
            entries,
        })
    }
}

/// A member's answer to a GET of one object (or its Table), stamped with `cluster` as list items
/// are (a Table also gets the CLUSTER column first); `None` when it is not a JSON object.
pub fn stamp_object(body: &[u8], cluster: &str) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    if !value.is_object() {
        return None;
    }
    if value.get("kind").and_then(Value::as_str) == Some("Table") {
        if let Some(Value::Array(columns)) = value.get_mut("columnDefinitions") {
            columns.insert(0, cluster_column());
        }
        if let Some(Value::Array(rows)) = value.get_mut("rows") {
            for row in rows {
                stamp(row, cluster, true);
            }
        }
    } else {
        stamp(&mut value, cluster, false);
    }
    let mut out = serde_json::to_vec(&value).ok()?;
    out.push(b'\n');
    Some(out)
}

/// Stamps one item (or Table row) with `cluster`: the annotations on the object, and for a row
/// the cluster cell first.
pub fn stamp(entry: &mut Value, cluster: &str, table: bool) {
    let object = if table {
        if let Some(Value::Array(cells)) = entry.get_mut("cells") {
            cells.insert(0, Value::String(cluster.to_owned()));
        }
        entry.get_mut("object")
    } else {
        Some(entry)
    };
    let Some(Value::Object(object)) = object else {
        return;
    };
    let metadata = object
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(metadata) = metadata else {
        return;
    };
    let annotations = metadata
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !annotations.is_object() {
        *annotations = Value::Object(Map::new());
    }
    if let Value::Object(annotations) = annotations {
        for key in CLUSTER_ANNOTATIONS {
            annotations.insert(key.to_owned(), Value::String(cluster.to_owned()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::recorded;

    #[test]
    fn a_recorded_pod_list_is_read_and_its_items_stamped() {
        let body = recorded("objects/pod-list.json");
        let mut page = Page::parse(&body).unwrap();
        assert_eq!(page.kind, "PodList");
        assert!(!page.is_table());
        assert!(!page.resource_version.is_empty());
        assert!(!page.entries.is_empty());
        for item in &mut page.entries {
            stamp(item, "member1", false);
            assert_eq!(
                item["metadata"]["annotations"]["fleetgate.io/cluster"],
                "member1"
            );
            assert_eq!(
                item["metadata"]["annotations"]["resource.karmada.io/cached-from-cluster"],
                "member1"
            );
        }
    }

    #[test]
    fn a_recorded_table_gets_the_cluster_cell_first() {
        let body = recorded("table/pods-list.json");
        let mut page = Page::parse(&body).unwrap();
        assert!(page.is_table());
        let columns = page.columns.as_ref().unwrap().as_array().unwrap().len();
        let row = &mut page.entries[0];
        let cells = row["cells"].as_array().unwrap().len();
        assert_eq!(cells, columns);
        stamp(row, "member2", true);
        assert_eq!(row["cells"][0], "member2");
        assert_eq!(row["cells"].as_array().unwrap().len(), columns + 1);
        assert_eq!(
            row["object"]["metadata"]["annotations"]["fleetgate.io/cluster"],
            "member2"
        );
    }

    #[test]
    fn hostile_pages_are_refused_or_stamped_without_panicking() {
        for bad in crate::testing::byte_cases("member-json-hostile") {
            assert!(
                Page::parse(&bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(&bad)
            );
        }
        for mut odd in [
            serde_json::json!(null),
            serde_json::json!({"metadata": 5}),
            serde_json::json!({"metadata": {"annotations": []}}),
            serde_json::json!({"cells": "x", "object": 1}),
        ] {
            stamp(&mut odd, "m", false);
            stamp(&mut odd, "m", true);
        }
    }
}
