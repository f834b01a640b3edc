//! A field selector a client forges (`?fieldSelector=`): whatever the bytes, the shared watch's
//! reading (`FieldSelector::parse`) and the any-field reading (`parse_any`) never panic; they
//! agree (what the first accepts the second accepts, and its metadata fast path is the same
//! selector); an accepted selector matches a fixed object the same way read whole, read into a
//! value set once, and (for the member's fields) as the member reads them; and the cache's lazy
//! reader (`AnyFields`, which decodes only the named fields out of an object's JSON bytes) agrees
//! with the whole reading. Bytes after a NUL are taken as an object's JSON (a member's, read by
//! the lazy reader): whatever they are, reading them never panics.
#![no_main]

use fleetgate::watch::selector::member::member_supports;
use fleetgate::watch::selector::{
    parse_any, AnyFields, FieldSelector, FieldValues, Reading, Refused, Within,
};
use libfuzzer_sys::fuzz_target;

fn object() -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "prod",
                     "labels": {"app.kubernetes.io/name": "web"},
                     "annotations": {"note": "a=b,c\\d"}},
        "spec": {"nodeName": "node-1", "replicas": 3, "unschedulable": true,
                 "containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running", "podIPs": [{"ip": "10.0.0.7"}], "nothing": null},
        "source": {"component": ""}, "reportingComponent": "kubelet"
    })
}

fuzz_target!(|data: &[u8]| {
    let (data, json) = match data.iter().position(|b| *b == 0) {
        Some(nul) => (&data[..nul], Some(&data[nul + 1..])),
        None => (data, None),
    };
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let any = parse_any(text);
    if let Ok(shared) = FieldSelector::parse(text) {
        let any = any
            .as_ref()
            .expect("what the shared watch reads, parse_any reads");
        assert_eq!(any.metadata_only().as_ref(), Some(&shared));
        assert_eq!(
            shared.matches("prod", "web-1"),
            any.matches(Reading::Json, &object())
        );
    }
    match any {
        Ok(selector) => {
            let object = object();
            let members = ["pods", "events", "nodes"].map(|resource| Reading::Member {
                group: "",
                resource,
            });
            for reading in std::iter::once(Reading::Json).chain(members) {
                let values = FieldValues::read(reading, &object, selector.paths());
                assert_eq!(
                    selector.matches_values(&values),
                    selector.matches(reading, &object)
                );
            }
            for path in selector.paths() {
                let _ = member_supports("", "pods", path.as_str());
            }
            let lazy = AnyFields::new(selector.clone(), "", "pods", Within::Object);
            let member = Reading::Member {
                group: "",
                resource: "pods",
            };
            let bytes = serde_json::to_vec(&object).expect("a Value encodes");
            assert_eq!(lazy.matches(&bytes), selector.matches(member, &object));
            if let Some(json) = json {
                let _ = lazy.matches(json);
                let _ = AnyFields::new(selector, "", "pods", Within::TableRow).matches(json);
            }
        }
        Err(Refused(message)) => assert!(!message.is_empty()),
    }
});
