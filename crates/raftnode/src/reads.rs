//! Linearizable reads waiting on raft's ReadIndex, batched as etcd's `linearizableReadLoop`
//! batches them: one ReadIndex request at a time, and it serves every read that arrived before
//! it was sent. A burst of reads then costs one heartbeat round to the followers, not one each
//! (raft-rs sends a heartbeat with its context to every follower per request).
//!
//! A read that arrives while a request is in flight waits for the next one: the answer of a
//! request sent before the read arrived may name an index older than a write the reader saw
//! acknowledged.
//!
//! A request's context ([`context`]) is this member's id and a count of its requests: the
//! leader keeps its pending requests by context and drops a second one with a context it
//! already holds, so two members' requests must never share one (etcd's contexts are ids
//! from its per-member generator for the same reason). A count alone, started at 1 on every
//! member, made followers that asked at the same moment as another member wait for the
//! read-index retry (500 ms). raft drops a request it cannot serve (a new leader that has not committed in
//! its term, a leader change): a request whose reads have all given up, or older than a bound
//! in ticks, no longer holds the next one back; its reads are still answered if it comes.

use std::collections::HashMap;

use tokio::sync::oneshot;

use crate::{Error, Result};

/// One read's answer: the index it may read at once applied.
pub(crate) type ReadDone = oneshot::Sender<Result<u64>>;

/// The context raft carries for request `ctx` of member `id`: unique across the cluster.
pub(crate) fn context(id: u64, ctx: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16);
    bytes.extend_from_slice(&id.to_be_bytes());
    bytes.extend_from_slice(&ctx.to_be_bytes());
    bytes
}

/// The request number in a context of member `id` ([`context`]); `None` for any other
/// context.
pub(crate) fn request_of(id: u64, context: &[u8]) -> Option<u64> {
    let (member, ctx) = context.split_at_checked(8)?;
    if member != id.to_be_bytes() {
        return None;
    }
    Some(u64::from_be_bytes(<[u8; 8]>::try_from(ctx).ok()?))
}

/// The reads waiting for a read index, queued or in flight.
#[derive(Default)]
pub(crate) struct ReadBatches {
    /// Reads that arrived since the last request was sent: the next request's.
    queued: Vec<ReadDone>,
    /// Requests sent and not answered, by the context raft echoes: the tick each was sent at
    /// and its reads.
    in_flight: HashMap<u64, (u64, Vec<ReadDone>)>,
    next_ctx: u64,
    /// Ticks of raft's clock seen so far.
    ticks: u64,
}

impl ReadBatches {
    /// A read that waits for the next request.
    pub(crate) fn queue(&mut self, done: ReadDone) {
        self.queued.push(done);
    }

    pub(crate) fn tick(&mut self) {
        self.ticks += 1;
    }

    /// The context of a request to send for the queued reads, if they should go now: there are
    /// some, and no request in flight is still live (answered, abandoned by all its reads, or
    /// sent `lost_after` ticks ago or more).
    pub(crate) fn next_request(&mut self, lost_after: u64) -> Option<u64> {
        self.queued.retain(|done| !done.is_closed());
        if self.queued.is_empty() {
            return None;
        }
        self.in_flight
            .retain(|_, (_, reads)| reads.iter().any(|done| !done.is_closed()));
        let ticks = self.ticks;
        if self
            .in_flight
            .values()
            .any(|(sent, _)| ticks.saturating_sub(*sent) < lost_after)
        {
            return None;
        }
        self.next_ctx += 1;
        let ctx = self.next_ctx;
        self.in_flight
            .insert(ctx, (ticks, std::mem::take(&mut self.queued)));
        Some(ctx)
    }

    /// Raft answered request `ctx` with `index`: every read of it may go.
    pub(crate) fn answer(&mut self, ctx: u64, index: u64) {
        if let Some((_, reads)) = self.in_flight.remove(&ctx) {
            for done in reads {
                let _ = done.send(Ok(index));
            }
        }
    }

    /// The queued reads cannot be asked for now (no leader known): each gets `error`.
    pub(crate) fn refuse_queued(&mut self, error: impl Fn() -> Error) {
        for done in self.queued.drain(..) {
            let _ = done.send(Err(error()));
        }
    }

