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


@pytest.mark.parametrize("kubeconfig,context", [
    ("direct.kubeconfig", "member1"),  # the member itself: the bar
    ("kubeconfig", "member1"),  # a shared watch (the demo shares configmaps)
    ("kubeconfig", "fleet"),  # the fleet view's merged watch
])
def test_an_informer_stops_at_once(demo, kubeconfig, context):
    """`SharedInformer.stop()` unblocks its watch with `Watch.stop()`, which shuts the response's
    socket down. A watch answered with `Connection: close` hands the socket to the response, and
    then stop() waits for the next event; through the gateway it must stop as the member's does."""
    from kubernetes.informer.informer import SharedInformer

    core = api(demo, context, kubeconfig)
    name = f"informed-{uuid.uuid4().hex[:8]}"
    seen = threading.Event()
    informer = SharedInformer(core.list_namespaced_config_map, namespace="default")
    informer.add_event_handler("ADDED", lambda obj: obj.metadata.name == name and seen.set())
    informer.start()
    try:
        # The informer's watch has its response (Watch keeps it as `_resp`, what stop() shuts
        # down) once its initial list is done; then an object created now arrives through it.
        deadline = time.monotonic() + 20
        while getattr(informer._watch, "_resp", None) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        api(demo, "member1").create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name)))
        assert seen.wait(20), "the informer's watch never delivered the new ConfigMap"
    finally:
        started = time.monotonic()
        stopper = threading.Thread(target=informer.stop, daemon=True)
        stopper.start()
        stopper.join(timeout=10)
        took = time.monotonic() - started
    assert not stopper.is_alive(), "SharedInformer.stop() still waits after 10 s"
    assert took < 1, f"SharedInformer.stop() took {took:.2f} s"
