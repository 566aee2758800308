//! The ZDS client against an in-process SOCK_SEQPACKET server playing istio-cni: hello, a request, its ack. No root
//! needed (no namespace is entered); the namespace suite (test/netns) covers adds with real netns fds.

use std::os::fd::AsRawFd;

use dataplane::inpod::zds::{self, workload_request::Payload, WorkloadRequest, ZdsConn};
use nix::sys::socket::{
    accept, bind, listen, recv, socket, AddressFamily, Backlog, MsgFlags, SockFlag, SockType, UnixAddr,
};
use prost::Message;

#[tokio::test]
async fn hello_then_acks() {
    let dir = std::env::temp_dir().join(format!("ztn-zds-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("zds.sock");
    let _ = std::fs::remove_file(&path);
    let srv = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(srv.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    listen(&srv, Backlog::new(4).unwrap()).unwrap();
    let server = std::thread::spawn(move || {
        let c = accept(srv.as_raw_fd()).unwrap();
        let mut buf = [0u8; 1024];
        let n = recv(c, &mut buf, MsgFlags::empty()).unwrap();
        let hello = zds::ZdsHello::decode(&buf[..n]).unwrap();
        assert_eq!(hello.version, zds::Version::V1 as i32);
        let snap = WorkloadRequest { payload: Some(Payload::SnapshotSent(zds::SnapshotSent {})) };
        zds::send_with_fd(c, &snap, None).unwrap();
        let n = recv(c, &mut buf, MsgFlags::empty()).unwrap();
        zds::WorkloadResponse::decode(&buf[..n]).unwrap()
    });
    let conn = tokio::time::timeout(std::time::Duration::from_secs(5), ZdsConn::connect(&path))
        .await
        .expect("connect in time")
        .unwrap();
    conn.send(&zds::ZdsHello { version: zds::Version::V1 as i32 }).await.unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(5), conn.recv())
        .await
        .expect("recv in time")
        .unwrap()
        .unwrap();
    assert!(matches!(got.request.payload, Some(Payload::SnapshotSent(_))));
    assert!(got.fds.is_empty());
    conn.ack(None).await.unwrap();
    let ack = server.join().unwrap();
    assert_eq!(
        ack,
        zds::WorkloadResponse {
            payload: Some(zds::workload_response::Payload::Ack(zds::Ack { error: String::new() }))
        }
    );
    let _ = std::fs::remove_dir_all(dir);
}
