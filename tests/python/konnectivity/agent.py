"""A konnectivity proxy-agent for fleetgate's tests, written from the protocol's proto file
(konnectivity.proto beside it, compiled with grpcio-tools when the agent starts): it calls
AgentService.Connect on the gateway's tunnel listener with an agent certificate and the agentID /
agentIdentifiers metadata, answers each DIAL_REQ by dialing the address over TCP, and carries the
connection's bytes in DATA packets (4 KiB reads, as the ANP agent does) until either side closes.

Driven by gateway/tests/tunnel_konnectivity.rs. Its stdout is the test's readiness and evidence:
  ready serverID=... serverCount=N      once the gateway answered Connect
  dial ADDRESS                          each DIAL_REQ
  ended CODE DETAILS                    when the call ends (then the agent exits)
Modes for hostile cases: --refuse-dials REASON answers every dial with that error; --hostile sends
packets no well-behaved agent sends (DATA, CLOSE_RSP and DIAL_RSP for unknown IDs, an unknown
packet type, a duplicate DIAL_RSP after each real one) and still serves; --oversized sends a
message over the gateway's bound."""

import argparse
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))


def compile_proto():
    out = tempfile.mkdtemp(prefix="konnectivity-stubs-")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", "-I", HERE, "--python_out", out,
         "--grpc_python_out", out, os.path.join(HERE, "konnectivity.proto")],
        check=True)
    sys.path.insert(0, out)


def say(line):
    print(line, flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", required=True, help="host:port of the tunnel listener")
    parser.add_argument("--server-name", default="127.0.0.1")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--agent-id", default="test-agent")
    parser.add_argument("--identifiers", default=None)
    parser.add_argument("--refuse-dials", default=None)
    parser.add_argument("--hostile", action="store_true")
    parser.add_argument("--oversized", action="store_true",
                        help="send one 2 MiB DATA packet (over the gateway's bound) once ready")
    args = parser.parse_args()

    compile_proto()
    import grpc
    import konnectivity_pb2 as pb
    import konnectivity_pb2_grpc as pb_grpc

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    creds = grpc.ssl_channel_credentials(
        root_certificates=read(args.ca), private_key=read(args.key),
        certificate_chain=read(args.cert))
    channel = grpc.secure_channel(
        args.gateway, creds, options=[("grpc.ssl_target_name_override", args.server_name)])
    stub = pb_grpc.AgentServiceStub(channel)

    outgoing = queue.Queue()
    DONE = object()

    def requests():
        while True:
            item = outgoing.get()
            if item is DONE:
                return
            yield item

    send = outgoing.put
    metadata = [("agentid", args.agent_id)]
    if args.identifiers is not None:
        metadata.append(("agentidentifiers", args.identifiers))
    call = stub.Connect(requests(), metadata=metadata)
    try:
        headers = dict(call.initial_metadata())
        if "serverid" not in headers:
            # A refusal comes trailers-only: no headers, the status at once.
            for _ in call:
                pass
            say(f"ended {call.code().name} {call.details()}")
            return 1
    except grpc.RpcError as e:
        say(f"ended {e.code().name} {e.details()}")
        return 1
    say(f"ready serverID={headers.get('serverid')} serverCount={headers.get('servercount')}")

    conns = {}
    lock = threading.Lock()
    next_id = [0]

    if args.hostile:
        send(pb.Packet(type=pb.DATA, data=pb.Data(connectID=999, data=b"who")))
        send(pb.Packet(type=pb.CLOSE_RSP, closeResponse=pb.CloseResponse(connectID=998)))
        send(pb.Packet(type=pb.DIAL_RSP, dialResponse=pb.DialResponse(random=12345, connectID=997)))
        send(pb.Packet(type=99))
        send(pb.Packet(type=pb.DIAL_CLS, closeDial=pb.CloseDial(random=4242)))
        send(pb.Packet(type=pb.DIAL_REQ, dialRequest=pb.DialRequest(protocol="tcp", address="127.0.0.1:1")))

    if args.oversized:
        send(pb.Packet(type=pb.DATA, data=pb.Data(connectID=1, data=b"\0" * (2 << 20))))

    def pump(cid, sock):
        """The member's bytes to the gateway until it closes, then CLOSE_RSP."""
        try:
            while True:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                send(pb.Packet(type=pb.DATA, data=pb.Data(connectID=cid, data=chunk)))
                if args.hostile:
                    # A DATA for a connection that does not exist, between real ones.
                    send(pb.Packet(type=pb.DATA, data=pb.Data(connectID=cid + 100000, data=chunk)))
        except OSError:
            pass
        with lock:
            known = conns.pop(cid, None)
        if known is not None:
            send(pb.Packet(type=pb.CLOSE_RSP, closeResponse=pb.CloseResponse(connectID=cid)))
            sock.close()

    def dial(req):
        say(f"dial {req.address}")
        if args.refuse_dials is not None:
            send(pb.Packet(type=pb.DIAL_RSP, dialResponse=pb.DialResponse(
                random=req.random, error=args.refuse_dials)))
            return
        host, port = req.address.rsplit(":", 1)
        try:
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=10)
            sock.settimeout(None)
        except OSError as e:
            send(pb.Packet(type=pb.DIAL_RSP, dialResponse=pb.DialResponse(
                random=req.random, error=str(e))))
            return
        with lock:
            next_id[0] += 1
            cid = next_id[0]
            conns[cid] = sock
        send(pb.Packet(type=pb.DIAL_RSP, dialResponse=pb.DialResponse(random=req.random, connectID=cid)))
        if args.hostile:
            send(pb.Packet(type=pb.DIAL_RSP, dialResponse=pb.DialResponse(random=req.random, connectID=cid)))
        threading.Thread(target=pump, args=(cid, sock), daemon=True).start()

    try:
        for packet in call:
            kind = packet.type
            if kind == pb.DIAL_REQ:
                threading.Thread(target=dial, args=(packet.dialRequest,), daemon=True).start()
            elif kind == pb.DATA:
                with lock:
                    sock = conns.get(packet.data.connectID)
                if sock is None:
                    send(pb.Packet(type=pb.CLOSE_RSP, closeResponse=pb.CloseResponse(
                        connectID=packet.data.connectID, error="unrecognized connectID")))
                    continue
                try:
                    sock.sendall(packet.data.data)
                except OSError:
                    pass
            elif kind == pb.CLOSE_REQ:
                cid = packet.closeRequest.connectID
                with lock:
                    sock = conns.pop(cid, None)
                if sock is not None:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    sock.close()
                send(pb.Packet(type=pb.CLOSE_RSP, closeResponse=pb.CloseResponse(connectID=cid)))
            elif kind == pb.DIAL_CLS:
                pass
        say(f"ended {call.code().name} {call.details()}")
    except grpc.RpcError as e:
        say(f"ended {e.code().name} {e.details()}")
    outgoing.put(DONE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
