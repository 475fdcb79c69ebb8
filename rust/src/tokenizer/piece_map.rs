//! Maps keyed by a piece's bytes, for the lookups every piece of a text takes (is it a
//! token? was it encoded already?). A key of up to 15 bytes (nearly every piece) is its
//! bytes packed into a u128 with the length, so a lookup hashes two words and compares
//! one integer instead of calling `memcmp`.

use foldhash::HashMap as FastMap;

/// `bytes` as one integer, if it has at most 15 of them.
#[inline]
pub(crate) fn packed(bytes: &[u8]) -> Option<u128> {
    if bytes.len() > 15 {
        return None;
    }
    let mut buf = [0u8; 16];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf[15] = bytes.len() as u8;
    Some(u128::from_le_bytes(buf))
}

/// Bytes -> value, short keys packed.
pub(crate) struct PieceMap<V> {
    short: FastMap<u128, V>,
    long: FastMap<Box<[u8]>, V>,
}

impl<V: Copy> Default for PieceMap<V> {
    fn default() -> Self {
        PieceMap {
            short: FastMap::default(),
            long: FastMap::default(),
        }
    }
}

impl<V: Copy> PieceMap<V> {
    pub(crate) fn insert(&mut self, bytes: &[u8], value: V) {
        match packed(bytes) {
            Some(key) => self.short.insert(key, value),
            None => self.long.insert(bytes.into(), value),
        };
    }

    #[inline]
    pub(crate) fn get(&self, bytes: &[u8]) -> Option<V> {
        match packed(bytes) {
            Some(key) => self.short.get(&key).copied(),
            None => self.long.get(bytes).copied(),
        }
    }
}

/// Ids of the pieces one `encode` call has already run BPE on: source code and prose
/// repeat most of their pieces, and a repeat then costs one lookup instead of the merge
/// loop. Pieces of up to 15 bytes (nearly every piece of a byte-level split) are keyed
/// by their packed bytes; longer ones up to [`PieceCache::LONGEST`] bytes (the
/// space-separated words of SentencePiece text: `self.assertEqual(`) by their bytes.
/// Bounded whatever the text (at most [`PieceCache::ENTRIES`] pieces, each of at most
/// `LONGEST` ids): a text built so that no piece repeats fills it, empties it and starts
/// over, and never grows it.
#[derive(Default)]
pub(crate) struct PieceCache {
    /// Packed piece -> (start, length) of its ids in `ids`.
    short: FastMap<u128, (u32, u32)>,
    long: FastMap<Box<[u8]>, (u32, u32)>,
    ids: Vec<u32>,
}

impl PieceCache {
    pub(crate) const ENTRIES: usize = 1 << 15;
    pub(crate) const LONGEST: usize = 64;

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
        if self.short.len() + self.long.len() >= Self::ENTRIES {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_long_keys_are_distinct() {
        let mut map = PieceMap::default();
        map.insert(b"ab", 1u32);
        map.insert(b"ab\0", 2);
        map.insert(&[b'x'; 40], 3);
        assert_eq!(map.get(b"ab"), Some(1));
        assert_eq!(map.get(b"ab\0"), Some(2));
        assert_eq!(map.get(&[b'x'; 40]), Some(3));
        assert_eq!(map.get(&[b'x'; 39]), None);
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
            assert!(cache.ids.len() <= 15 * PieceCache::ENTRIES);
        }
        let last = 3 * PieceCache::ENTRIES as u32 - 1;
        assert_eq!(cache.get(&piece(last)), Some(&[last; 15][..]));
        assert_eq!(cache.get(&piece(last - 1)), Some(&[last - 1; 15][..]));
        // Longer pieces are not kept.
        cache.insert(&[b'x'; PieceCache::LONGEST + 1], &[1]);
        assert_eq!(cache.get(&[b'x'; PieceCache::LONGEST + 1]), None);
    }
}
