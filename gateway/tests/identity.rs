//! Identity through `fleetgate serve` against the simulated fleet, with kubectl as the client:
//! for each authentication method (client certificate, token file, OIDC JWT, PassThrough of the
//! client's own token) `kubectl auth whoami` shows the user as the member saw it; AccessPolicy
//! denials (cluster, verb, namespace) are 403 Status naming the denial; `--as` needs the
//! `impersonate` grant, and `kubectl auth can-i --as` gets the member's answer for whoever the
//! client may impersonate; expired, wrongly signed and unknown credentials are 401; label
//! selectors choose clusters; a policy change on reload takes effect. Real processes: the fleet in this
//! test process, the gateway and kubectl as children.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use support::fleet::{raw_get, Fleet};
use support::kubectl::{groups_of, kubectl, succeeded};
use support::wait::wait_for_or;

/// A fleet of three members (member1 and member3 `env: dev`, member2 `env: prod`), plus, when
/// asked, `direct1`: member1 again as a PassThrough cluster labelled `env: dev`.
fn start(pass_through: bool) -> Fleet {
    let mut fleet = Fleet::sim(3, 2);
    let dir = fleet.dir().to_path_buf();
    if pass_through {
        let member1 = std::fs::read_to_string(dir.join("clusters/member1.yaml")).unwrap();
        let mut cluster: serde_yaml::Value = serde_yaml::from_str(&member1).unwrap();
        cluster["metadata"]["name"] = "direct1".into();
        cluster["spec"]["authMode"] = "PassThrough".into();
        cluster["spec"]
            .as_mapping_mut()
            .unwrap()
            .remove("credentials");
        std::fs::write(
            dir.join("clusters/direct1.yaml"),
            serde_yaml::to_string(&cluster).unwrap(),
        )
        .unwrap();
    }
    // A plaintext listener too: its clients are system:anonymous unless they bring a token.
    fleet.edit_gateway(|gateway| {
        let plain = "{name: plain, address: '127.0.0.1:0', tls: false}";
        let listeners = gateway["spec"]["listeners"].as_sequence_mut().unwrap();
        listeners.push(serde_yaml::from_str(plain).unwrap());
    });
    fleet.serve(&["--workers", "2"], None);
    fleet
}

/// How a kubeconfig user authenticates.
enum Cred<'a> {
    /// `users/NAME.crt` and `.key`.
    Cert(&'a str),
    /// A bearer token from a file under DIR (`users/alice.token`, `users/alice.jwt`).
    TokenFile(&'a str),
    /// A literal bearer token.
    Token(&'a str),
    /// No credential at all.
    Nothing,
}

impl Fleet {
    /// The plaintext (benchmark) listener added to the sim's Gateway.
    fn plain(&self) -> SocketAddr {
        self.ready().addr("plain")
    }

    /// Writes a kubeconfig with one context per cluster of `clusters` for `cred`, optionally
    /// impersonating (`as`, `as-groups`, `as-uid`, `as-user-extra`).
    /// A kubeconfig for the plaintext listener (member1 only), without credentials.
    fn plain_kubeconfig(&self, name: &str) -> PathBuf {
        let user = "{}";
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: member1, cluster: {{server: 'http://{}/clusters/member1'}}}}]\ncontexts: [{{name: member1, context: {{cluster: member1, user: u}}}}]\ncurrent-context: member1\nusers: [{{name: u, user: {user}}}]\n",
            self.plain()
        );
        let path = self.path(&format!("test-{name}.kubeconfig"));
        std::fs::write(&path, text).unwrap();
        path
    }

    fn kubeconfig(
        &self,
        name: &str,
        cred: Cred<'_>,
        impersonate: Option<serde_yaml::Value>,
    ) -> PathBuf {
        let ca = self.path("pki/gateway-ca.crt");
        let mut user = serde_yaml::Mapping::new();
        match cred {
            Cred::Cert(who) => {
                user.insert(
                    "client-certificate".into(),
                    self.path(&format!("users/{who}.crt"))
                        .display()
                        .to_string()
                        .into(),
                );
                user.insert(
                    "client-key".into(),
                    self.path(&format!("users/{who}.key"))
                        .display()
                        .to_string()
                        .into(),
                );
            }
            Cred::TokenFile(rel) => {
                let token = std::fs::read_to_string(self.path(rel)).unwrap();
                user.insert("token".into(), token.trim().into());
            }
            Cred::Token(token) => {
                user.insert("token".into(), token.into());
            }
            Cred::Nothing => {}
        }
        if let Some(serde_yaml::Value::Mapping(extra)) = impersonate {
            user.extend(extra);
        }
        let clusters: Vec<serde_yaml::Value> = ["member1", "member2", "member3", "direct1"]
            .iter()
            .map(|c| {
                serde_yaml::from_str(&format!(
                    "{{name: {c}, cluster: {{server: 'https://{}/clusters/{c}', certificate-authority: '{}'}}}}",
                    self.https(),
                    ca.display()
                ))
                .unwrap()
            })
            .collect();
        let contexts: Vec<serde_yaml::Value> = ["member1", "member2", "member3", "direct1"]
            .iter()
            .map(|c| {
                serde_yaml::from_str(&format!(
                    "{{name: {c}, context: {{cluster: {c}, user: u}}}}"
                ))
                .unwrap()
            })
            .collect();
        let mut config = serde_yaml::Mapping::new();
        config.insert("apiVersion".into(), "v1".into());
        config.insert("kind".into(), "Config".into());
        config.insert("clusters".into(), clusters.into());
        config.insert("contexts".into(), contexts.into());
        config.insert("current-context".into(), "member1".into());
        let mut named = serde_yaml::Mapping::new();
        named.insert("name".into(), "u".into());
        named.insert("user".into(), serde_yaml::Value::Mapping(user));
        config.insert(
            "users".into(),
            vec![serde_yaml::Value::Mapping(named)].into(),
        );
        let path = self.path(&format!("test-{name}.kubeconfig"));
        std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
        path
    }

    /// A GET of member1's `dev` pods on the plaintext listener with an optional
    /// `Authorization: ...\r\n` line; the whole response.
    fn plain_get(&self, authorization: &str) -> String {
        raw_get(
            self.plain(),
            "gw",
            "/clusters/member1/api/v1/namespaces/dev/pods",
            authorization,
        )
    }

    /// `kubectl auth whoami -o json` on `context`: the userInfo the member saw.
    fn whoami(&self, kubeconfig: &Path, context: &str) -> serde_json::Value {
        let out = kubectl(kubeconfig, context, &["auth", "whoami", "-o", "json"]);
        let out = succeeded(out, &format!("whoami on {context}"), &self.log_tail(20));
        let review: serde_json::Value = serde_json::from_str(&out).unwrap();
        review["status"]["userInfo"].clone()
    }
}

