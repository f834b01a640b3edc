//! Rotation without restart: a listener's rustls [`ServerConfig`] lives in an `ArcSwap`
//! ([`LiveServerConfig`]) that every accept loads (one atomic load and a reference count per
//! connection, never per request), and a thread of its own rebuilds it when what it is built from
//! changes. A connection keeps the configuration it was accepted with, so open connections (a
//! watch, an exec session) are untouched; only new ones see the new certificate or CA.
//!
//! What a configuration is built from is compared by content at every [`POLL_INTERVAL`]: the
//! serving certificate, key and client CA as the published routing table holds them (the
//! config-watcher reads their files again on its own poll, `fleetgate_config_watcher::POLL_INTERVAL`,
//! and refuses a broken one there), and, for the tunnel listener, the agent CA file read again
//! each time. Comparing contents rather than modification times is what sees a Secret mount's
//! `..data` symlink swap, and what ignores a file touched without change.
//!
//! Material that does not build (bad PEM, a key that is not the certificate's, an empty file caught
//! mid-write) leaves the last good configuration serving; it is reported once per distinct
//! content: a warning naming the file and the reason, and `fleetgate_reload_failures_total{what}`.
//! Never runs on a shard; the shards only load.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use fleetgate_config_watcher::ReloadStatus;
use rustls::ServerConfig;
use tracing::{info, warn};

/// A listener's TLS configuration, swapped whole on a rotation and loaded at each accept.
pub type LiveServerConfig = Arc<ArcSwap<ServerConfig>>;

/// How often the inputs of a configuration are compared with those it was built from.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the thread that keeps `live` built from the current `inputs`. `first` is what `live`
/// was built from at start (recorded as a success of `what`). `inputs` reads the current
/// material (its error names the file and the reason); `build` turns it into a configuration.
/// The thread ends when nothing but itself holds `live`.
pub fn watch<T, I, B>(
    what: &'static str,
    live: &LiveServerConfig,
    status: Arc<ReloadStatus>,
    first: T,
    inputs: I,
    build: B,
) -> std::io::Result<()>
where
    T: PartialEq + Send + 'static,
    I: FnMut() -> Result<T, String> + Send + 'static,
    B: Fn(&T) -> Result<Arc<ServerConfig>, String> + Send + 'static,
{
    status.record_material(what, true);
    let mut state = Rotation {
        what,
        live: Arc::downgrade(live),
        status,
        current: first,
        refused: None,
        inputs,
        build,
    };
    std::thread::Builder::new()
        .name(format!("fleetgate-tls-{what}"))
        .spawn(move || loop {
            std::thread::sleep(POLL_INTERVAL);
            if !state.poll() {
                return;
            }
        })?;
    Ok(())
}

/// One reloader's state between polls.
struct Rotation<T, I, B> {
    what: &'static str,
    live: Weak<ArcSwap<ServerConfig>>,
    status: Arc<ReloadStatus>,
    /// What the serving configuration was built from.
    current: T,
    /// The last refusal: its inputs when they were read but did not build, and why. Reported
    /// once; the same broken content seen again is not reported again.
    refused: Option<(Option<T>, String)>,
    inputs: I,
    build: B,
}

impl<T, I, B> Rotation<T, I, B>
where
    T: PartialEq,
    I: FnMut() -> Result<T, String>,
    B: Fn(&T) -> Result<Arc<ServerConfig>, String>,
{
    /// Compares, rebuilds and swaps when the inputs changed; `false` once nobody uses `live`.
    fn poll(&mut self) -> bool {
        let Some(live) = self.live.upgrade() else {
            return false;
        };
        let inputs = match (self.inputs)() {
            Ok(inputs) => inputs,
            Err(reason) => {
                self.refuse(None, reason);
                return true;
            }
        };
        if inputs == self.current {
            // Back to what serves (a broken write undone): nothing to build, nothing to report.
            self.refused = None;
            return true;
        }
        if matches!(&self.refused, Some((Some(refused), _)) if *refused == inputs) {
            return true;
        }
        match (self.build)(&inputs) {
            Ok(config) => {
                live.store(config);
                self.current = inputs;
                self.refused = None;
                self.status.record_material(self.what, true);
                info!(
                    what = self.what,
                    "TLS material reloaded: new connections use it"
                );
            }
            Err(reason) => self.refuse(Some(inputs), reason),
        }
        true
    }

    fn refuse(&mut self, inputs: Option<T>, reason: String) {
        let again = matches!(&self.refused, Some((i, r)) if *r == reason && *i == inputs);
        if !again {
            warn!(
                what = self.what,
                reason = %reason,
                "TLS material refused; the last good material keeps serving"
            );
            self.status.record_material(self.what, false);
        }
        self.refused = Some((inputs, reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> Arc<ServerConfig> {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config =
            ServerConfig::builder_with_provider(fleetgate_config_watcher::crypto_provider())
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![cert.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )
                .unwrap();
        Arc::new(config)
    }

    #[test]
    fn broken_material_keeps_the_last_good_and_is_reported_once() {
        let live: LiveServerConfig = Arc::new(ArcSwap::new(config("first")));
        let status = ReloadStatus::new();
        let input = Arc::new(ArcSwap::from_pointee(String::from("good-1")));
        let read = input.clone();
        let mut rotation = Rotation {
            what: "test",
            live: Arc::downgrade(&live),
            status: status.clone(),
            current: String::from("good-1"),
            refused: None,
            inputs: move || match read.load().as_str() {
                "unreadable" => Err("f: cannot read".to_owned()),
                text => Ok(text.to_owned()),
            },
            build: |text: &String| {
                if text.starts_with("good") {
                    Ok(config(text))
                } else {
                    Err(format!("{text}: not PEM"))
                }
            },
        };
        let serving = || Arc::as_ptr(&live.load_full());
        let before = serving();
        assert!(rotation.poll());
        assert_eq!(serving(), before, "unchanged inputs rebuild nothing");
        for broken in ["broken", "broken", "unreadable", "unreadable"] {
            input.store(Arc::new(broken.to_owned()));
            assert!(rotation.poll());
            assert_eq!(serving(), before, "{broken}: the last good keeps serving");
        }
        assert_eq!(
            status.material_failures("test"),
            2,
            "each refusal counted once"
        );
        input.store(Arc::new("good-2".to_owned()));
        assert!(rotation.poll());
        assert_ne!(serving(), before, "good material is swapped in");
        drop(live);
        assert!(!rotation.poll(), "the thread ends with its listener");
    }
}
