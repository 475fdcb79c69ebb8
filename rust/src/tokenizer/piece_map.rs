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

/// Ids of the pieces one `encode` call has already run BPE on, keyed by their packed
/// bytes: source code and prose repeat most of their pieces, and a repeat then costs
/// one lookup instead of the merge loop. Bounded whatever the text (at most
/// [`PieceCache::ENTRIES`] pieces of at most 15 bytes, so 15 ids each): a text built so
/// that no piece repeats fills it, empties it and starts over, and never grows it.
#[derive(Default)]
pub(crate) struct PieceCache {
    /// Packed piece -> (start, length) of its ids in `ids`.
    index: FastMap<u128, (u32, u32)>,
    ids: Vec<u32>,
}

impl PieceCache {
    pub(crate) const ENTRIES: usize = 1 << 15;

    #[inline]
    pub(crate) fn get(&self, key: u128) -> Option<&[u32]> {
        let &(start, len) = self.index.get(&key)?;
        Some(&self.ids[start as usize..(start + len) as usize])
    }

    pub(crate) fn insert(&mut self, key: u128, ids: &[u32]) {
        if self.index.len() >= Self::ENTRIES {
            self.index.clear();
            self.ids.clear();
        }
        self.index.insert(key, (self.ids.len() as u32, ids.len() as u32));
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
        for i in 0..3 * PieceCache::ENTRIES as u32 {
            cache.insert(u128::from(i), &[i; 15]);
            assert!(cache.index.len() <= PieceCache::ENTRIES);
            assert!(cache.ids.len() <= 15 * PieceCache::ENTRIES);
        }
        let last = 3 * PieceCache::ENTRIES as u32 - 1;
        assert_eq!(cache.get(u128::from(last)), Some(&[last; 15][..]));
    }
}
