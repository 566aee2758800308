//! A TCP ⇄ TCP connection's copy phase, where a hand-over can take it: the relay runs until it ends, is forced, is
//! closed by policy, or is asked to pause (asked first to describe itself, it sends its metadata and goes on); a
//! paused relay is offered to the hub and either leaves with the successor or carries on where it stopped. The
//! successor's side (the same phase, from the state that crossed) is the proxy's: `proxy::resume`.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::{ConnMeta, Hub, Parcel, Verdict};
use crate::copy::TcpRelay;

pub enum Carried {
    /// The relay ended here: how, and the bytes moved each way (leg 0, leg 1), counted across processes.
    Ended(io::Result<()>, (u64, u64)),
    /// The successor has it.
    HandedOver,
}

/// What a relay is ended by besides its own end.
pub struct Ends<'a> {
    /// The drain's deadline.
    pub force: &'a CancellationToken,
    /// A policy change that denies it (inbound), or a token never cancelled.
    pub close: &'a CancellationToken,
}

/// Run `relay` to its end, or until a successor takes it. `describe` is called only when pausing.
pub async fn carry(
    hub: &Arc<Hub>,
    mut relay: TcpRelay<'_>,
    ends: Ends<'_>,
    describe: impl Fn() -> ConnMeta,
) -> Carried {
    let ticket = hub.ticket();
    // The round this connection described itself in: its metadata crossed then, and need not again.
    let mut described = None;
    loop {
        let round = ticket.round();
        let fresh = described != Some(round.generation);
        tokio::select! {
            r = &mut relay => return Carried::Ended(r.map(|_| ()), relay.moved()),
            _ = ends.force.cancelled() => return Carried::Ended(Err(io::Error::other("drained")), relay.moved()),
            _ = ends.close.cancelled() => {
                return Carried::Ended(Err(io::Error::other("connection closed due to policy change")), relay.moved())
            }
            _ = round.describe.cancelled(), if fresh => {
                described = Some(round.generation);
                ticket.described(describe());
            }
            _ = round.pause.cancelled() => {
                let legs = relay.legs();
                let meta = fresh.then(&describe);
                let fds = relay.sockets().map(|s| s.as_raw_fd()).to_vec();
                // Boxed: the parcel exists only while paused; the relay's future stays small.
                let offer = Box::pin(ticket.offer(round.generation, Parcel { id: ticket.id, fds, meta, legs, hbone: None }));
                if offer.await == Verdict::Gone {
                    return Carried::HandedOver;
                }
                // Kept: a fresh round is in place by now, and the relay goes on where it stopped.
            }
        }
    }
}
