//! Read-ahead for paginated LISTs: once a page of a plain range at a pinned revision is
//! answered with `more`, the page a client asks for next (kube-apiserver's LIST: the same
//! range end, limit and revision, from just after the last key answered) is read on a
//! blocking thread while the client receives and decodes this one, and handed to that
//! request when it comes ([`ReadAhead`]).
//!
//! Why: a page of 500 values of 8 KiB is about 4 MB; reading it from the backend and
//! decoding it in the client take comparable times, and without read-ahead each waits for
//! the other, page after page. With it, the member's read of page n+1 overlaps the client's
//! work on page n.
//!
//! The answer is the one a read at that time would give. The key-values at a pinned revision
//! never change; what could is checked when the page is handed over: the request went through
//! the same checks as any (validation, the read index, auth: the caller's [`Rpc::range_framed`]
//! does them first), a revision compacted since the read is answered by a fresh read (its
//! error), and the header is made then, with the store's revision then. Only requests equal
//! to the predicted one in every field take a page read ahead, and each is taken once.
//!
//! Only LISTs are read ahead: a page at a pinned revision (page two on), or a page one of a
//! range (its end and limit) whose pages were read ahead and taken recently (the last
//! [`LISTS`] such ranges): a one-off read with a limit at the current revision does not make
//! the member read a page no one asks for.
//!
//! Bounded: at most [`SLOTS`] pages are held, a page is read ahead only after one of at most
//! [`MAX_PAGE`] bytes, and a page not taken within [`TTL`] is dropped.
//!
//! [`Rpc::range_framed`]: crate::rpc::Rpc::range_framed

use std::sync::Mutex;
use std::time::{Duration, Instant};

use etcdrs_proto::etcdserverpb::RangeRequest;
use tokio::sync::oneshot;

use super::encoded_range::{Body, encode_body, is_plain};
use crate::EtcdServer;

/// Pages held (being read or read) at once.
pub const SLOTS: usize = 4;
/// A page larger than this is not followed by a read-ahead.
pub const MAX_PAGE: usize = 16 << 20;
/// How long a page read ahead waits to be taken.
pub const TTL: Duration = Duration::from_secs(5);
/// Ranges remembered as paginated (their page one is followed by a read-ahead).
pub const LISTS: usize = 16;

/// Pages read ahead of the requests that will ask for them (module docs).
#[derive(Default)]
pub struct ReadAhead {
    slots: Mutex<Vec<Slot>>,
    /// (range end, limit) of the ranges whose pages were taken, newest last.
    lists: Mutex<std::collections::VecDeque<(Vec<u8>, i64)>>,
}

struct Slot {
    request: RangeRequest,
    started: Instant,
    /// The page once read; `None` if its read failed.
    page: oneshot::Receiver<Option<Body>>,
}

/// The request for the page after `answered`, the answer to `req`, when there is one to
/// read ahead.
pub fn next_page(req: &RangeRequest, answered: &Body) -> Option<RangeRequest> {
    if !answered.more || req.limit <= 0 || answered.bytes() > MAX_PAGE || !is_plain(req) {
        return None;
    }
    let mut key = answered.last_key.clone()?;
    key.push(0);
    Some(RangeRequest {
        key,
        revision: answered.read_rev,
        ..req.clone()
    })
}

