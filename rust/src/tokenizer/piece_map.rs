//! Maps keyed by a piece's bytes, for the lookups every piece of a text takes (is it a
//! token? was it encoded already?). A key of up to 15 bytes (nearly every piece) is its
//! bytes packed into a u128 with the length, so a lookup hashes two words and compares
//! one integer instead of calling `memcmp`.
//!
//! The vocabulary's own table ([`WholeTokens`]) is read once per piece of every text,
//! and between two turns of one agent a server's other work evicts it from the CPU's
//! caches: each lookup was then a miss to memory (a 3 KB tool output at 100k tokens
//! took 250-450 us to encode cold against 50 us warm, most of it in these lookups). Its
//! slots hold the key and the id in 16 bytes, so a lookup reads one cache line, in huge
//! pages where the kernel gives them (a miss to memory then walks no page tables), and
//! [`Ahead`] asks for the slots of the next pieces before it reads the first, so that
//! their misses overlap instead of queueing.

use std::alloc::{alloc, dealloc, handle_alloc_error, Layout};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::HashMap as FastMap;

/// `bytes` as one integer, if it has at most 15 of them: the bytes, the length in the
/// last byte.
#[inline]
pub(crate) fn packed(bytes: &[u8]) -> Option<u128> {
    pack(bytes, 15)
}

/// `bytes` (at most `length_at` of them) in the low bytes of an integer, their length in
/// byte `length_at`.
#[inline]
fn pack(bytes: &[u8], length_at: usize) -> Option<u128> {
    if bytes.len() > length_at {
        return None;
    }
    let mut buf = [0u8; 16];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf[length_at] = bytes.len() as u8;
    Some(u128::from_le_bytes(buf))
}

/// The longest piece a [`WholeTokens`] slot holds; longer ones are in its map.
const SLOT_BYTES: usize = 12;
/// The key's bits of a slot: the piece's bytes, then its length in byte 12.
const KEY_BITS: u32 = 104;
const KEY_MASK: u128 = (1 << KEY_BITS) - 1;
/// Ids a slot holds (three bytes).
const SLOT_IDS: u32 = 1 << 24;

/// A piece of 1 to [`SLOT_BYTES`] bytes as a slot's key: its bytes, its length above them.
#[inline]
fn slot_key(bytes: &[u8]) -> Option<u128> {
    if bytes.is_empty() {
        return None;
    }
    pack(bytes, SLOT_BYTES)
}

/// A huge page, on x86-64 Linux.
const HUGE_PAGE: usize = 2 << 20;

/// Zeroed slots. A table of a huge page or more is allocated on huge-page boundaries and
/// advised to be made of huge pages before its first write (`MADV_HUGEPAGE`; the kernel
/// may decline, and only the walk of the page tables is saved).
struct Slots {
    ptr: NonNull<u128>,
    len: usize,
}

// SAFETY: `Slots` owns its memory, like a `Box<[u128]>`.
unsafe impl Send for Slots {}
// SAFETY: as above; shared references only read it.
unsafe impl Sync for Slots {}

impl Slots {
    fn layout(len: usize) -> Layout {
        let size = len * size_of::<u128>();
        let align = if size >= HUGE_PAGE { HUGE_PAGE } else { 64 };
        Layout::from_size_align(size, align).expect("a table of slots fits in memory")
    }

    fn zeroed(len: usize) -> Slots {
        assert!(len > 0);
        let layout = Self::layout(len);
        // SAFETY: the layout's size is not zero; the memory is written whole before use.
        unsafe {
            let ptr = alloc(layout);
            if ptr.is_null() {
                handle_alloc_error(layout);
            }
            #[cfg(target_os = "linux")]
            if layout.align() == HUGE_PAGE {
                // Advice only: a kernel without transparent huge pages refuses it.
                libc::madvise(ptr.cast(), layout.size(), libc::MADV_HUGEPAGE);
            }
            ptr.write_bytes(0, layout.size());
            Slots {
                ptr: NonNull::new_unchecked(ptr.cast()),
                len,
            }
        }
    }
}

impl Deref for Slots {
    type Target = [u128];

