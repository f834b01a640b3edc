//! Criterion micro-benchmarks of the HTTP/1.1 codec's hot pieces (issue 7 item 3): parsing a
//! request head and a response head as kubectl and a kube-apiserver send them, and validating
//! chunked framing as a watch or a big LIST streams past (`ChunkedScanner`). Measures the codec
//! alone, no sockets; `cargo bench -p fleetgate --bench http1`.

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fleetgate::codec::http1::{parse_request, parse_response, ChunkedScanner, Head, HeadLimits};

const LIMITS: HeadLimits = HeadLimits {
    max_head_bytes: 64 * 1024,
    max_headers: 100,
};

/// A small GET as kubectl 1.32 sends it through the gateway.
const REQUEST: &[u8] = b"GET /clusters/member1/api/v1/namespaces/default/configmaps/kube-root-ca.crt HTTP/1.1\r\n\
Host: 127.0.0.1:6443\r\n\
User-Agent: kubectl/v1.32.0 (linux/amd64) kubernetes/70d3cc9\r\n\
Accept: application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json\r\n\
Authorization: Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6IjEyMyJ9.eyJzdWIiOiJzeXN0ZW06YWRtaW4ifQ.c2lnbmF0dXJl\r\n\
Kubectl-Command: kubectl get\r\n\
Kubectl-Session: 6f1f5e57-7d39-4f8e-9a5c-2c4a8f6c5a11\r\n\
Accept-Encoding: gzip\r\n\r\n";

/// The head a kube-apiserver v1.24 answers a small GET with.
const RESPONSE: &[u8] = b"HTTP/1.1 200 OK\r\n\
Audit-Id: 0b6f4a10-7d52-4c0e-9e0c-3b2e51fd8a77\r\n\
Cache-Control: no-cache, private\r\n\
Content-Type: application/json\r\n\
X-Kubernetes-Pf-Flowschema-Uid: 4b3f3c53-3d2c-4a44-9d0f-1b3c1f1e8a01\r\n\
X-Kubernetes-Pf-Prioritylevel-Uid: 9d1a2b4c-5e6f-4a7b-8c9d-0e1f2a3b4c5d\r\n\
Date: Sun, 22 Nov 2026 12:00:00 GMT\r\n\
Content-Length: 1024\r\n\r\n";

fn heads(c: &mut Criterion) {
    let mut group = c.benchmark_group("head");
    let mut head = Head::default();
    let mut src = BytesMut::with_capacity(4096);
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse_request (kubectl GET)", |b| {
        b.iter(|| {
            src.clear();
            src.extend_from_slice(REQUEST);
            let mut scanned = 0;
            let done = parse_request(&mut src, &mut scanned, LIMITS, &mut head);
            black_box((done, head.target().len()))
        })
    });
    group.bench_function("parse_response (apiserver 200)", |b| {
        b.iter(|| {
            src.clear();
            src.extend_from_slice(RESPONSE);
            let mut scanned = 0;
            let done = parse_response(&mut src, &mut scanned, LIMITS, &mut head);
            black_box((done, head.code))
        })
    });
    group.finish();
}

/// `count` chunks of `size` bytes each, then the last chunk, as a member streams a LIST or watch.
fn chunked_body(count: usize, size: usize) -> Vec<u8> {
    let mut body = Vec::with_capacity(count * (size + 8) + 5);
    for _ in 0..count {
        body.extend_from_slice(format!("{size:x}\r\n").as_bytes());
        body.extend(std::iter::repeat_n(b'x', size));
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"0\r\n\r\n");
    body
}

fn chunk_framing(c: &mut Criterion) {
    let mut group = c.benchmark_group("chunked");
    // A big LIST: 4 MiB in 16 KiB chunks, fed in 64 KiB reads as a socket would hand them over.
    let big = chunked_body(256, 16 * 1024);
    group.throughput(Throughput::Bytes(big.len() as u64));
    group.bench_function("scan 4 MiB in 16 KiB chunks", |b| {
        b.iter(|| {
            let mut scanner = ChunkedScanner::new();
            let mut taken = 0;
            for read in big.chunks(64 * 1024) {
                taken += scanner.scan(black_box(read)).expect("valid framing");
            }
            assert!(scanner.is_done());
            black_box(taken)
        })
    });
    // Watch events: many small chunks (one ~600-byte event each), decoded for h2 (scan_data).
    let events = chunked_body(1000, 600);
    group.throughput(Throughput::Elements(1000));
    group.bench_function("scan_data 1000 watch events", |b| {
        b.iter(|| {
            let mut scanner = ChunkedScanner::new();
            let mut data = 0usize;
            for read in events.chunks(16 * 1024) {
                scanner
                    .scan_data(black_box(read), |range| data += range.len())
                    .expect("valid framing");
            }
            black_box(data)
        })
    });
    group.finish();
}

criterion_group!(benches, heads, chunk_framing);
criterion_main!(benches);