    /// Every waiting read gets `error` (the node stops).
    pub(crate) fn refuse_all(&mut self, error: impl Fn() -> Error) {
        self.refuse_queued(&error);
        for (_, (_, reads)) in self.in_flight.drain() {
            for done in reads {
                let _ = done.send(Err(error()));
            }
        }
    }

    /// Requests in flight (for tests).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_names_its_member_and_request() {
        assert_eq!(request_of(3, &context(3, 7)), Some(7));
        assert_ne!(context(3, 7), context(4, 7), "members' contexts differ");
        assert_eq!(
            request_of(4, &context(3, 7)),
            None,
            "another member's request"
        );
        assert_eq!(request_of(3, &7u64.to_be_bytes()), None, "a bare count");
    }

    fn read(batches: &mut ReadBatches) -> oneshot::Receiver<Result<u64>> {
        let (done, answer) = oneshot::channel();
        batches.queue(done);
        answer
    }

    #[test]
    fn reads_that_arrive_together_share_one_request() {
        let mut b = ReadBatches::default();
        let mut first: Vec<_> = (0..5).map(|_| read(&mut b)).collect();
        let ctx = b.next_request(10).expect("a request for the queued reads");
        assert_eq!(b.next_request(10), None, "nothing queued");
        b.answer(ctx, 42);
        for answer in &mut first {
            assert_eq!(answer.try_recv().expect("answered").expect("an index"), 42);
        }
        assert_eq!(b.in_flight(), 0);
    }

    #[test]
    fn a_read_arriving_during_a_request_waits_for_the_next_one() {
        let mut b = ReadBatches::default();
        let mut early = read(&mut b);
        let first = b.next_request(10).expect("first request");
        let mut late = read(&mut b);
        assert_eq!(b.next_request(10), None, "one request at a time");
        b.answer(first, 7);
        assert_eq!(early.try_recv().expect("answered").expect("index"), 7);
        assert!(
            late.try_recv().is_err(),
            "the late read is not served by the early request"
        );
        let second = b.next_request(10).expect("the late read's request");
        assert_ne!(first, second);
        b.answer(second, 9);
        assert_eq!(late.try_recv().expect("answered").expect("index"), 9);
    }

    #[test]
    fn a_lost_request_holds_the_next_one_back_only_for_a_while() {
        let mut b = ReadBatches::default();
        let mut lost = read(&mut b);
        let first = b.next_request(3).expect("first request");
        let _late = read(&mut b);
        for _ in 0..2 {
            b.tick();
            assert_eq!(b.next_request(3), None);
        }
        b.tick();
        let second = b
            .next_request(3)
            .expect("sent once the first is presumed lost");
        // The first still answers its reads if raft answers it after all.
        b.answer(first, 5);
        assert_eq!(lost.try_recv().expect("answered").expect("index"), 5);
        assert_eq!(b.in_flight(), 1);
        b.answer(second, 6);
    }

    #[test]
    fn a_request_whose_reads_gave_up_holds_nothing_back() {
        let mut b = ReadBatches::default();
        let gave_up = read(&mut b);
        b.next_request(100).expect("first request");
        drop(gave_up);
        let _next = read(&mut b);
        assert!(b.next_request(100).is_some());
        // And reads that gave up before their request are not asked for.
        drop(read(&mut b));
        b.tick();
        assert_eq!(b.next_request(0), None);
    }

    #[test]
    fn refused_reads_get_the_error() {
        let mut b = ReadBatches::default();
        let mut queued = read(&mut b);
        b.refuse_queued(|| Error::ProposalDropped);
        assert!(matches!(
            queued.try_recv().expect("answered"),
            Err(Error::ProposalDropped)
        ));
        let mut in_flight = read(&mut b);
        b.next_request(10).expect("request");
        let mut waiting = read(&mut b);
        b.refuse_all(|| Error::Stopped);
        for answer in [&mut in_flight, &mut waiting] {
            assert!(matches!(
                answer.try_recv().expect("answered"),
                Err(Error::Stopped)
            ));
        }
    }
}
