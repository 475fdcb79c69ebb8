//! A token-id prompt written as the JSON array an upstream's request body carries
//! (vLLM's `prompt`, SGLang's `input_ids`, llama.cpp's `prompt`), straight from the
//! ids the cache holds, whole, each time a request is made.
//!
//! Nothing is kept between requests: a body holds about 7 bytes per id, against the 4
//! of the ids themselves, so keeping each conversation's last body (to rewrite it from
//! its first changed byte, as this module did before) more than doubled what an agent
//! at 100k tokens holds. Writing all of it is made cheap instead: one pass, into room
//! for the longest ids (`array_room`, which the caller's reused buffer has; a first pass
//! summing the ids' decimal lengths was a fifth of the write), writes each id with one
//! 8-byte store of its comma and digits, taken four at a time
//! from a 10,000-entry table (40 KB: a table of every id's digits was faster while in
//! cache, slower out of it, as it is between an agent's turns). At 130k ids of a real
//! prompt that is about 2x faster than orjson writing the same ids from a list
//! (`benches/test_ratios.py` checks that it is not slower).

use crate::prompt_chain::Prompt;

/// Four ASCII digits of every number below 10,000, leading zeros kept, first digit in
/// the lowest byte.
static QUADS: [u32; 10_000] = quads();

const fn quads() -> [u32; 10_000] {
    let mut table = [0u32; 10_000];
    let mut n = 0;
    while n < 10_000 {
        table[n] = u32::from_le_bytes([digit(n / 1000), digit(n / 100), digit(n / 10), digit(n)]);
        n += 1;
    }
    table
}

/// Ids below this fit a word with a comma: 7 digits at most.
const PACKED: u32 = 10_000_000;

/// The `len` decimal digits of `id` (below 10^8), first digit in the lowest byte.
#[inline]
fn digits(id: u32, len: usize) -> u64 {
    let eight = u64::from(QUADS[(id / 10_000) as usize]) | u64::from(QUADS[(id % 10_000) as usize]) << 32;
    eight >> (8 * (8 - len))
}

/// The last decimal digit of `n`, in ASCII.
const fn digit(n: usize) -> u8 {
    b'0' + (n % 10) as u8
}

/// `DIGIT_STEPS[log2(x)]`: added to `x` (below 2^32), its high half is `x`'s decimal
/// length (Lemire's digit count: `decimal_len`).
static DIGIT_STEPS: [u64; 32] = digit_steps();

const fn digit_steps() -> [u64; 32] {
    let mut table = [0u64; 32];
    let mut log2 = 0;
    while log2 < 32 {
        // The length of the smallest number of this log2, and the power of ten above it.
        let (mut len, mut power) = (1u64, 10u64);
        while power <= 1 << log2 {
            len += 1;
            power *= 10;
        }
        table[log2] = if power >> 32 == 0 {
            ((len + 1) << 32) - power
        } else {
            len << 32
        };
        log2 += 1;
    }
    table
}

/// How many decimal digits `id` has.
#[inline]
fn decimal_len(id: u32) -> usize {
    let log2 = 31 - (id | 1).leading_zeros();
    ((u64::from(id) + DIGIT_STEPS[log2 as usize]) >> 32) as usize
}

/// The most bytes the prompt's array can take: `[`, `]`, and for each id a comma and
/// up to ten digits. `write_body` needs this much room beside its head and tail.
pub fn array_room(prompt: &Prompt) -> usize {
    2 + 11 * prompt.len()
}

/// Writes the prompt's array into `out` from `at` on (at most `array_room` bytes) and
/// returns where it ends. The bytes after it up to 8 past its end may be overwritten: the
/// caller writes what follows the array after it.
pub fn write_array(prompt: &Prompt, out: &mut [u8], at: usize) -> usize {
    // Every id is written after a comma; the first id's comma is then the `[`.
    let mut end = at;
    prompt.tokens.for_each_slice(0, prompt.len(), &mut |ids: &[u32]| {
        // A local, not the captured `end`: kept in a register across the stores.
        let mut pos = end;
        for &id in ids {
            match out.get_mut(pos..pos + 8) {
                Some(room) if id < PACKED => {
                    let len = decimal_len(id);
                    room.copy_from_slice(&(digits(id, len) << 8 | u64::from(b',')).to_le_bytes());
                    pos += 1 + len;
                }
                _ => {
                    out[pos] = b',';
                    pos = write_decimal(out, pos + 1, id);
                }
            }
        }
        end = pos;
    });
    let mut pos = end;
    if pos == at {
        pos += 1;
    }
    out[at] = b'[';
    out[pos] = b']';
    pos + 1
}

/// `value` in decimal at `out[at..]`; returns where it ends.
fn write_decimal(out: &mut [u8], at: usize, mut value: u32) -> usize {
    let end = at + decimal_len(value);
    for byte in out[at..end].iter_mut().rev() {
        *byte = b'0' + (value % 10) as u8;
        value /= 10;
    }
    end
}

/// `head`, the prompt's array, then `tail`, at the start of `out` (at least
/// `head.len() + array_room + tail.len()` bytes); returns the body's length.
pub fn write_body(prompt: &Prompt, head: &[u8], tail: &[u8], out: &mut [u8]) -> usize {
    out[..head.len()].copy_from_slice(head);
    let end = write_array(prompt, out, head.len());
    out[end..end + tail.len()].copy_from_slice(tail);
    end + tail.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(ids: &[u32], head: &[u8], tail: &[u8]) -> String {
        let prompt = Prompt::from_tokens(ids);
        // Bytes past the body's end are left as they were.
        let mut out = vec![b'x'; head.len() + array_room(&prompt) + tail.len()];
        let len = write_body(&prompt, head, tail, &mut out);
        out.truncate(len);
        String::from_utf8(out).unwrap()
    }

    fn expected(ids: &[u32]) -> String {
        serde_json::to_string(ids).unwrap()
    }

    #[test]
    fn writes_the_ids_as_json() {
        assert_eq!(body(&[], b"", b""), "[]");
        let ids = [
            0,
            7,
            10,
            99,
            100,
            9_999,
            10_000,
            200_012,
            9_999_999,
            10_000_000,
            u32::MAX,
        ];
        assert_eq!(body(&ids, b"", b""), expected(&ids));
        // Every length at the array's end, where the one-store path has no room.
        for id in [5, 55, 555, 5_555, 55_555, 555_555, 5_555_555] {
            assert_eq!(body(&[id, id], b"", b""), expected(&[id, id]));
            assert_eq!(body(&[id], b"{", b"}"), format!("{{[{id}]}}"));
        }
    }

    #[test]
    fn every_id_of_a_vocabulary_is_written_as_json() {
        let ids: Vec<u32> = (0..300_000).chain([12_345_678, 999_999_999, 1 << 31]).collect();
        let head = br#"{"prompt":"#;
        let tail = br#","stream":true}"#;
        let written = body(&ids, head, tail);
        assert_eq!(
            written,
            format!(r#"{{"prompt":{},"stream":true}}"#, expected(&ids))
        );
    }
}
