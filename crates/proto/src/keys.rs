//! etcd's key-range convention, shared by every crate that builds ranges: a range is
//! `[key, range_end)`, and the range of every key with a prefix ends at the prefix plus one
//! (etcd's `clientv3.GetPrefixRangeEnd`).

/// The smallest key greater than every key starting with `prefix`: the last byte below 0xff
/// incremented and the bytes after it dropped. When there is none (every byte 0xff, or an empty
/// prefix) the end is `"\0"`, which etcd reads as "to the end of the keyspace".
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_follow_etcd() {
        assert_eq!(prefix_end(b"foo"), b"fop");
        assert_eq!(prefix_end(b"ab"), b"ac".to_vec());
        assert_eq!(prefix_end(b"a/"), b"a0");
        assert_eq!(prefix_end(b"/a"), b"/b".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), b"\0");
    }
}
