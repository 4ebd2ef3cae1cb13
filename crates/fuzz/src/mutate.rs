//! The mutations: how one input of the corpus becomes a new input.
//!
//! Coverage-free, so the mutations aim at what decoders of length-prefixed and textual
//! formats get wrong: lengths and varints pushed to their extremes (trusted allocation,
//! overflow, slicing past the end), truncation anywhere (short reads), duplicated and spliced
//! regions (a structure whose offsets point into another), interesting byte values, and the
//! target's own tokens (JSON punctuation, big numbers).

use crate::rng::Rng;

/// Byte values that sit on a boundary of some encoding (sign bit, varint continuation bit,
/// all ones).
const INTERESTING_BYTES: &[u8] = &[0x00, 0x01, 0x7f, 0x80, 0xff, 0x3f, 0x40, 0xfe];

/// Varints at the extremes: zero, `u32::MAX`, `u64::MAX`, an overlong 11-byte one (invalid),
/// one that never terminates within the input, and `i64::MIN` as protobuf writes it.
const EXTREME_VARINTS: &[&[u8]] = &[
    &[0x00],
    &[0xff, 0xff, 0xff, 0xff, 0x0f],
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
    &[
        0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
    ],
    &[0xff, 0xff, 0xff],
    &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01],
    &[0xff, 0xff, 0xff, 0xff, 0x07],
];

/// Stacks one to a few mutations on a copy of one corpus input, splicing with `corpus`.
pub(crate) fn mutate(
    rng: &mut Rng,
    corpus: &[Vec<u8>],
    dictionary: &[Vec<u8>],
    max_len: usize,
) -> Vec<u8> {
    let mut input = rng.pick(corpus).clone();
    let n_mutations = if rng.one_in(4) {
        1 + rng.below(16)
    } else {
        1 + rng.below(3)
    };
    for _ in 0..n_mutations {
        mutate_once(rng, &mut input, corpus, dictionary);
        input.truncate(max_len);
    }
    input
}

fn mutate_once(rng: &mut Rng, input: &mut Vec<u8>, corpus: &[Vec<u8>], dictionary: &[Vec<u8>]) {
    if input.is_empty() {
        let n_bytes = 1 + rng.below(16);
        input.extend((0..n_bytes).map(|_| rng.next_u64() as u8));
        return;
    }
    let len = input.len();
    match rng.below(12) {
        0 => {
            let at = rng.below(len);
            input[at] ^= 1 << rng.below(8);
        }
        1 => {
            let at = rng.below(len);
            input[at] = *rng.pick(INTERESTING_BYTES);
        }
        2 => set_word(rng, input),
        3 => input.truncate(rng.below(len)),
        4 => {
            // Duplicate a slice somewhere (a repeated field, a second copy of a record).
            let start = rng.below(len);
            let end = start + 1 + rng.below((len - start).min(256));
            let slice = input[start..end].to_vec();
            let at = rng.below(len + 1);
            input.splice(at..at, slice);
        }
        5 => {
            let at = rng.below(len + 1);
            let n_bytes = 1 + rng.below(16);
            let random: Vec<u8> = (0..n_bytes).map(|_| rng.next_u64() as u8).collect();
            input.splice(at..at, random);
        }
        6 => {
            let start = rng.below(len);
            let end = start + 1 + rng.below((len - start).min(64));
            input.drain(start..end);
        }
        7 => {
            // Splice: a prefix of this input, the tail of another.
            let other = rng.pick(corpus);
            let cut = rng.below(len + 1);
            let other_cut = rng.below(other.len() + 1);
            input.truncate(cut);
            input.extend_from_slice(&other[other_cut..]);
        }
        8 | 9 => set_varint(rng, input),
        10 if !dictionary.is_empty() => {
            let token = rng.pick(dictionary).clone();
            let at = rng.below(len + 1);
            if rng.one_in(2) {
                input.splice(at..at, token);
            } else {
                let end = (at + token.len()).min(len);
                input.splice(at..end, token);
            }
        }
        _ => {
            // A run of one byte: zero-filled or 0xff-filled space, as a torn disk write leaves.
            let start = rng.below(len);
            let end = start + 1 + rng.below((len - start).min(512));
            let byte = if rng.one_in(2) { 0x00 } else { 0xff };
            input[start..end].fill(byte);
        }
    }
}

/// Overwrites a 2-, 4- or 8-byte word, little- or big-endian, with a boundary value: a
/// fixed-width length or offset field pushed to an extreme.
fn set_word(rng: &mut Rng, input: &mut [u8]) {
    let width = *rng.pick(&[2usize, 4, 8]);
    if input.len() < width {
        return;
    }
    let at = rng.below(input.len() - width + 1);
    let max = if width == 8 {
        u64::MAX
    } else {
        (1u64 << (width * 8)) - 1
    };
    let half = max / 2;
    let candidates = [
        0,
        1,
        max,
        max - 1,
        half,
        half + 1,
        input.len() as u64 & max,
        (input.len() as u64 + 1) & max,
        rng.next_u64() & max,
    ];
    let value = *rng.pick(&candidates);
    let bytes = value.to_le_bytes();
    let word = &mut input[at..at + width];
    word.copy_from_slice(&bytes[..width]);
    if rng.one_in(2) {
        word.reverse();
    }
}

/// Replaces the varint starting at a random offset (the byte there and its continuation
/// bytes) with an extreme one, or inserts one there.
fn set_varint(rng: &mut Rng, input: &mut Vec<u8>) {
    let at = rng.below(input.len());
    let mut end = at;
    while end < input.len() && input[end] & 0x80 != 0 && end - at < 10 {
        end += 1;
    }
    let end = (end + 1).min(input.len());
    let replacement = rng.pick(EXTREME_VARINTS).to_vec();
    if rng.one_in(3) {
        input.splice(at..at, replacement);
    } else {
        input.splice(at..end, replacement);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_respect_the_length_cap_and_change_inputs() {
        let corpus = vec![
            b"{\"key\":\"Zm9v\",\"value\":\"YmFy\"}".to_vec(),
            vec![0x0a, 0x03, 1, 2, 3],
        ];
        let mut n_changed = 0;
        for iteration in 0..500 {
            let mut rng = Rng::for_iteration(9, iteration);
            let input = mutate(&mut rng, &corpus, &[b"\\u".to_vec()], 40);
            assert!(input.len() <= 40);
            if !corpus.contains(&input) {
                n_changed += 1;
            }
        }
        assert!(
            n_changed > 450,
            "only {n_changed} of 500 inputs differ from the corpus"
        );
    }
}