/// `kubectl get --raw` of a gateway path: no discovery first, so a refusal shows the Status
/// message as the gateway wrote it (kubectl reports a refused discovery as just "unknown").
fn raw(kubeconfig: &Path, path: &str) -> Output {
    kubectl(kubeconfig, "member1", &["get", "--raw", path])
}

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A refusal kubectl reports: the message of the Status and whether it is a 403 or a 401.
fn assert_refused(out: &Output, code: u16, needles: &[&str]) {
    assert!(
        !out.status.success(),
        "expected a refusal, got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr_of(out);
    // kubectl words a 401 as "the server has asked for the client to provide credentials" or
    // "You must be logged in to the server (Unauthorized)", depending on the command.
    let expected = match code {
        401 => "provide credentials",
        403 => "Forbidden",
        _ => unreachable!(),
    };
    let unauthorized = code == 401 && err.contains("(Unauthorized)");
    assert!(
        err.contains(expected) || unauthorized,
        "expected {code}: {err}"
    );
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
}

#[test]
fn whoami_shows_the_user_the_member_saw_for_every_method() {
    let fleet = start(true);
    // Client certificate: CN alice, O devs.
    let cert = fleet.kubeconfig("alice-cert", Cred::Cert("alice"), None);
    let info = fleet.whoami(&cert, "member1");
    assert_eq!(info["username"], "alice", "{info}");
    assert!(groups_of(&info).contains(&"devs".to_string()), "{info}");
    assert!(
        groups_of(&info).contains(&"system:authenticated".to_string()),
        "{info}"
    );

    // Token file: alice with her uid.
    let token = fleet.kubeconfig("alice-token", Cred::TokenFile("users/alice.token"), None);
    let info = fleet.whoami(&token, "member3");
    assert_eq!(info["username"], "alice", "{info}");
    assert_eq!(info["uid"], "alice-uid", "{info}");
    assert!(groups_of(&info).contains(&"devs".to_string()), "{info}");

    // OIDC: prefixed user and groups, uid from the `uid` claim.
    let jwt = fleet.kubeconfig("alice-jwt", Cred::TokenFile("users/alice.jwt"), None);
    let info = fleet.whoami(&jwt, "member1");
    assert_eq!(info["username"], "oidc:alice", "{info}");
    assert_eq!(info["uid"], "alice-uid", "{info}");
    assert!(
        groups_of(&info).contains(&"oidc:devs".to_string()),
        "{info}"
    );
    // Over h2 and HTTP/1.1 alike (kubectl's get uses h2; the second request reuses the cache).
    // The gateway lets oidc:alice (group oidc:devs) read dev clusters; the member, whose own
    // RBAC knows only alice, refuses her: its Forbidden, not the gateway's (no cluster named).
    let out = kubectl(&jwt, "member1", &["get", "pods", "-n", "dev", "-o", "name"]);
    assert_refused(&out, 403, &["User \"oidc:alice\" cannot list"]);
    assert!(
        !stderr_of(&out).contains("on cluster"),
        "{}",
        stderr_of(&out)
    );

    // PassThrough: the client's own token reaches the member, which authenticates it (the
    // member knows alice's token), and the gateway adds nothing.
    let info = fleet.whoami(&token, "direct1");
    assert_eq!(info["username"], "alice", "{info}");
    assert_eq!(info["uid"], "alice-uid", "{info}");
    // A token the gateway does not know still reaches a PassThrough member (OCM style): the
    // gateway's own member token is valid there, and only there.
    let member_token = std::fs::read_to_string(fleet.path("clusters/member1.yaml")).unwrap();
    let member_token: serde_yaml::Value = serde_yaml::from_str(&member_token).unwrap();
    let member_token = member_token["spec"]["credentials"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let foreign = fleet.kubeconfig("foreign", Cred::Token(&member_token), None);
    let info = fleet.whoami(&foreign, "direct1");
    assert_eq!(info["username"], "fleetgate-gateway", "{info}");
    assert_refused(&kubectl(&foreign, "member1", &["auth", "whoami"]), 401, &[]);
    // A client certificate alone is not enough on a PassThrough cluster.
    assert_refused(&kubectl(&cert, "direct1", &["auth", "whoami"]), 401, &[]);

    // Impersonation with the grant (carol, group ops, may be alice / devs / alice-uid /
    // team=blue): the member sees alice with everything asked for.
    let as_alice = fleet.kubeconfig(
        "carol-as-alice",
        Cred::Cert("carol"),
        Some(
            serde_yaml::from_str(
                "{as: alice, as-groups: [devs], as-uid: alice-uid, as-user-extra: {team: [blue]}}",
            )
            .unwrap(),
        ),
    );
    let info = fleet.whoami(&as_alice, "member1");
    assert_eq!(info["username"], "alice", "{info}");
    assert_eq!(info["uid"], "alice-uid", "{info}");
    assert!(groups_of(&info).contains(&"devs".to_string()), "{info}");
    assert_eq!(info["extra"]["team"], serde_json::json!(["blue"]), "{info}");
    // ... and then the policy is alice's: prod (member2) is not hers.
    assert_refused(
        &raw(&as_alice, "/clusters/member2/api/v1/namespaces/dev/pods"),
        403,
        &["User \"alice\"", "cluster \"member2\""],
    );
    // kubectl's own --as: carol may be alice (whose grants come with group devs, which an
    // impersonation names explicitly, as in Kubernetes), not admin; bob may be nobody.
    let carol = fleet.kubeconfig("carol", Cred::Cert("carol"), None);
    let out = kubectl(
        &carol,
        "member1",
        &[
            "auth",
            "whoami",
            "--as",
            "alice",
            "--as-group",
            "devs",
            "-o",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let review: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "alice");
    assert_refused(
        &kubectl(
            &carol,
            "member1",
            &["get", "--raw", "/clusters/member1/api", "--as", "admin"],
        ),
        403,
        &["cannot impersonate", "\"admin\""],
    );
    let bob = fleet.kubeconfig("bob", Cred::Cert("bob"), None);
    assert_refused(
        &kubectl(
            &bob,
            "member1",
            &["get", "pods", "-n", "dev", "--as", "alice"],
        ),
        403,
        &["User \"bob\" cannot impersonate"],
    );
}

#[test]
fn policies_deny_by_default_and_bad_credentials_are_unauthorized() {
    let fleet = start(false);
    let alice = fleet.kubeconfig("alice", Cred::Cert("alice"), None);
    // The devs policy selects env=dev clusters: member1 and member3, not member2.
    for context in ["member1", "member3"] {
        let out = kubectl(&alice, context, &["get", "pods", "-n", "dev", "-o", "name"]);
        assert!(
            out.status.success(),
            "{context}: {}\n{}",
            stderr_of(&out),
            fleet.log_tail(20)
        );
    }
    assert_refused(
        &raw(&alice, "/clusters/member2/api/v1/namespaces/dev/pods"),
        403,
        &["User \"alice\"", "cluster \"member2\""],
    );
    // A verb the policy does not grant.
    assert_refused(
        &kubectl(
            &alice,
            "member1",
            &["delete", "configmap", "nothing-here", "-n", "dev"],
        ),
        403,
        &[
            "cannot delete resource \"configmaps\"",
            "in the namespace \"dev\"",
            "cluster \"member1\"",
        ],
    );
    // bob: member1's default namespace only.
    let bob = fleet.kubeconfig("bob", Cred::TokenFile("users/bob.token"), None);
    let out = kubectl(
        &bob,
        "member1",
        &["get", "configmaps", "-n", "default", "-o", "name"],
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_refused(
        &kubectl(&bob, "member1", &["get", "configmaps", "-n", "kube-system"]),
        403,
        &["cannot list resource \"configmaps\"", "\"kube-system\""],
    );
    assert_refused(
        &raw(
            &bob,
            "/clusters/member3/api/v1/namespaces/default/configmaps",
        ),
        403,
        &["cluster \"member3\""],
    );
    // Unauthorized: expired, wrongly signed, unknown, none.
    for (name, cred) in [
        ("expired", Cred::TokenFile("users/expired.jwt")),
        ("forged", Cred::TokenFile("users/wrong-key.jwt")),
        ("unknown", Cred::Token("not-a-token-anyone-issued")),
    ] {
        let config = fleet.kubeconfig(name, cred, None);
        assert_refused(
            &kubectl(&config, "member1", &["get", "pods", "-n", "dev"]),
            401,
            &[],
        );
    }
    // The plaintext listener: anonymous (no policy grants it anything) unless a token is sent.
    let anonymous = fleet.plain_kubeconfig("anonymous");
    assert_refused(
        &raw(&anonymous, "/clusters/member1/api"),
        403,
        &["User \"system:anonymous\"", "cluster \"member1\""],
    );
    // kubectl sends no bearer token over plain HTTP, so a raw request does.
    let alice_token = std::fs::read_to_string(fleet.path("users/alice.token")).unwrap();
    let plain_get = |authorization: &str| fleet.plain_get(authorization);
    let response = plain_get(&format!("Authorization: Bearer {}\r\n", alice_token.trim()));
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let response = plain_get("");
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(response.contains("system:anonymous"), "{response}");
    let response = plain_get("Authorization: Bearer not-a-token-anyone-issued\r\n");
    assert!(response.starts_with("HTTP/1.1 401"), "{response}");
    // Cluster names are not probed without a credential: 401 before the 404.
    let stranger = fleet.kubeconfig("stranger", Cred::Token("not-a-token-anyone-issued"), None);
    assert_refused(&raw(&stranger, "/clusters/no-such-cluster/api"), 401, &[]);
    let out = raw(&alice, "/clusters/no-such-cluster/api");
    assert!(stderr_of(&out).contains("NotFound"), "{}", stderr_of(&out));
    // No credential at all: the 401 makes kubectl ask for a user name, which nobody types.
    let nothing = fleet.kubeconfig("nothing", Cred::Nothing, None);
    let out = kubectl(&nothing, "member1", &["get", "pods", "-n", "dev"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Username"),
        "{}",
        stderr_of(&out)
    );
    // The tokens never reach the log.
    let log = std::fs::read_to_string(fleet.path("gateway.log")).unwrap();
    let alice_token = std::fs::read_to_string(fleet.path("users/alice.token")).unwrap();
    assert!(!log.contains(alice_token.trim()));
}

#[test]
fn a_policy_change_on_reload_takes_effect() {
    let fleet = start(false);
    let bob = fleet.kubeconfig("bob", Cred::Cert("bob"), None);
    let list = |context: &str| {
        kubectl(
            &bob,
            context,
            &["get", "configmaps", "-n", "default", "-o", "name"],
        )
    };
    let list_raw = || {
        raw(
            &bob,
            "/clusters/member2/api/v1/namespaces/default/configmaps",
        )
    };
    assert_refused(&list_raw(), 403, &["cluster \"member2\""]);
    let grant = r#"apiVersion: fleetgate.io/v1alpha1
kind: AccessPolicy
metadata:
  name: bob-reads-prod
spec:
  subjects: [{kind: User, name: bob}]
  clusters:
    selector:
      matchExpressions: [{key: env, operator: In, values: [prod]}]
  rules:
    - verbs: [list]
      resources: [configmaps]
"#;
    let file = fleet.path("bob-reads-prod.yaml");
    std::fs::write(&file, grant).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = list("member2");
        if out.status.success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "grant never applied: {}\n{}",
            stderr_of(&out),
            fleet.log_tail(20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Only what was granted: list configmaps, not get one.
    assert_refused(
        &kubectl(
            &bob,
            "member2",
            &["get", "configmap", "kube-root-ca.crt", "-n", "default"],
        ),
        403,
        &["cannot get resource \"configmaps\"", "cluster \"member2\""],
    );
    std::fs::remove_file(&file).unwrap();
    let withdrawn = || {
        let out = list_raw();
        !out.status.success() && stderr_of(&out).contains("cluster \"member2\"")
    };
    wait_for_or(
        "the grant withdrawn",
        Duration::from_secs(20),
        withdrawn,
        || fleet.log_tail(20),
    );
    // The token file follows reloads too: a new line is a new user (dave, group devs).
    let dave = "Authorization: Bearer dave-token-0123456789\r\n";
    assert!(fleet.plain_get(dave).starts_with("HTTP/1.1 401"));
    let tokens = fleet.path("users/tokens.csv");
    let mut csv = std::fs::read_to_string(&tokens).unwrap();
    csv.push_str("dave-token-0123456789,dave,dave-uid,\"devs\"\n");
    std::fs::write(&tokens, csv).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        // The member sees dave (group devs) impersonated, and lets devs read namespace dev.
        let response = fleet.plain_get(dave);
        if response.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "new token never accepted: {response}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A policy that does not compile (an unknown verb) is rejected as a whole reload: the
    // previous table keeps serving, and the metrics count the failure.
    std::fs::write(&file, grant.replace("[list]", "[list, fly]")).unwrap();
    let failure_counted = || {
        let metrics = fleet.admin_get("/metrics");
        metrics.contains("fleetgate_config_reloads_total{result=\"failure\"} 1")
    };
    wait_for_or(
        "the reload failure counted",
        Duration::from_secs(20),
        failure_counted,
        || fleet.log_tail(20),
    );
    assert!(
        std::fs::read_to_string(fleet.path("gateway.log"))
            .unwrap()
            .contains("unknown verb \"fly\""),
        "{}",
        fleet.log_tail(20)
    );
    assert_refused(&list_raw(), 403, &["cluster \"member2\""]);
    let out = list("member1");
    assert!(out.status.success(), "{}", stderr_of(&out));
}

#[test]
fn can_i_as_a_user_without_a_grant_gets_the_members_answer() {
    let fleet = start(false);
    // The admin asks member2 (prod, where alice has no grant) what alice may do: the member's
    // answer, as kube-apiserver gives it to any authenticated user about themselves.
    let admin_can_i = |args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let out = fleet.kubectl_output("member2", &all);
        let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (stdout, stderr_of(&out))
    };
    for (args, answer) in [
        (&["list", "pods", "-n", "dev", "--as", "alice"][..], "yes"),
        (&["list", "pods", "-n", "default", "--as", "alice"], "no"),
        // dave: no grant anywhere, unknown to the member.
        (&["list", "pods", "-n", "dev", "--as", "dave"], "no"),
        (
            &["create", "deployments", "-n", "dev", "--as", "dave"],
            "no",
        ),
    ] {
        let (stdout, stderr) = admin_can_i(args);
        assert_eq!(stdout, answer, "{args:?}: {stderr}\n{}", fleet.log_tail(20));
        // kubectl's discovery beforehand (as dave too) found the resource.
        assert!(!stderr.contains("resource type"), "{args:?}: {stderr}");
    }
    let out = fleet.kubectl_output("member2", &["auth", "whoami", "--as", "dave", "-o", "json"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let review: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(review["status"]["userInfo"]["username"], "dave", "{review}");
    // Nothing else of alice's becomes allowed on member2.
    let get = fleet.kubectl_output(
        "member2",
        &[
            "get",
            "--raw",
            "/clusters/member2/api/v1/namespaces/dev/pods",
            "--as",
            "alice",
        ],
    );
    assert_refused(&get, 403, &["User \"alice\"", "cluster \"member2\""]);
    // And only for whom the client may impersonate: carol may be alice, not admin.
    let carol = fleet.kubeconfig("carol", Cred::Cert("carol"), None);
    let out = kubectl(
        &carol,
        "member2",
        &["auth", "can-i", "list", "pods", "--as", "admin"],
    );
    assert_refused(&out, 403, &["cannot impersonate", "\"admin\""]);
    let out = kubectl(
        &carol,
        "member2",
        &[
            "auth", "can-i", "list", "pods", "-n", "dev", "--as", "alice",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "yes",
        "{}",
        stderr_of(&out)
    );
}
