//! How soon freed memory goes back to the system: jemalloc's purging, set once at start.
//!
//! jemalloc keeps the pages a burst of work freed ("dirty" pages) for reuse and returns them as
//! they age past its decay time, on its background thread (without one, only while the process
//! allocates, so an idle member would keep the peak of its last burst for good). The decay
//! time is jemalloc's own default, 10 s, set here so that another build of jemalloc keeps it.
//!
//! Why not shorter: a page returned to the system and then used again costs a page fault and a
//! zeroed page, and under a steady load the pages freed are the pages about to be used (the
//! request's buffers, the raft entries, the backend's batches). With 1 s, as this member had,
//! a put of 10 KiB spent about a tenth of the member's CPU there (the kernel's `clear_page`
//! under the encoding of the raft entry and the backend's held puts); 10 s took 11% off the
//! member's CPU per put (etcd's benchmark, put, 100 clients, 10 KiB values, alternated twice:
//! 141.0 and 133.5 us against 126.0 and 119.0 us) and 256 B values did not move (39.1-46.0 us
//! against 40.6-42.2 us). The cost: after a burst an idle member's RSS comes down to its live
//! memory in about 12 s instead of 2 (after 20,000 puts of 10 KiB: 337 MiB as they end, 296
//! MiB 12 s later, 291 MiB 20 s later; with 1 s, 294 MiB 2 s later). 0 s cost a sixth of the
//! rate.
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