    fn deref(&self) -> &[u128] {
        // SAFETY: `len` initialized slots from `ptr`, owned by `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for Slots {
    fn deref_mut(&mut self) -> &mut [u128] {
        // SAFETY: as in `deref`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr.as_ptr().cast(), Self::layout(self.len)) }
    }
}

/// A 64-bit mix of a key's two halves (the folded multiply of foldhash and wyhash).
#[inline]
fn mix(key: u128) -> u64 {
    let product = u128::from(key as u64 ^ 0x243f_6a88_85a3_08d3)
        * u128::from((key >> 64) as u64 ^ 0x1319_8a2e_0370_7344);
    (product as u64) ^ ((product >> 64) as u64)
}

/// The vocabulary's tokens by their bytes: a piece that is one token is one lookup.
/// Pieces of up to [`SLOT_BYTES`] bytes sit in an open-addressed table of 16-byte slots
/// (the key and the id, at most half full, linear probing); longer ones in a map. Built
/// once from the vocabulary and never written after, so no text can lengthen a probe.
pub(crate) struct WholeTokens {
    /// 0: empty (a key's length byte is never 0).
    slots: Slots,
    long: FastMap<Box<[u8]>, u32>,
    /// `long` also holds short pieces, whose ids do not fit a slot.
    spilled: bool,
}

/// Where a piece is looked up: its slot key and first slot, or the map.
#[derive(Clone, Copy)]
enum Probe {
    Slot { key: u128, at: usize },
    Long,
}

impl WholeTokens {
    pub(crate) fn new<'a>(tokens: impl IntoIterator<Item = (&'a [u8], u32)>) -> Self {
        let mut short = Vec::new();
        let mut long = FastMap::default();
        let mut spilled = false;
        for (bytes, id) in tokens {
            match slot_key(bytes) {
                Some(key) if id < SLOT_IDS => short.push((key, id)),
                key => {
                    spilled |= key.is_some();
                    long.insert(bytes.into(), id);
                }
            }
        }
        let mut table = WholeTokens {
            slots: Slots::zeroed((2 * short.len()).next_power_of_two().max(16)),
            long,
            spilled,
        };
        for (key, id) in short {
            table.insert(key, id);
        }
        table
    }

    fn insert(&mut self, key: u128, id: u32) {
        let mask = self.slots.len() - 1;
        let mut at = mix(key) as usize & mask;
        loop {
            let slot = &mut self.slots[at];
            if *slot == 0 || *slot & KEY_MASK == key {
                // A later id of the same bytes wins, as a map's insert does.
                *slot = key | u128::from(id) << KEY_BITS;
                return;
            }
            at = (at + 1) & mask;
        }
    }

    #[inline]
    fn probe(&self, bytes: &[u8]) -> Probe {
        match slot_key(bytes) {
            Some(key) => Probe::Slot {
                key,
                at: mix(key) as usize & (self.slots.len() - 1),
            },
            None => Probe::Long,
        }
    }

    /// Ask the CPU for the cache line a later `find` of `probe` reads first.
    #[inline]
    fn prefetch(&self, probe: Probe) {
        #[cfg(target_arch = "x86_64")]
        if let Probe::Slot { at, .. } = probe {
            // SAFETY: a prefetch never faults, and `at` is within the slots.
            unsafe {
                use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                _mm_prefetch::<_MM_HINT_T0>(self.slots.as_ptr().add(at).cast());
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = probe;
    }

    #[inline]
    fn find(&self, bytes: &[u8], probe: Probe) -> Option<u32> {
        match probe {
            Probe::Slot { key, mut at } => {
                let mask = self.slots.len() - 1;
                loop {
                    let slot = self.slots[at];
                    if slot & KEY_MASK == key {
                        return Some((slot >> KEY_BITS) as u32);
                    }
                    if slot == 0 {
                        return if self.spilled {
                            self.long.get(bytes).copied()
                        } else {
                            None
                        };
                    }
                    at = (at + 1) & mask;
                }
            }
            Probe::Long => {
                if bytes.is_empty() {
                    return None;
                }
                self.long.get(bytes).copied()
            }
        }
    }

    /// The id of the token whose bytes are `bytes`, if one is.
    #[cfg(test)]
    pub(crate) fn get(&self, bytes: &[u8]) -> Option<u32> {
        self.find(bytes, self.probe(bytes))
    }
}

/// The pieces of a text looked up [`Ahead::PIECES`] at a time: each one's slot is asked
/// for as it is queued, and read once the queue is full (or the text ends), so that the
/// cache misses of those lookups overlap.
pub(crate) struct Ahead<'a> {
    queue: [(&'a str, Probe); Ahead::PIECES],
    len: usize,
}

impl Default for Ahead<'_> {
    fn default() -> Self {
        Ahead {
            queue: [("", Probe::Long); Ahead::PIECES],
            len: 0,
        }
    }
}

impl<'a> Ahead<'a> {
    pub(crate) const PIECES: usize = 16;

    /// Queue `piece`; true when the queue is full (`drain` it).
    #[inline]
    pub(crate) fn push(&mut self, tokens: &WholeTokens, piece: &'a str) -> bool {
        let probe = tokens.probe(piece.as_bytes());
        tokens.prefetch(probe);
        self.queue[self.len] = (piece, probe);
        self.len += 1;
        self.len == Self::PIECES
    }

    /// Each queued piece in order, with its id if it is one token; the queue empties.
    #[inline]
    pub(crate) fn drain(&mut self, tokens: &WholeTokens, mut each: impl FnMut(&'a str, Option<u32>)) {
        for &(piece, probe) in &self.queue[..self.len] {
            each(piece, tokens.find(piece.as_bytes(), probe));
        }
        self.len = 0;
    }
}

/// Ids of pieces BPE ran on (one `encode` call's, or a thread's across calls): source
/// code and prose repeat most of their pieces, and a repeat then costs one lookup instead
/// of the merge loop. Pieces of up to 15 bytes (nearly every piece of a byte-level split)
/// are keyed by their packed bytes; longer ones up to [`PieceCache::LONGEST`] bytes (the
/// space-separated words of SentencePiece text: `self.assertEqual(`) by their bytes.
/// Bounded whatever the text (at most its `entries` pieces and 8 ids a piece on average):
/// a text built so that no piece repeats fills it, empties it and starts over, and never
/// grows it.
pub(crate) struct PieceCache {
    /// Packed piece -> (start, length) of its ids in `ids`.
    short: FastMap<u128, (u32, u32)>,
    long: FastMap<Box<[u8]>, (u32, u32)>,
    ids: Vec<u32>,
    entries: usize,
}

impl Default for PieceCache {
    fn default() -> Self {
        PieceCache::with_entries(PieceCache::ENTRIES)
    }
}

impl PieceCache {
    pub(crate) const ENTRIES: usize = 1 << 15;
    pub(crate) const LONGEST: usize = 64;

    pub(crate) fn with_entries(entries: usize) -> Self {
        PieceCache {
            short: FastMap::default(),
            long: FastMap::default(),
            ids: Vec::new(),
            entries,
        }
    }

    /// How many pieces it holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.short.len() + self.long.len()
    }

    #[inline]
    pub(crate) fn get(&self, piece: &[u8]) -> Option<&[u32]> {
        let &(start, len) = match packed(piece) {
            Some(key) => self.short.get(&key)?,
            None if piece.len() <= Self::LONGEST => self.long.get(piece)?,
            None => return None,
        };
        Some(&self.ids[start as usize..(start + len) as usize])
    }

    pub(crate) fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if piece.len() > Self::LONGEST {
            return;
        }
        if self.short.len() + self.long.len() >= self.entries || self.ids.len() + ids.len() > 8 * self.entries
        {
            self.short.clear();
            self.long.clear();
            self.ids.clear();
        }
        let at = (self.ids.len() as u32, ids.len() as u32);
        match packed(piece) {
            Some(key) => self.short.insert(key, at),
            None => self.long.insert(piece.into(), at),
        };
        self.ids.extend_from_slice(ids);
    }
}

