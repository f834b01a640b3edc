//! The one error type of the config-watcher: every error names where it came from (file, object,
//! field) so that an operator reading the log can fix the object without guessing.

use std::path::PathBuf;

/// Why a configuration could not be loaded or turned into a routing table. Cloned with the
/// loaded objects it is part of (the file source compares a load with the last one).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConfigError {
    /// A file or directory could not be read.
    #[error("{path}: cannot read")]
    Read {
        path: PathBuf,
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    /// A YAML document did not parse, or did not have the shape of its kind.
    #[error("{path}: document {index}: {message}")]
    Parse {
        path: PathBuf,
        index: usize,
        message: String,
    },
    /// An object parsed but one of its fields is not acceptable.
    #[error("{origin}: {kind} {name}: {field}: {message}")]
    Invalid {
        origin: String,
        kind: &'static str,
        name: String,
        field: &'static str,
        message: String,
    },
    /// The set of objects as a whole is not acceptable (no Gateway, two Gateways, a duplicate name).
    #[error("{0}")]
    Set(String),
}
