//! The client side of the peer port besides raft's messages: the one-off calls this member
//! makes to its peers ([`calls`]: the membership, the version, a lease's renewal or time to
//! live on the leader, a hash) and the bodies they carry ([`wire`], which the peer handlers in
//! `http::peer` answer with). It names nothing of the server: calls go through a
//! `PeerClient`, or through the transport for this member's headers.

pub mod calls;
pub mod wire;
