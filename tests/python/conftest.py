"""Fixtures shared by the Python client tests: a running `fleetgate demo` (simulated members and
the gateway in front of them) in a temporary directory. FLEETGATE_BIN names the binary; by default
the debug build the Rust tests leave in target/debug."""

import os
import pathlib
import subprocess
import threading

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FLEETGATE = os.environ.get("FLEETGATE_BIN", str(REPO / "target" / "debug" / "fleetgate"))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`fleetgate demo` with two members (member1 env=dev, member2 env=prod); yields its directory
    once it printed `ready`. One per test module: a module's tests share the fleet's state."""
    yield from run_demo(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def demo10(tmp_path_factory):
    """`fleetgate demo` with ten members, as `demo`."""
    yield from run_demo(tmp_path_factory, 10)


def run_demo(tmp_path_factory, clusters):
    d = tmp_path_factory.mktemp("demo")
    proc = subprocess.Popen(
        [FLEETGATE, "demo", "--dir", str(d), "--clusters", str(clusters), "--listen", "127.0.0.1:0",
         "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in proc.stdout:  # the readiness signal; ends if the demo dies
        if "ready" in line:
            break
    else:
        pytest.fail("fleetgate demo exited before it was ready")
    # Keep reading stdout so the demo never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    yield d
    proc.terminate()
    assert proc.wait(timeout=20) == 0
