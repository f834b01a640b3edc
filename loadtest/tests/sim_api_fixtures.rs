//! The member's answers to the requests recorded from a real kube-apiserver v1.24
//! (the recorded fixtures' `errors/` and `objects/`): the same request gets the
//! same status code and the same Status object (compared as JSON values; key order aside). The
//! expected bodies are copied here from the fixtures so the test stands alone.

mod common;

use bytes::Bytes;
use common::{raw, TestFleet};
use http_body_util::Full;
use serde_json::{json, Value};

struct Case {
    what: &'static str,
    method: &'static str,
    path: &'static str,
    content_type: Option<&'static str>,
    body: &'static str,
    code: u16,
    expected: &'static str,
}

const CASES: &[Case] = &[
    Case {
        what: "errors/400-malformed-json.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"broken""#,
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the object provided is unrecognized (must be of type ConfigMap): couldn't get version/kind; json parse error: unexpected end of JSON input ({\"apiVersion\":\"v1\",\"kind\":\"Con ...)","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "errors/400-wrong-type-field.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"typed"},"data":{"k":123}}"#,
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ConfigMap.data of type string","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "errors/400-wrong-kind-for-endpoint.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s"}}"#,
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Secret in version \"v1\" cannot be handled as a ConfigMap: converting (v1.Secret) to (core.ConfigMap): unknown conversion","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "errors/400-namespace-mismatch.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m","namespace":"default"}}"#,
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the namespace of the provided object does not match the namespace sent on the request","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "errors/404-post-into-missing-namespace.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures-does-not-exist/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}"#,
        code: 404,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"namespaces \"fixtures-does-not-exist\" not found","reason":"NotFound","details":{"name":"fixtures-does-not-exist","kind":"namespaces"},"code":404}"#,
    },
    Case {
        what: "errors/404-configmap-not-found.json",
        method: "GET",
        path: "/api/v1/namespaces/fixtures/configmaps/does-not-exist",
        content_type: None,
        body: "",
        code: 404,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"does-not-exist\" not found","reason":"NotFound","details":{"name":"does-not-exist","kind":"configmaps"},"code":404}"#,
    },
    Case {
        what: "errors/404-unknown-resource-apps.json",
        method: "GET",
        path: "/apis/apps/v1/namespaces/fixtures/nosuchresources",
        content_type: None,
        body: "",
        code: 404,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
    },
    Case {
        what: "errors/409-already-exists.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fixture-cm"}}"#,
        code: 409,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"configmaps \"fixture-cm\" already exists","reason":"AlreadyExists","details":{"name":"fixture-cm","kind":"configmaps"},"code":409}"#,
    },
    Case {
        what: "errors/405-post-on-item.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps/fixture-cm",
        content_type: Some("application/json"),
        body: "{}",
        code: 405,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server does not allow this method on the requested resource","reason":"MethodNotAllowed","details":{},"code":405}"#,
    },
    Case {
        what: "errors/415-content-type-text.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("text/plain"),
        body: "hello",
        code: 415,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf","reason":"UnsupportedMediaType","code":415}"#,
    },
    Case {
        what: "errors/422-invalid-name.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/configmaps",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Bad_Name!"},"data":{"bad key":"v"}}"#,
        code: 422,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ConfigMap \"Bad_Name!\" is invalid: [metadata.name: Invalid value: \"Bad_Name!\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*'), data[bad key]: Invalid value: \"bad key\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')]","reason":"Invalid","details":{"name":"Bad_Name!","kind":"ConfigMap","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"Bad_Name!\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')","field":"metadata.name"},{"reason":"FieldValueInvalid","message":"Invalid value: \"bad key\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')","field":"data[bad key]"}]},"code":422}"#,
    },
    Case {
        what: "errors/422-invalid-pod.json",
        method: "POST",
        path: "/api/v1/namespaces/fixtures/pods",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bad-pod"},"spec":{"containers":[{"name":"Main_C","image":""}]}}"#,
        code: 422,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Pod \"bad-pod\" is invalid: [spec.containers[0].name: Invalid value: \"Main_C\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?'), spec.containers[0].image: Required value]","reason":"Invalid","details":{"name":"bad-pod","kind":"Pod","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: \"Main_C\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')","field":"spec.containers[0].name"},{"reason":"FieldValueRequired","message":"Required value","field":"spec.containers[0].image"}]},"code":422}"#,
    },
    Case {
        what: "errors/422-list-resourceversionmatch-without-resourceversion.json",
        method: "GET",
        path: "/api/v1/namespaces/fixtures/configmaps?resourceVersionMatch=Exact",
        content_type: None,
        body: "",
        code: 422,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided","reason":"Invalid","details":{"group":"meta.k8s.io","kind":"ListOptions","causes":[{"reason":"FieldValueForbidden","message":"Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided","field":"resourceVersionMatch"}]},"code":422}"#,
    },
    Case {
        what: "errors/400-bad-label-selector.json",
        method: "GET",
        path: "/api/v1/namespaces/fixtures/configmaps?labelSelector=app%3D%3D%3Dx%21",
        content_type: None,
        body: "",
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"unable to parse requirement: found '=', expected: identifier","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "objects/configmap-list-fieldselector-unsupported.json",
        method: "GET",
        path: "/api/v1/namespaces/fixtures/configmaps?fieldSelector=data.k1%3Dv1",
        content_type: None,
        body: "",
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"\"data.k1\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "objects/configmap-patch-unsupported-content-type.json",
        method: "PATCH",
        path: "/api/v1/namespaces/fixtures/configmaps/fixture-cm",
        content_type: Some("application/json"),
        body: r#"{"data":{"x":"y"}}"#,
        code: 415,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"415: Unsupported Media Type","reason":"UnsupportedMediaType","details":{},"code":415}"#,
    },
    Case {
        what: "objects/configmap-patch-json-test-failed.json",
        method: "PATCH",
        path: "/api/v1/namespaces/fixtures/configmaps/fixture-cm",
        content_type: Some("application/json-patch+json"),
        body: r#"[{"op":"test","path":"/data/k1","value":"WRONG"}]"#,
        code: 422,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server rejected our request due to an error in our request","reason":"Invalid","details":{},"code":422}"#,
    },
    Case {
        what: "objects/configmap-patch-apply-no-fieldmanager.json",
        method: "PATCH",
        path: "/api/v1/namespaces/fixtures/configmaps/fixture-cm",
        content_type: Some("application/apply-patch+yaml"),
        body: "data:\n  k1: v1\n",
        code: 422,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch","reason":"Invalid","details":{"group":"meta.k8s.io","kind":"PatchOptions","causes":[{"reason":"FieldValueRequired","message":"Required value: is required for apply patch","field":"fieldManager"}]},"code":422}"#,
    },
    Case {
        what: "objects/configmap-put-name-mismatch.json",
        method: "PUT",
        path: "/api/v1/namespaces/fixtures/configmaps/fixture-cm",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"other-name","namespace":"fixtures"},"data":{"k1":"v1"}}"#,
        code: 400,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the name of the object (other-name) does not match the name on the URL (fixture-cm)","reason":"BadRequest","code":400}"#,
    },
    Case {
        what: "objects/configmap-put-stale-resourceversion.json",
        method: "PUT",
        path: "/api/v1/namespaces/fixtures/configmaps/fixture-cm",
        content_type: Some("application/json"),
        body: r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fixture-cm","namespace":"fixtures","resourceVersion":"1"},"data":{"k1":"v1"}}"#,
        code: 409,
        expected: r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on configmaps \"fixture-cm\": the object has been modified; please apply your changes to the latest version and try again","reason":"Conflict","details":{"name":"fixture-cm","kind":"configmaps"},"code":409}"#,
    },
];

