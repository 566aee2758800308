//! The TLS 1.3 record layer of an HBONE connection after a hand-over: the handshake is done (rustls did it, in this
//! process or a predecessor), and what is left is protecting records with the traffic keys both sides derived.
//!
//! rustls exports a finished session's keys and record sequence numbers (`dangerous_extract_secrets`, meant for
//! kernel TLS), but not its traffic secrets, and a KeyUpdate needs the secret: the next one is
//! `HKDF-Expand-Label(secret, "traffic upd", "", Hash.length)` (RFC 8446 §7.2). So the first application traffic
//! secrets are caught as the handshake logs them (`Capture`, rustls' `KeyLog`, into memory for that one connection,
//! never to a file), and at the hand-over the secret whose keys match the exported ones is found by walking the
//! update chain (rustls may have updated its keys before). The AEAD and HKDF are the crypto library rustls was built
//! with (aws-lc-rs or ring, which share this API); rustls' own record types cannot be built from key bytes outside
//! the crate.
//!
//! What a record can carry after the handshake, and what is done with it:
//! - application data: handed up (the HTTP/2 bytes);
//! - KeyUpdate: the receiving keys move to the next secret; if the peer asks for an update, ours is sent under the
//!   current keys and the sending keys move too;
//! - NewSessionTicket: dropped (HBONE's client does not resume sessions);
//! - close_notify: the peer's end of the stream; any other alert, or anything else, is an error.

use serde::{Deserialize, Serialize};

#[cfg(feature = "aws-lc-rs")]
use aws_lc_rs as crypto;
#[cfg(all(feature = "ring", not(feature = "aws-lc-rs")))]
use ring as crypto;

use crypto::{aead, hkdf};

/// A record's header.
pub const HEADER: usize = 5;
/// The largest plaintext a record carries (2^14), and the largest ciphertext a peer may send (2^14 + 256).
pub const MAX_PLAINTEXT: usize = 16 * 1024;
pub const MAX_CIPHERTEXT: usize = MAX_PLAINTEXT + 256;
const TAG: usize = 16;

const APPLICATION_DATA: u8 = 23;
const HANDSHAKE: u8 = 22;
const ALERT: u8 = 21;
const NEW_SESSION_TICKET: u8 = 4;
const KEY_UPDATE: u8 = 24;
/// How far the update chain is walked to find the exported keys' secret.
const MAX_UPDATES: usize = 4096;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TlsError {
    #[error("TLS record failed to decrypt")]
    Decrypt,
    #[error("TLS record too large ({0} bytes)")]
    TooLarge(usize),
    #[error("TLS record of type {0} after the handshake")]
    UnexpectedRecord(u8),
    #[error("TLS handshake message {0} after the handshake")]
    UnexpectedMessage(u8),
    #[error("TLS alert {0} from the peer")]
    Alert(u8),
    #[error("the peer updated its TLS keys, and the secret to follow it is unknown")]
    NoSecret,
    #[error("cipher suite {0:#06x} is not continued here")]
    Suite(u16),
    #[error("bad TLS key material")]
    Keys,
}

/// The cipher suites HBONE negotiates (`tls::provider`), and ChaCha20 for completeness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suite {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20,
}

impl Suite {
    fn from_id(id: u16) -> Result<Suite, TlsError> {
        match id {
            0x1301 => Ok(Suite::Aes128Gcm),
            0x1302 => Ok(Suite::Aes256Gcm),
            0x1303 => Ok(Suite::Chacha20),
            _ => Err(TlsError::Suite(id)),
        }
    }