/// Pieces at most in the cache a thread keeps across its encodes ([`with_merged`]):
/// about 1 MB a thread at most (the two maps at their most, keys of up to
/// [`PieceCache::LONGEST`] bytes, 8 ids a piece).
pub(crate) const KEPT_PIECES: usize = 4096;

/// A text up to this long (a turn's) encodes with the pieces its thread keeps; a longer
/// one with a cache of its own, of [`PieceCache::ENTRIES`] pieces.
pub(crate) const KEPT_TEXT: usize = 64 << 10;

/// A tokenizer's identity for the pieces a thread keeps: unique for the process's life
/// (an address could be a dropped tokenizer's).
pub(crate) fn new_owner() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    /// The ids of pieces that took the merge loop, kept across a thread's encodes of
    /// turn-sized texts, and the tokenizer they are the ids of.
    static MERGED: RefCell<(u64, PieceCache)> = RefCell::new((0, PieceCache::default()));
}

/// Runs `f` on the merged pieces this thread keeps for tokenizer `owner`, across its
/// encodes: a server encodes each turn's few KB of new text with the CPU's caches cold,
/// and the merge loop then reads the vocabulary's tables from memory, where a piece
/// merged before (the identifiers and words of one codebase repeat from turn to turn,
/// and across agents) costs one lookup. Pieces kept for another tokenizer are dropped
/// first. Shared by the keys whose turns the thread encodes: what a hit saves is the
/// merge loop's work on a piece of the public vocabulary (docs/security.md).
pub(crate) fn with_merged<R>(owner: u64, f: impl FnOnce(&mut PieceCache) -> R) -> R {
    MERGED.with_borrow_mut(|(kept_for, merged)| {
        if *kept_for != owner {
            *kept_for = owner;
            *merged = PieceCache::with_entries(KEPT_PIECES);
        }
        f(merged)
    })
}

