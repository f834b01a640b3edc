//! Upgraded sessions (exec, attach, port-forward) in process: the client's and the member's
//! connections are in-memory pipes whose far ends the test holds, as kubectl and the kubelet
//! would, so each case writes bytes on one side and reads exactly them on the other. No socket,
//! no sleep.

use fleetgate_config_watcher::retirement::RouteRetirement;
use futures_util::future::join;
use tokio::io::{duplex, AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::runtime::tests::block_on;

/// A splice between a client and a member whose far ends `session` holds (client's first),
/// after `client_pending` and `member_pending` were read past the heads, until `retired` or the
/// ends; what it returned, and what `session` did.
async fn spliced<F: Future>(
    client_pending: &[u8],
    member_pending: &[u8],
    retired: impl Future<Output = ()>,
    session: impl FnOnce(DuplexStream, DuplexStream) -> F,
) -> (Result<SpliceTotals, SpliceError>, F::Output) {
    let (client, mut from_client) = duplex(64 * 1024);
    let (mut to_member, member) = duplex(64 * 1024);
    let splicing = splice(
        &mut from_client,
        &mut to_member,
        BytesMut::from(client_pending),
        BytesMut::from(member_pending),
        retired,
    );
    // Bounds a failure only: every case ends as soon as its bytes have moved.
    let both = join(splicing, session(client, member));
    crate::runtime::timeout(std::time::Duration::from_secs(20), both)
        .await
        .unwrap_or_else(|_| panic!("the splice hung"))
}

/// The next `n` bytes from `side`.
async fn read_n(side: &mut DuplexStream, n: usize) -> Vec<u8> {
    let mut read = vec![0; n];
    side.read_exact(&mut read).await.unwrap();
    read
}

/// Everything `side` reads until its end.
async fn read_to_end(side: &mut DuplexStream) -> Vec<u8> {
    let mut read = Vec::new();
    side.read_to_end(&mut read).await.unwrap();
    read
}

#[test]
fn a_session_carries_bytes_both_ways_and_passes_each_sides_end_on() {
    block_on(async {
        let session = |mut client: DuplexStream, mut member: DuplexStream| async move {
            // What each side sent right behind its head arrives first.
            assert_eq!(read_n(&mut member, 11).await, b"early stdin");
            assert_eq!(read_n(&mut client, 12).await, b"early stdout");
            client.write_all(b"ls\n").await.unwrap();
            assert_eq!(read_n(&mut member, 3).await, b"ls\n");
            member.write_all(b"a b\n").await.unwrap();
            assert_eq!(read_n(&mut client, 4).await, b"a b\n");
            // The client ends its stdin: the member reads the end, and its output still flows.
            client.shutdown().await.unwrap();
            assert_eq!(read_to_end(&mut member).await, b"");
            member.write_all(b"bye").await.unwrap();
            member.shutdown().await.unwrap();
            assert_eq!(read_to_end(&mut client).await, b"bye");
            // Both ends kept open: the splice ended by the two ends of stream alone.
            (client, member)
        };
        let (totals, _) = spliced(
            b"early stdin",
            b"early stdout",
            std::future::pending(),
            session,
        )
        .await;
        let expected = SpliceTotals {
            client_to_member: 14,
            member_to_client: 19,
            retired: false,
        };
        assert_eq!(totals.unwrap(), expected);
    })
}

#[test]
fn a_megabyte_each_way_arrives_byte_for_byte() {
    // Many times a direction's buffer, and past the bytes moved before a direction yields.
    let upload: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
    let download: Vec<u8> = upload.iter().rev().copied().collect();
    block_on(async {
        let session = |mut client: DuplexStream, mut member: DuplexStream| async move {
            let (sent, read) =
                join(client.write_all(&upload), read_n(&mut member, upload.len())).await;
            sent.unwrap();
            assert!(read == upload, "the client's megabyte, as sent");
            let (sent, read) = join(
                member.write_all(&download),
                read_n(&mut client, download.len()),
            )
            .await;
            sent.unwrap();
            assert!(read == download, "the member's megabyte, as sent");
        };
        let (totals, ()) = spliced(b"", b"", std::future::pending(), session).await;
        let expected = SpliceTotals {
            client_to_member: 1 << 20,
            member_to_client: 1 << 20,
            retired: false,
        };
        assert_eq!(totals.unwrap(), expected);
    })
}

#[test]
fn a_side_that_goes_away_ends_the_session_for_the_other() {
    for client_leaves in [true, false] {
        block_on(async {
            let session = |client: DuplexStream, member: DuplexStream| async move {
                let (leaving, mut staying) = if client_leaves {
                    (client, member)
                } else {
                    (member, client)
                };
                drop(leaving);
                // The side that stays reads the end of the session...
                assert_eq!(read_to_end(&mut staying).await, b"");
                // ...and what it still sends has nowhere to go: the splice ends there.
                staying.write_all(b"more").await.unwrap();
                staying
            };
            let (ended, _) = spliced(b"", b"", std::future::pending(), session).await;
            let error = ended.unwrap_err();
            let expected = if client_leaves {
                matches!(error, SpliceError::ClientWrite(_))
            } else {
                matches!(error, SpliceError::MemberWrite(_))
            };
            assert!(expected, "client left: {client_leaves}: {error:?}");
        })
    }
}

#[test]
fn a_retired_route_ends_the_session_at_once_with_both_sides_open() {
    block_on(async {
        let retirement = RouteRetirement::new();
        let route = &retirement;
        let session = move |mut client: DuplexStream, mut member: DuplexStream| async move {
            client.write_all(b"x").await.unwrap();
            assert_eq!(read_n(&mut member, 1).await, b"x");
            route.retire();
            (client, member)
        };
        let (totals, _) = spliced(b"", b"", retirement.listen(), session).await;
        let expected = SpliceTotals {
            client_to_member: 1,
            member_to_client: 0,
            retired: true,
        };
        assert_eq!(totals.unwrap(), expected);
    })
}