fn request(case: &Case, token: &str) -> http::Request<Full<Bytes>> {
    let body = Bytes::from_static(case.body.as_bytes());
    raw::with_body(case.method, case.path, token, case.content_type, body)
}

#[test]
fn recorded_error_statuses_match() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        // The recording's setup: namespace `fixtures` and ConfigMap `fixture-cm`.
        for (path, body) in [
            ("/api/v1/namespaces", json!({"apiVersion":"v1","kind":"Namespace","metadata":{"name":"fixtures"}})),
            (
                "/api/v1/namespaces/fixtures/configmaps",
                json!({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"fixture-cm"},"data":{"k1":"v1"}}),
            ),
        ] {
            let req = raw::post_json(path, &token, body.to_string());
            let (parts, _) = raw::request(addr, &ca, req).await;
            assert_eq!(parts.status, 201, "{path}");
        }
        let mut mismatches = Vec::new();
        for case in CASES {
            let (parts, body) = raw::request(addr, &ca, request(case, &token)).await;
            let got: Value = serde_json::from_slice(&body).unwrap_or_else(|_| {
                Value::String(String::from_utf8_lossy(&body).into_owned())
            });
            let expected: Value = serde_json::from_str(case.expected).expect("fixture JSON");
            if parts.status.as_u16() != case.code || got != expected {
                mismatches.push(format!(
                    "{}: got {} {got}\n  expected {} {expected}",
                    case.what, parts.status, case.code
                ));
            }
        }
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    });
}

#[test]
fn malformed_object_shapes_are_400_not_dropped_connections() {
    let fleet = TestFleet::start(1);
    let (addr, ca, token) = fleet.first_member();
    fleet.runtime.block_on(async {
        for (path, body) in [
            (
                "/api/v1/namespaces/default/configmaps",
                r#"{"metadata":{"name":"x","labels":"not-a-map"}}"#,
            ),
            (
                "/api/v1/namespaces/default/configmaps",
                r#"{"metadata":"nope"}"#,
            ),
            (
                "/api/v1/namespaces/default/pods",
                r#"{"metadata":{"name":"p"},"spec":{"containers":"main"}}"#,
            ),
            (
                "/api/v1/namespaces",
                r#"{"metadata":{"name":"n"},"spec":"x"}"#,
            ),
            (
                "/apis/apps/v1/namespaces/default/deployments",
                r#"{"metadata":{"name":"d"},"spec":[1]}"#,
            ),
        ] {
            let req = raw::post_json(path, &token, Bytes::from_static(body.as_bytes()));
            let (parts, body_bytes) = raw::request(addr, &ca, req).await;
            assert_eq!(parts.status, 400, "{path} {body}");
            let status: Value = serde_json::from_slice(&body_bytes).expect("Status");
            assert!(
                status["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("cannot unmarshal"),
                "{status}"
            );
        }
    });
}