    fn aead(self) -> &'static aead::Algorithm {
        match self {
            Suite::Aes128Gcm => &aead::AES_128_GCM,
            Suite::Aes256Gcm => &aead::AES_256_GCM,
            Suite::Chacha20 => &aead::CHACHA20_POLY1305,
        }
    }

    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Suite::Aes256Gcm => hkdf::HKDF_SHA384,
            _ => hkdf::HKDF_SHA256,
        }
    }

    fn hash_len(self) -> usize {
        match self {
            Suite::Aes256Gcm => 48,
            _ => 32,
        }
    }
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) with an empty context.
fn expand_label(suite: Suite, secret: &[u8], label: &[u8], len: usize) -> Vec<u8> {
    let prk = hkdf::Prk::new_less_safe(suite.hkdf(), secret);
    let out_len = (len as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let info: [&[u8]; 5] = [&out_len, &label_len, b"tls13 ", label, &[0u8]];
    let mut out = vec![0u8; len];
    // The length fits every suite's hash (at most 255 × its output).
    prk.expand(&info, Len(len)).and_then(|okm| okm.fill(&mut out)).expect("HKDF output length");
    out
}

fn keys_of(suite: Suite, secret: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (expand_label(suite, secret, b"key", suite.aead().key_len()), expand_label(suite, secret, b"iv", 12))
}

/// One direction's state as it crosses to a successor. `secret` is the traffic secret the keys are derived from,
/// when known (without it, a KeyUpdate in that direction ends the connection).
#[derive(Clone, Serialize, Deserialize)]
pub struct DirState {
    pub secret: Option<Vec<u8>>,
    pub key: Vec<u8>,
    pub iv: Vec<u8>,
    pub seq: u64,
}

impl std::fmt::Debug for DirState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirState").field("seq", &self.seq).finish_non_exhaustive()
    }
}

/// A session's record-layer state: the suite's id (RFC 8446 B.4) and both directions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TlsState {
    pub suite: u16,
    pub tx: DirState,
    pub rx: DirState,
}

struct Dir {
    secret: Option<Vec<u8>>,
    key: aead::LessSafeKey,
    key_bytes: Vec<u8>,
    iv: [u8; 12],
    seq: u64,
}

impl Dir {
    fn new(suite: Suite, s: &DirState) -> Result<Dir, TlsError> {
        let unbound = aead::UnboundKey::new(suite.aead(), &s.key).map_err(|_| TlsError::Keys)?;
        let iv: [u8; 12] = s.iv.as_slice().try_into().map_err(|_| TlsError::Keys)?;
        Ok(Dir {
            secret: s.secret.clone(),
            key: aead::LessSafeKey::new(unbound),
            key_bytes: s.key.clone(),
            iv,
            seq: s.seq,
        })
    }

    fn state(&self) -> DirState {
        DirState { secret: self.secret.clone(), key: self.key_bytes.clone(), iv: self.iv.to_vec(), seq: self.seq }
    }

    /// The nonce of the next record (RFC 8446 §5.3), and the sequence number moved past it.
    fn next_nonce(&mut self) -> aead::Nonce {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        self.seq += 1;
        aead::Nonce::assume_unique_for_key(n)
    }

    /// KeyUpdate: the next traffic secret and its keys; the sequence starts again at 0.
    fn update(&mut self, suite: Suite) -> Result<(), TlsError> {
        let secret = self.secret.as_ref().ok_or(TlsError::NoSecret)?;
        let next = expand_label(suite, secret, b"traffic upd", suite.hash_len());
        let (key, iv) = keys_of(suite, &next);
        *self = Dir::new(suite, &DirState { secret: Some(next), key, iv, seq: 0 })?;
        Ok(())
    }
}

/// What one received record held.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Application data: the plaintext is `record[HEADER..HEADER + len]`.
    Data(usize),
    /// A post-handshake message, handled (anything to send back is in the caller's output).
    Control,
    /// close_notify.
    Closed,
}

/// Both directions of a session's record layer.
pub struct Records {
    suite: Suite,
    suite_id: u16,
    tx: Dir,
    rx: Dir,
    /// A handshake message split across records.
    handshake: Vec<u8>,
}

impl Records {
    pub fn new(state: &TlsState) -> Result<Records, TlsError> {
        let suite = Suite::from_id(state.suite)?;
        Ok(Records {
            suite,
            suite_id: state.suite,
            tx: Dir::new(suite, &state.tx)?,
            rx: Dir::new(suite, &state.rx)?,
            handshake: Vec::new(),
        })
    }

    /// The state to hand on (a successor can itself be succeeded). A handshake message split across records is
    /// not carried: `can_hand_over` says whether there is one.
    pub fn state(&self) -> TlsState {
        TlsState { suite: self.suite_id, tx: self.tx.state(), rx: self.rx.state() }
    }

    pub fn can_hand_over(&self) -> bool {
        self.handshake.is_empty()
    }

