//! What the unit tests of several stations share, a leaf that imports no station (so a low
//! station's tests need not reach up to a higher one): a routing table built from YAML.

use fleetgate_config_watcher::RouteTable;

/// A routing table of a minimal Gateway and the `clusters` objects (YAML), for unit tests.
pub(crate) fn test_table(clusters: &str) -> RouteTable {
    let yaml = format!(
        "apiVersion: fleetgate.io/v1alpha1\nkind: Gateway\nmetadata: {{name: g}}\nspec:\n  \
         listeners: [{{name: http, address: \"127.0.0.1:0\", tls: false}}]\n---\n{clusters}"
    );
    let files = [(std::path::PathBuf::from("/t/c.yaml"), yaml)];
    let config = fleetgate_config_watcher::load_texts(std::path::Path::new("/t"), &files).unwrap();
    RouteTable::build(&config).unwrap()
}
