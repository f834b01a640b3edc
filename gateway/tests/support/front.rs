//! A TCP front that stays while the gateway behind it is replaced (as a Service stays while its
//! pod is), and kube-rs clients of the gateway's kubeconfig reaching it there. Used by the tests
//! that restart a gateway under running informers (`shared_watch.rs`, `cache_storm.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use super::fleet::Fleet;

/// A TCP front for the gateway: each connection it accepts is relayed to the gateway it points
/// at when the connection comes.
pub struct Front {
    pub addr: SocketAddr,
    /// Where the next connection goes (set it to a restarted gateway's listener).
    pub to: Arc<Mutex<SocketAddr>>,
}

impl Front {
    /// A front on 127.0.0.1:0 pointing at the fleet's running gateway, relaying on the fleet's
    /// runtime.
    pub fn start(fleet: &Fleet) -> Front {
        let listener = fleet
            .runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let to = Arc::new(Mutex::new(fleet.https()));
        let target = Arc::clone(&to);
        fleet.runtime.spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let gateway = *target.lock().unwrap();
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(gateway).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        Front { addr, to }
    }
}

/// A kube-rs client of the gateway's `context`, reaching the gateway at `at` (its own
/// listener, or a [`Front`] before it).
pub async fn gateway_client(fleet: &Fleet, context: &str, at: SocketAddr) -> Client {
    let text = std::fs::read_to_string(fleet.gateway_kubeconfig())
        .unwrap()
        .replace(
            &format!("https://{}/", fleet.https()),
            &format!("https://{at}/"),
        );
    let kubeconfig = Kubeconfig::from_yaml(&text).expect("kubeconfig");
    let options = KubeConfigOptions {
        context: Some(context.to_owned()),
        ..KubeConfigOptions::default()
    };
    let config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}
