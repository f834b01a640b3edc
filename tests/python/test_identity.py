"""Identity through the gateway with the Python `kubernetes` client: bearer tokens from the token
file and OIDC ID tokens authenticate (SelfSubjectReview shows the user the member saw), bad tokens
are 401, and AccessPolicy refusals are 403 Status naming the cluster. Uses the files `fleetgate
demo` writes (users/NAME.token, users/NAME.jwt, policies.yaml; docs/simulated-fleet.md)."""

import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException


def gateway_server(demo, cluster):
    kubeconfig = yaml.safe_load((demo / "kubeconfig").read_text())
    server = next(c["cluster"]["server"] for c in kubeconfig["clusters"] if c["name"] == cluster)
    return server


def api_client(demo, cluster, token):
    conf = client.Configuration()
    conf.host = gateway_server(demo, cluster)
    conf.ssl_ca_cert = str(demo / "pki" / "gateway-ca.crt")
    conf.api_key = {"authorization": token}
    conf.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(conf)


def whoami(demo, cluster, token):
    review = client.AuthenticationV1Api(api_client(demo, cluster, token)).create_self_subject_review(
        client.V1SelfSubjectReview())
    return review.status.user_info


def token(demo, name):
    return (demo / "users" / name).read_text().strip()


def test_token_file_and_oidc_users_reach_the_member_as_themselves(demo):
    info = whoami(demo, "member1", token(demo, "alice.token"))
    assert info.username == "alice"
    assert info.uid == "alice-uid"
    assert "devs" in info.groups
    info = whoami(demo, "member1", token(demo, "alice.jwt"))
    assert info.username == "oidc:alice"
    assert info.uid == "alice-uid"
    assert "oidc:devs" in info.groups


@pytest.mark.parametrize("name", ["expired.jwt", "wrong-key.jwt"])
def test_bad_tokens_are_unauthorized(demo, name):
    with pytest.raises(ApiException) as err:
        whoami(demo, "member1", token(demo, name))
    assert err.value.status == 401


def test_a_cluster_outside_the_policy_is_forbidden_with_the_reason(demo):
    core = client.CoreV1Api(api_client(demo, "member2", token(demo, "alice.token")))
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod("dev")
    assert err.value.status == 403
    status = json.loads(err.value.body)
    assert status["reason"] == "Forbidden"
    assert 'User "alice" cannot list resource "pods"' in status["message"]
    assert 'on cluster "member2"' in status["message"]