/// Whether `a` asks for exactly what `b` does (`serializable` aside: the read index is the
/// caller's, done before).
fn same_page(a: &RangeRequest, b: &RangeRequest) -> bool {
    a.key == b.key
        && a.range_end == b.range_end
        && a.limit == b.limit
        && a.revision == b.revision
        && a.sort_order == b.sort_order
        && a.sort_target == b.sort_target
        && a.keys_only == b.keys_only
        && a.count_only == b.count_only
        && a.min_mod_revision == b.min_mod_revision
        && a.max_mod_revision == b.max_mod_revision
        && a.min_create_revision == b.min_create_revision
        && a.max_create_revision == b.max_create_revision
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl ReadAhead {
    /// The request for the page after `answered`, the answer to `req`, when `req` is a page
    /// of a LIST and there is a next page to read ahead (module docs).
    pub fn after(&self, req: &RangeRequest, answered: &Body) -> Option<RangeRequest> {
        let next = next_page(req, answered)?;
        let paginated = req.revision > 0
            || lock(&self.lists)
                .iter()
                .any(|(end, limit)| *end == req.range_end && *limit == req.limit);
        paginated.then_some(next)
    }

    /// Starts reading `next` on a blocking thread, making room for it.
    pub fn start(&self, server: &EtcdServer, next: RangeRequest) {
        let (tx, rx) = oneshot::channel();
        {
            let mut slots = lock(&self.slots);
            let now = Instant::now();
            slots.retain(|slot| now.duration_since(slot.started) < TTL);
            if slots.iter().any(|slot| same_page(&slot.request, &next)) {
                return;
            }
            if slots.len() >= SLOTS {
                slots.remove(0);
            }
            slots.push(Slot {
                request: next.clone(),
                started: now,
                page: rx,
            });
        }
        let server = server.clone();
        // Task `range read-ahead`: one page, for the request predicted to ask for it; the
        // result is dropped if no one takes it.
        tokio::task::spawn_blocking(move || {
            let page = encode_body(server.store(), &next).ok();
            let _ = tx.send(page);
        });
    }

    /// The page read ahead for `req`, if one was, once read; `None` when there is none, its
    /// read failed, or its revision has been compacted since (the caller reads afresh).
    pub async fn take(&self, server: &EtcdServer, req: &RangeRequest) -> Option<Body> {
        let slot = {
            let mut slots = lock(&self.slots);
            let at = slots
                .iter()
                .position(|slot| same_page(&slot.request, req))?;
            slots.remove(at)
        };
        {
            let mut lists = lock(&self.lists);
            let list = (req.range_end.clone(), req.limit);
            if !lists.contains(&list) {
                if lists.len() >= LISTS {
                    lists.pop_front();
                }
                lists.push_back(list);
            }
        }
        let page = slot.page.await.ok().flatten()?;
        (page.read_rev >= server.store().compact_rev()).then_some(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(more: bool, len_kvs: usize) -> Body {
        Body::for_test(
            more,
            len_kvs,
            7,
            Some(b"/registry/minions/node-00499".to_vec()),
        )
    }

    #[test]
    fn the_next_page_starts_after_the_last_key_at_the_revision_read() {
        let req = RangeRequest {
            key: b"/registry/minions/".to_vec(),
            range_end: b"/registry/minions0".to_vec(),
            limit: 500,
            ..Default::default()
        };
        let next = next_page(&req, &page(true, 10)).expect("a next page");
        assert_eq!(next.key, b"/registry/minions/node-00499\0");
        assert_eq!(next.range_end, req.range_end);
        assert_eq!((next.limit, next.revision), (500, 7));
        assert!(same_page(&next, &next.clone()));
        assert!(!same_page(
            &next,
            &RangeRequest {
                limit: 499,
                ..next.clone()
            }
        ));
        assert!(
            same_page(
                &next,
                &RangeRequest {
                    serializable: true,
                    ..next.clone()
                }
            ),
            "serializable only decides the read index"
        );
    }

    #[test]
    fn no_read_ahead_after_the_last_page_nor_without_a_limit_nor_past_the_bound() {
        let req = RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            limit: 500,
            ..Default::default()
        };
        assert!(next_page(&req, &page(false, 10)).is_none());
        let unlimited = RangeRequest {
            limit: 0,
            ..req.clone()
        };
        assert!(next_page(&unlimited, &page(true, 10)).is_none());
        assert!(next_page(&req, &page(true, MAX_PAGE + 1)).is_none());
        let sorted = RangeRequest {
            sort_order: 2,
            ..req.clone()
        };
        assert!(next_page(&sorted, &page(true, 10)).is_none());
    }

    #[test]
    fn page_one_is_read_ahead_only_for_a_range_seen_paginated() {
        let ahead = ReadAhead::default();
        let req = RangeRequest {
            key: b"a".to_vec(),
            range_end: b"b".to_vec(),
            limit: 500,
            ..Default::default()
        };
        assert!(
            ahead.after(&req, &page(true, 10)).is_none(),
            "a one-off read with a limit"
        );
        let pinned = RangeRequest {
            revision: 3,
            ..req.clone()
        };
        assert!(ahead.after(&pinned, &page(true, 10)).is_some());
        lock(&ahead.lists).push_back((req.range_end.clone(), 500));
        assert!(ahead.after(&req, &page(true, 10)).is_some());
        let other = RangeRequest {
            limit: 10,
            ..req.clone()
        };
        assert!(ahead.after(&other, &page(true, 10)).is_none());
    }
}
