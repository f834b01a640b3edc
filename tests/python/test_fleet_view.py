"""The Python `kubernetes` client (HTTP/1.1) against the fleet view of `fleetgate demo`: the
`fleet` context lists every member's objects, each stamped with its cluster, pages across
clusters with `limit` / `_continue`, reads a named object from the one member that has it, and
watches the whole fleet from a list's resourceVersion."""

import uuid

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def api(demo, context):
    return client.CoreV1Api(config.new_client_from_config(config_file=str(demo / "kubeconfig"), context=context))


def stamped(items):
    """(cluster, namespace, name) of each item, checking both cluster annotations agree."""
    out = []
    for item in items:
        annotations = item.metadata.annotations or {}
        assert annotations["fleetgate.io/cluster"] == annotations["resource.karmada.io/cached-from-cluster"]
        out.append((annotations["fleetgate.io/cluster"], item.metadata.namespace, item.metadata.name))
    return out


def test_fleet_list_is_every_members_list_stamped_and_paged(demo10):
    demo = demo10
    fleet = api(demo, "fleet")
    want = []
    for member in [f"member{k}" for k in range(1, 11)]:
        items = api(demo, member).list_config_map_for_all_namespaces().items
        want += [(member, i.metadata.namespace, i.metadata.name) for i in items]
    assert len(want) >= 2
    merged = fleet.list_config_map_for_all_namespaces()
    assert sorted(stamped(merged.items)) == sorted(want)
    # Paged three at a time: every object exactly once, across the two clusters.
    paged, token = [], None
    for _ in range(len(want) + 2):
        page = fleet.list_config_map_for_all_namespaces(limit=3, _continue=token)
        assert len(page.items) <= 3
        paged += stamped(page.items)
        token = page.metadata._continue
        if not token:
            break
    assert sorted(paged) == sorted(want)
    # A continue token the fleet view did not write is a 400, not a guess.
    with pytest.raises(ApiException) as err:
        fleet.list_config_map_for_all_namespaces(limit=3, _continue="not-a-token")
    assert err.value.status == 400


def test_a_named_object_is_read_from_its_owner(demo):
    name = f"py-fleet-{uuid.uuid4().hex[:8]}"
    api(demo, "member2").create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"k": "v"}))
    fleet = api(demo, "fleet")
    assert fleet.read_namespaced_config_map(name, "default").data == {"k": "v"}
    with pytest.raises(ApiException) as err:
        fleet.read_namespaced_config_map(f"{name}-nowhere", "default")
    assert err.value.status == 404


def test_a_watch_follows_every_member_from_a_lists_resource_version(demo):
    fleet = api(demo, "fleet")
    listed = fleet.list_config_map_for_all_namespaces()
    names = {member: f"py-watch-{member}-{uuid.uuid4().hex[:6]}" for member in ["member1", "member2"]}
    for member, name in names.items():
        api(demo, member).create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name)))
    seen = {}
    # Bounded by the watch's own timeout: the gateway ends it after 20 s at most.
    for event in watch.Watch().stream(fleet.list_config_map_for_all_namespaces,
                                      resource_version=listed.metadata.resource_version,
                                      timeout_seconds=20):
        obj = event["object"]
        if obj.metadata.name in names.values():
            assert event["type"] == "ADDED"
            seen[obj.metadata.name] = obj.metadata.annotations["fleetgate.io/cluster"]
        if len(seen) == len(names):
            break
    assert seen == {name: member for member, name in names.items()}


def test_discovery_shows_only_merged_kinds_and_a_hint_aims_at_one_cluster(demo):
    fleet = api(demo, "fleet")
    resources = {r.name for r in fleet.get_api_resources().resources}
    assert {"pods", "pods/log", "pods/exec", "configmaps"} <= resources
    assert not any(name.startswith("secrets") for name in resources)
    # Aimed at member2 (`/fleet/cluster.fleetgate.io/member2`): that cluster's list, as it is.
    aimed_config = client.Configuration()
    config.load_kube_config(config_file=str(demo / "kubeconfig"), context="fleet", client_configuration=aimed_config)
    aimed_config.host = aimed_config.host.rstrip("/") + "/cluster.fleetgate.io/member2"
    aimed = client.CoreV1Api(client.ApiClient(aimed_config))
    names = sorted((i.metadata.namespace, i.metadata.name) for i in aimed.list_config_map_for_all_namespaces().items)
    direct = api(demo, "member2").list_config_map_for_all_namespaces().items
    assert names == sorted((i.metadata.namespace, i.metadata.name) for i in direct)
    # A cluster that does not exist is a 404, as any the user may not reach would be.
    aimed_config.host = aimed_config.host.replace("member2", "member9")
    with pytest.raises(ApiException) as err:
        client.CoreV1Api(client.ApiClient(aimed_config)).list_config_map_for_all_namespaces()
    assert err.value.status == 404
