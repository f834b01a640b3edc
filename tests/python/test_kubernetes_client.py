"""The Python `kubernetes` client against a fleet: straight to a simulated member, and through the
gateway with the kubeconfig `fleetgate demo` writes. Run by scripts/test after the Rust tests
(which build target/debug/fleetgate)."""

import threading
import time
import uuid

import pytest
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream


def api(demo, context, kubeconfig="kubeconfig"):
    return client.CoreV1Api(config.new_client_from_config(config_file=str(demo / kubeconfig), context=context))


@pytest.mark.parametrize("kubeconfig", ["direct.kubeconfig", "kubeconfig"])
def test_crud_and_selectors(demo, kubeconfig):
    core = api(demo, "member2", kubeconfig)
    name = f"py-{uuid.uuid4().hex[:8]}"
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels={"suite": "python"}),
                              data={"k": "v"})
    created = core.create_namespaced_config_map("default", body)
    assert created.metadata.resource_version
    assert core.read_namespaced_config_map(name, "default").data == {"k": "v"}
    listed = core.list_namespaced_config_map("default", label_selector="suite=python")
    assert name in [i.metadata.name for i in listed.items]
    core.patch_namespaced_config_map(name, "default", {"data": {"k": "w"}})
    assert core.read_namespaced_config_map(name, "default").data == {"k": "w"}
    core.delete_namespaced_config_map(name, "default")
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map(name, "default")
    assert err.value.status == 404


def test_members_are_separate_through_the_gateway(demo):
    name = f"only-1-{uuid.uuid4().hex[:8]}"
    api(demo, "member1").create_namespaced_config_map(
        "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name)))
    with pytest.raises(ApiException) as err:
        api(demo, "member2").read_namespaced_config_map(name, "default")
    assert err.value.status == 404


def test_watch_sees_a_change_made_by_another_client(demo):
    core = api(demo, "member1")
    name = f"watched-{uuid.uuid4().hex[:8]}"
    rv = core.list_namespaced_config_map("default").metadata.resource_version

    def change():
        api(demo, "member1").create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name)))

    w = watch.Watch()
    seen = None
    started = time.monotonic()
    threading.Timer(0.3, change).start()
    for event in w.stream(core.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=10):
        if event["object"].metadata.name == name:
            seen = event["type"]
            w.stop()
    assert seen == "ADDED"
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("kubeconfig", ["direct.kubeconfig", "kubeconfig"])
def test_exec_over_websocket(demo, kubeconfig):
    core = api(demo, "member1", kubeconfig)
    pod = next(p for p in core.list_pod_for_all_namespaces().items if p.status.phase == "Running")
    out = stream(core.connect_get_namespaced_pod_exec, pod.metadata.name, pod.metadata.namespace,
                 command=["echo", "hello", "python"], stderr=True, stdin=False, stdout=True, tty=False)
    assert out.strip() == "hello python"
