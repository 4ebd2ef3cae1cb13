//! How much memory a process holds, for the tests that drive a bound past its limit and
//! show that the member's memory stays flat (issue 20).

/// The resident set size of process `pid`, in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or_else(|| anyhow::anyhow!("no VmRSS line for process {pid}"))?;
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}

/// Fails when process `pid` grew by more than `limit` bytes since `before` (a reading of
/// [`rss_bytes`]); returns the growth, which may be negative.
pub fn assert_rss_flat(pid: u32, before: u64, limit: u64, what: &str) -> i64 {
    let after = rss_bytes(pid).expect("read the member's RSS");
    let grown = after as i64 - before as i64;
    eprintln!(
        "{what}: RSS {} -> {} KiB ({:+} KiB)",
        before / 1024,
        after / 1024,
        grown / 1024
    );
    assert!(
        grown <= limit as i64,
        "{what}: the member's RSS grew by {} KiB (from {} KiB), over the {} KiB bound",
        grown / 1024,
        before / 1024,
        limit / 1024
    );
    grown
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let rss = super::rss_bytes(std::process::id()).unwrap();
        assert!(
            rss > 1024 * 1024,
            "a test process holds more than 1 MiB: {rss}"
        );
    }
}
