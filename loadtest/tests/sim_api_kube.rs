//! The simulated member as kube-rs sees it: `Api<ConfigMap>` create, get, list with a label
//! selector, patch, a `kube::runtime::watcher` that observes the changes, and delete, through
//! `DIR/kubeconfig` (client-certificate authentication).

mod common;

use std::time::Duration;

use common::{kube_client, TestFleet};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::Api;

/// The test ConfigMaps' one data value, `data.k`.
fn value_of_k(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get("k").map(String::as_str)
}

#[test]
fn kube_rs_configmap_lifecycle_with_watcher() {
    let fleet = TestFleet::start(1);
    let kubeconfig_path = fleet.kubeconfig();
    fleet.runtime.block_on(async move {
        let client = kube_client(&kubeconfig_path).await;
        let api: Api<ConfigMap> = Api::namespaced(client, "default");

        // A watcher started before the changes sees them.
        let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
        let watch_api = api.clone();
        let watch_task = tokio::spawn(async move {
            let config = watcher::Config::default().labels("app=kube-rs");
            let mut stream = watcher(watch_api, config).boxed();
            while let Some(event) = stream.next().await {
                if events_tx.send(event.map_err(|e| e.to_string())).is_err() {
                    break;
                }
            }
        });
        // Wait until the watcher's initial list is done.
        loop {
            match tokio::time::timeout(Duration::from_secs(10), events_rx.recv()).await {
                Ok(Some(Ok(watcher::Event::InitDone))) => break,
                Ok(Some(Ok(_))) => continue,
                other => panic!("watcher did not initialise: {other:?}"),
            }
        }

        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "from-kube-rs", "labels": {"app": "kube-rs"}},
            "data": {"k": "v1"},
        }))
        .expect("ConfigMap");
        let created = api
            .create(&PostParams::default(), &cm)
            .await
            .expect("create");
        assert!(created.metadata.uid.is_some());
        assert!(created.metadata.resource_version.is_some());

        let fetched = api.get("from-kube-rs").await.expect("get");
        assert_eq!(value_of_k(&fetched), Some("v1"));

        let listed = api
            .list(&ListParams::default().labels("app=kube-rs"))
            .await
            .expect("list");
        assert_eq!(listed.items.len(), 1);
        let none = api
            .list(&ListParams::default().labels("app=other"))
            .await
            .expect("list");
        assert!(none.items.is_empty());

        let patched = api
            .patch(
                "from-kube-rs",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"data": {"k": "v2"}})),
            )
            .await
            .expect("patch");
        assert_eq!(value_of_k(&patched), Some("v2"));

        api.delete("from-kube-rs", &DeleteParams::default())
            .await
            .expect("delete");
        assert!(api
            .get_opt("from-kube-rs")
            .await
            .expect("get_opt")
            .is_none());

        // The watcher saw: applied v1, applied v2, deleted.
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let event = tokio::time::timeout(Duration::from_secs(10), events_rx.recv())
                .await
                .unwrap_or_else(|_| panic!("watcher events so far: {seen:?}"))
                .expect("watcher stream open")
                .expect("watcher event");
            match event {
                watcher::Event::Apply(cm) => {
                    seen.push(format!("apply {}", value_of_k(&cm).unwrap_or_default()))
                }
                watcher::Event::Delete(cm) => {
                    seen.push(format!("delete {}", cm.metadata.name.unwrap_or_default()))
                }
                _ => {}
            }
        }
        assert_eq!(seen, vec!["apply v1", "apply v2", "delete from-kube-rs"]);
        watch_task.abort();
    });
}

#[test]
fn kube_rs_streaming_list_watcher_initialises() {
    let fleet = TestFleet::start_with(1, 20, 0.0, Default::default());
    let kubeconfig_path = fleet.kubeconfig();
    fleet.runtime.block_on(async move {
        let client = kube_client(&kubeconfig_path).await;
        let api: Api<ConfigMap> = Api::all(client);
        // sendInitialEvents=true: the initial objects, then a BOOKMARK marking their end.
        let config = watcher::Config::default()
            .labels("fleetgate.io/load=true")
            .streaming_lists();
        let mut stream = watcher(api, config).boxed();
        let mut initial = 0;
        loop {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("watcher event within 10 s")
                .expect("stream open")
                .expect("event");
            match event {
                watcher::Event::InitApply(_) => initial += 1,
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
        assert_eq!(initial, 20);
    });
}