    /// Protect `data` as records of `typ` appended to `out` (split at `MAX_PLAINTEXT`).
    fn seal_typed(&mut self, typ: u8, data: &[u8], out: &mut Vec<u8>) {
        let mut chunks = data.chunks(MAX_PLAINTEXT).peekable();
        if chunks.peek().is_none() {
            return;
        }
        for chunk in chunks {
            let len = chunk.len() + 1 + TAG;
            let header = [APPLICATION_DATA, 3, 3, (len >> 8) as u8, len as u8];
            out.extend_from_slice(&header);
            let start = out.len();
            out.extend_from_slice(chunk);
            out.push(typ);
            let nonce = self.tx.next_nonce();
            let tag = self
                .tx
                .key
                .seal_in_place_separate_tag(nonce, aead::Aad::from(header), &mut out[start..])
                .expect("sealing a record within the AEAD's limits");
            out.extend_from_slice(tag.as_ref());
        }
    }

    /// Protect application data (the HTTP/2 bytes) into `out`.
    pub fn seal(&mut self, data: &[u8], out: &mut Vec<u8>) {
        self.seal_typed(APPLICATION_DATA, data, out);
    }

    /// close_notify, sent when the connection ends.
    pub fn close_notify(&mut self, out: &mut Vec<u8>) {
        self.seal_typed(ALERT, &[1, 0], out);
    }

    /// Decrypt one whole record (`record_len` bytes at the start of `record`) in place. Anything the session must
    /// answer (our KeyUpdate) is appended to `out`.
    pub fn open(&mut self, record: &mut [u8], out: &mut Vec<u8>) -> Result<Opened, TlsError> {
        let header: [u8; HEADER] = record[..HEADER].try_into().expect("a whole record");
        if header[0] != APPLICATION_DATA {
            return Err(TlsError::UnexpectedRecord(header[0]));
        }
        let nonce = self.rx.next_nonce();
        let plain = self
            .rx
            .key
            .open_in_place(nonce, aead::Aad::from(header), &mut record[HEADER..])
            .map_err(|_| TlsError::Decrypt)?;
        // TLSInnerPlaintext: content, then the real type, then zero padding.
        let Some(end) = plain.iter().rposition(|b| *b != 0) else {
            return Err(TlsError::UnexpectedRecord(0));
        };
        let typ = plain[end];
        match typ {
            APPLICATION_DATA => Ok(Opened::Data(end)),
            HANDSHAKE => {
                self.handshake.extend_from_slice(&plain[..end]);
                self.handle_handshake(out)?;
                Ok(Opened::Control)
            }
            ALERT if end >= 2 && plain[1] == 0 => Ok(Opened::Closed),
            ALERT if end >= 2 => Err(TlsError::Alert(plain[1])),
            other => Err(TlsError::UnexpectedRecord(other)),
        }
    }

    fn handle_handshake(&mut self, out: &mut Vec<u8>) -> Result<(), TlsError> {
        loop {
            if self.handshake.len() < 4 {
                return Ok(());
            }
            let h = &self.handshake;
            let len = (h[1] as usize) << 16 | (h[2] as usize) << 8 | h[3] as usize;
            if len > 64 * 1024 {
                return Err(TlsError::TooLarge(len));
            }
            if h.len() < 4 + len {
                return Ok(());
            }
            let (typ, body) = (h[0], h[4..4 + len].to_vec());
            self.handshake.drain(..4 + len);
            match typ {
                NEW_SESSION_TICKET => {}
                KEY_UPDATE if body.len() == 1 && body[0] <= 1 => {
                    self.rx.update(self.suite)?;
                    if body[0] == 1 {
                        // update_requested: ours, under the current keys, then ours move on.
                        self.seal_typed(HANDSHAKE, &[KEY_UPDATE, 0, 0, 1, 0], out);
                        self.tx.update(self.suite)?;
                    }
                }
                other => return Err(TlsError::UnexpectedMessage(other)),
            }
        }
    }
}

/// The length of the whole record at the start of `buf`, once its header is there.
pub fn record_len(buf: &[u8]) -> Option<Result<usize, TlsError>> {
    if buf.len() < HEADER {
        return None;
    }
    let len = (buf[3] as usize) << 8 | buf[4] as usize;
    if len > MAX_CIPHERTEXT {
        return Some(Err(TlsError::TooLarge(len)));
    }
    Some(Ok(HEADER + len))
}

// The key log that catches a handshake's first traffic secrets is the TLS module's (tls/keylog.rs).
pub use crate::tls::keylog::{capture, CaptureLog, Secrets};

