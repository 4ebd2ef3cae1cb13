//! How soon freed memory goes back to the system: jemalloc's purging, set once at start.
//!
//! jemalloc keeps the pages a burst of work freed ("dirty" pages) for reuse and returns them as
//! they age past its decay time, on its background thread (without one, only while the process
//! allocates, so an idle member would keep the peak of its last burst for good). The decay
//! time is jemalloc's own default, 10 s, set here so that another build of jemalloc keeps it.
//!
//! Why not shorter: jemalloc's purging costs the member CPU under a steady load, when the pages
//! freed are the pages about to be used again (the request's buffers, the raft entries, the
//! backend's batches). Measured with etcd's benchmark (put, 100 clients, 10 KiB values, fresh
//! members, release builds alternated five times): 1 s cost 128.0, 152.5, 154.5, 146 and
//! 150 us of the member's CPU per put (6,755 puts/s on average), 10 s 140.0, 144.0, 135.5, 136
//! and 138 us (7,109 puts/s), about 5% less. Both took 4 page faults per put, so the saving is
//! in the purging itself (its `madvise` calls and, presumably, the TLB flushes they send to the
//! threads serving requests). 256 B values moved within the machine's noise. The cost: after
//! a burst an idle member's RSS comes down to its live memory in about 12 s instead of 2
//! (after 20,000 puts of 10 KiB: 337 MiB as they end, 296 MiB 12 s later, 291 MiB 20 s later;
//! with 1 s, 294 MiB 2 s later). 0 s cost a sixth of the rate.
//!
//! Best effort: a jemalloc that refuses the background thread or the new default keeps its own,
//! and the member says so.

use tikv_jemalloc_ctl::{Access, AsName};

/// Decay time of dirty pages, in milliseconds.
const DIRTY_DECAY_MS: isize = 10_000;

/// Switch jemalloc's background purging on and set its decay time, for the arenas that exist
/// now and those made later.
pub(crate) fn start() {
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        eprintln!("jemalloc background thread not started: {e}");
    }
    if let Err(e) = b"arenas.dirty_decay_ms\0".name().write(DIRTY_DECAY_MS) {
        eprintln!("jemalloc decay time not set: {e}");
        return;
    }
    let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(0);
    for arena in 0..arenas {
        let name = arena_decay(arena);
        let name = name.as_str().name();
        // An arena not made yet refuses (it takes the default set above when it is made); the
        // arena of huge allocations purges at once (0), and keeps doing so.
        if name
            .read()
            .is_ok_and(|current: isize| current > DIRTY_DECAY_MS)
        {
            let _ = name.write(DIRTY_DECAY_MS);
        }
    }
}

/// The mallctl name of one arena's dirty decay time.
fn arena_decay(arena: u32) -> String {
    format!("arena.{arena}.dirty_decay_ms\0")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The settings reach jemalloc: later arenas get the decay time, and every arena made so
    /// far that purged later than it now purges within it.
    #[test]
    fn freed_pages_go_back_within_the_decay_time() {
        start();
        let default: isize = b"arenas.dirty_decay_ms\0"
            .name()
            .read()
            .expect("the default decay time reads");
        assert_eq!(default, DIRTY_DECAY_MS);
        let arenas = tikv_jemalloc_ctl::arenas::narenas::read().expect("the arena count reads");
        let mut seen = 0;
        for arena in 0..arenas {
            if let Ok(decay) = arena_decay(arena).as_str().name().read() {
                let decay: isize = decay;
                assert!(
                    (0..=DIRTY_DECAY_MS).contains(&decay),
                    "arena {arena} decays in {decay} ms"
                );
                seen += 1;
            }
        }
        assert!(seen > 0, "no arena in use");
        assert!(tikv_jemalloc_ctl::background_thread::read().expect("the setting reads"));
    }
}