/// The tokenizer this thread keeps merged pieces for, and how many.
#[cfg(test)]
pub(crate) fn merged_here() -> (u64, usize) {
    MERGED.with_borrow(|(owner, merged)| (*owner, merged.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_tokens_find_every_token_and_nothing_else() {
        // Every length around the slots' limit, ids around their limit, and bytes that
        // differ from a token only in their length (trailing zero bytes).
        let mut tokens: Vec<(Vec<u8>, u32)> = Vec::new();
        for len in 1..=20usize {
            for i in 0..if len == 1 { 26 } else { 50 } {
                let mut bytes: Vec<u8> = (0..len).map(|k| ((i as usize * 7 + k) % 128) as u8).collect();
                bytes[0] = b'a' + (i % 26) as u8;
                if len > 1 {
                    bytes[1] = i as u8;
                }
                tokens.push((bytes, len as u32 * 1000 + i));
            }
        }
        tokens.push((b"ab".to_vec(), SLOT_IDS - 1));
        tokens.push((b"abc".to_vec(), SLOT_IDS));
        tokens.push((b"abcd".to_vec(), u32::MAX));
        let table = WholeTokens::new(tokens.iter().map(|(b, id)| (&b[..], *id)));
        let mut ahead = Ahead::default();
        let mut found = Vec::new();
        for (bytes, id) in &tokens {
            assert_eq!(table.get(bytes), Some(*id), "{bytes:?}");
            let mut padded = bytes.clone();
            padded.push(0);
            if !tokens.iter().any(|(b, _)| *b == padded) {
                assert_eq!(table.get(&padded), None, "{padded:?}");
            }
            if ahead.push(&table, std::str::from_utf8(bytes).unwrap()) {
                ahead.drain(&table, |piece, id| found.push((piece.into(), id.unwrap())));
            }
        }
        ahead.drain(&table, |piece, id| found.push((piece.into(), id.unwrap())));
        assert_eq!(found, tokens);
        assert_eq!(table.get(b""), None);
        assert_eq!(table.get(&[0; 12]), None);
        assert_eq!(table.get(&[0; 40]), None);
        assert_eq!(packed(&[0; 16]), None);
    }

    #[test]
    fn the_cache_stays_bounded() {
        let mut cache = PieceCache::default();
        let piece = |i: u32| {
            // 5 to 61 bytes: short and long keys.
            let mut bytes = i
                .to_le_bytes()
                .repeat(1 + i as usize % (PieceCache::LONGEST / 4 - 1));
            bytes.push(0);
            bytes
        };
        for i in 0..3 * PieceCache::ENTRIES as u32 {
            cache.insert(&piece(i), &[i; 15]);
            assert!(cache.short.len() + cache.long.len() <= PieceCache::ENTRIES);
            assert!(cache.ids.len() <= 8 * PieceCache::ENTRIES);
        }
        let last = 3 * PieceCache::ENTRIES as u32 - 1;
        assert_eq!(cache.get(&piece(last)), Some(&[last; 15][..]));
        assert_eq!(cache.get(&piece(last - 1)), Some(&[last - 1; 15][..]));
        // Longer pieces are not kept.
        cache.insert(&[b'x'; PieceCache::LONGEST + 1], &[1]);
        assert_eq!(cache.get(&[b'x'; PieceCache::LONGEST + 1]), None);
    }
}