/// The record-layer state of a finished rustls session, from its exported keys and the secrets its handshake logged
/// (`is_client`: which of them is ours to send with). A secret whose update chain does not reach the exported keys
/// is left out (that direction then cannot follow a KeyUpdate).
pub fn from_rustls(
    secrets: rustls::ExtractedSecrets,
    suite: rustls::CipherSuite,
    logged: &Secrets,
    is_client: bool,
) -> Result<TlsState, TlsError> {
    let id = u16::from(suite);
    let s = Suite::from_id(id)?;
    let (ours, theirs) = if is_client { (&logged.client, &logged.server) } else { (&logged.server, &logged.client) };
    let dir = |(seq, keys): (u64, rustls::ConnectionTrafficSecrets), first: &Option<Vec<u8>>| {
        use rustls::ConnectionTrafficSecrets as C;
        let (key, iv) = match keys {
            C::Aes128Gcm { key, iv } | C::Aes256Gcm { key, iv } | C::Chacha20Poly1305 { key, iv } => {
                (key.as_ref().to_vec(), iv.as_ref().to_vec())
            }
            _ => return Err(TlsError::Suite(id)),
        };
        let mut secret = first.clone();
        let mut found = None;
        for _ in 0..MAX_UPDATES {
            let Some(sec) = secret else { break };
            if keys_of(s, &sec).0 == key {
                found = Some(sec);
                break;
            }
            secret = Some(expand_label(s, &sec, b"traffic upd", s.hash_len()));
        }
        Ok(DirState { secret: found, key, iv, seq })
    };
    Ok(TlsState { suite: id, tx: dir(secrets.tx, ours)?, rx: dir(secrets.rx, theirs)? })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tls::keylog::SINK;
    use parking_lot::Mutex;
    use std::io::{Read, Write};
    use std::sync::Arc;

    /// A server (self-signed, "peer.test") and a client trusting it, both logging into `capture` and exporting.
    pub(crate) fn configs() -> (rustls::ServerConfig, rustls::ClientConfig) {
        let provider = crate::tls::provider();
        let ck = rcgen::generate_simple_self_signed(vec!["peer.test".into()]).expect("cert");
        let der = ck.cert.der().clone();
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(vec![der.clone()], key)
            .expect("server config");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der).expect("root");
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        server.key_log = Arc::new(CaptureLog);
        client.key_log = Arc::new(CaptureLog);
        server.enable_secret_extraction = true;
        client.enable_secret_extraction = true;
        (server, client)
    }

    fn pair() -> (rustls::ClientConnection, rustls::ServerConnection, Arc<Mutex<Secrets>>, Arc<Mutex<Secrets>>) {
        let (mut server, client) = configs();
        server.send_tls13_tickets = 2;
        let c = rustls::ClientConnection::new(Arc::new(client), "peer.test".try_into().expect("name")).expect("c");
        let s = rustls::ServerConnection::new(Arc::new(server)).expect("s");
        (c, s, Arc::new(Mutex::new(Secrets::default())), Arc::new(Mutex::new(Secrets::default())))
    }

    fn c_to_s(c: &mut rustls::ClientConnection, s: &mut rustls::ServerConnection) {
        let mut buf = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut buf).expect("write_tls");
        }
        let mut r = &buf[..];
        while !r.is_empty() {
            s.read_tls(&mut r).expect("read_tls");
        }
        s.process_new_packets().expect("process");
    }

    fn s_to_c(s: &mut rustls::ServerConnection, c: &mut rustls::ClientConnection) {
        let mut buf = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut buf).expect("write_tls");
        }
        let mut r = &buf[..];
        while !r.is_empty() {
            c.read_tls(&mut r).expect("read_tls");
        }
        c.process_new_packets().expect("process");
    }

    /// Our records in, the rustls peer reads them.
    fn to_peer(bytes: &[u8], peer: &mut rustls::ServerConnection) -> Vec<u8> {
        let mut r = bytes;
        let mut got = Vec::new();
        while !r.is_empty() {
            peer.read_tls(&mut r).expect("read_tls");
            peer.process_new_packets().expect("the peer accepts our records");
            match peer.reader().read_to_end(&mut got) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => panic!("{e}"),
            }
        }
        got
    }

    /// The rustls peer's pending records, opened by ours: the application data they carried.
    fn from_peer(peer: &mut rustls::ServerConnection, ours: &mut Records, answer: &mut Vec<u8>) -> Vec<u8> {
        let mut wire = Vec::new();
        while peer.wants_write() {
            peer.write_tls(&mut wire).expect("write_tls");
        }
        let mut data = Vec::new();
        let mut at = 0;
        while at < wire.len() {
            let len = record_len(&wire[at..]).expect("header").expect("size");
            let rec = &mut wire[at..at + len];
            if let Opened::Data(n) = ours.open(rec, answer).expect("open") {
                data.extend_from_slice(&rec[HEADER..HEADER + n]);
            }
            at += len;
        }
        data
    }

    #[test]
    fn a_session_continues_from_the_exported_keys_through_key_updates_and_tickets() {
        let (mut c, mut s, csink, ssink) = pair();
        // The handshake, with each side's secrets caught as they are logged; the server's tickets (sent once it has
        // the client's Finished) are left for our records.
        while c.is_handshaking() || s.is_handshaking() {
            SINK.with(|x| *x.borrow_mut() = Some(csink.clone()));
            s_to_c(&mut s, &mut c);
            SINK.with(|x| *x.borrow_mut() = Some(ssink.clone()));
            c_to_s(&mut c, &mut s);
            SINK.with(|x| *x.borrow_mut() = None);
        }
        assert!(csink.lock().client.is_some() && csink.lock().server.is_some());
        assert!(ssink.lock().client.is_some(), "the server logs its own copy");
        // Data under rustls first, and a key update of the client's (asking for the server's) before the export.
        c.writer().write_all(b"before").expect("w");
        c.refresh_traffic_keys().expect("update");
        c.writer().write_all(b"after update").expect("w");
        c_to_s(&mut c, &mut s);
        let mut got = vec![0; 18];
        s.reader().read_exact(&mut got).expect("read");
        assert_eq!(&got, b"beforeafter update");

        let suite = c.negotiated_cipher_suite().expect("suite").suite();
        let state =
            from_rustls(c.dangerous_extract_secrets().expect("export"), suite, &csink.lock(), true).expect("state");
        assert!(state.tx.secret.is_some() && state.rx.secret.is_some(), "both secrets found on the chain");
        // Across a process boundary: serialized.
        let state: TlsState = serde_json::from_slice(&serde_json::to_vec(&state).expect("ser")).expect("de");
        let mut ours = Records::new(&state).expect("records");
        // What the server sent since: its tickets, its answering KeyUpdate, then data under its next keys.
        s.writer().write_all(b"pong").expect("w");
        assert_eq!(from_peer(&mut s, &mut ours, &mut Vec::new()), b"pong");
        let mut out = Vec::new();
        ours.seal(b"continued", &mut out);
        assert_eq!(to_peer(&out, &mut s), b"continued");

        // The peer updates its keys (asking for ours), then sends; tickets ride along.
        s.refresh_traffic_keys().expect("update");
        s.writer().write_all(&vec![7u8; 40_000]).expect("w");
        let mut answer = Vec::new();
        let data = from_peer(&mut s, &mut ours, &mut answer);
        assert_eq!(data, vec![7u8; 40_000]);
        assert!(!answer.is_empty(), "our KeyUpdate answers the request");
        let mut more = answer;
        ours.seal(&[9u8; 20_000], &mut more);
        assert_eq!(to_peer(&more, &mut s), vec![9u8; 20_000]);

        // A second hand-over, from our own state, and a close_notify to end.
        let mut again = Records::new(&ours.state()).expect("records");
        s.writer().write_all(b"tail").expect("w");
        s.send_close_notify();
        let mut wire = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut wire).expect("w");
        }
        let first = record_len(&wire).expect("h").expect("len");
        assert_eq!(again.open(&mut wire[..first], &mut Vec::new()), Ok(Opened::Data(4)));
        let rest = &mut wire[first..];
        assert_eq!(again.open(rest, &mut Vec::new()), Ok(Opened::Closed));
    }

    #[test]
    fn a_tampered_record_is_refused() {
        let st = TlsState {
            suite: 0x1301,
            tx: DirState { secret: None, key: vec![1; 16], iv: vec![2; 12], seq: 0 },
            rx: DirState { secret: None, key: vec![1; 16], iv: vec![2; 12], seq: 0 },
        };
        let (mut a, mut b) = (Records::new(&st).expect("a"), Records::new(&st).expect("b"));
        let mut out = Vec::new();
        a.seal(b"x", &mut out);
        out[7] ^= 1;
        assert_eq!(b.open(&mut out, &mut Vec::new()), Err(TlsError::Decrypt));
        assert!(Records::new(&TlsState { suite: 0x1304, ..st }).is_err());
    }
}
