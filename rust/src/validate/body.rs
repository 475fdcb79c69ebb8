//! A large request body's bytes, in memory the process reuses.
//!
//! A stateless client resends its whole history every turn: at 250k tokens a body of
//! about 1.1 MB, read, parsed, and freed, again and again. The server fixes glibc's mmap
//! threshold low (`hotloop.heap`, so that freed frame-sized buffers go back to the
//! system instead of staying in its heap), which gives every such body pages of its own:
//! mapped anew, faulted in and zeroed by the kernel on the first write, unmapped when
//! freed. That was most of what a resent history cost beyond its parse (issue 38).
//!
//! A [`Body`] takes its buffer from a small process-wide pool of the buffers earlier
//! bodies left, and gives it back when dropped: a body no bigger than the last one
//! writes into pages that are already there. The pool is bounded ([`POOL_BYTES`] of idle
//! buffers, each at least [`POOLED_BYTES`]); what does not fit is freed as before. A
//! buffer is cleared before it is reused, and a body reads only what was written into it
//! since: nothing of an earlier request is ever read through a later one.

use std::sync::Mutex;

/// Buffers smaller than this are not pooled: the C allocator's heap recycles them.
pub const POOLED_BYTES: usize = 128 * 1024;

/// The most bytes of idle buffers the pool keeps (about 14 bodies of a 250k-token
/// history; a process's whole cost, not an agent's).
pub const POOL_BYTES: usize = 16 * 1024 * 1024;

/// Room a new buffer gets beyond the body it is made for: a history resent next turn is
/// a little longer, and should still fit.
const HEADROOM_DIVISOR: usize = 8;

struct Pool {
    idle: Vec<Vec<u8>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    idle: Vec::new(),
    bytes: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Pool {
    /// The smallest idle buffer that holds `size` bytes, emptied.
    fn take(&mut self, size: usize) -> Option<Vec<u8>> {
        let (index, _) = self
            .idle
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= size)
            .min_by_key(|(_, b)| b.capacity())?;
        let mut buffer = self.idle.swap_remove(index);
        self.bytes -= buffer.capacity();
        buffer.clear();
        Some(buffer)
    }

    /// Keep `buffer` if it is large enough to pool, making room by dropping smaller idle
    /// buffers; freed otherwise.
    fn put(&mut self, buffer: Vec<u8>) {
        let capacity = buffer.capacity();
        if !(POOLED_BYTES..=POOL_BYTES).contains(&capacity) {
            return;
        }
        while self.bytes + capacity > POOL_BYTES {
            let smallest = (0..self.idle.len()).min_by_key(|&i| self.idle[i].capacity());
            match smallest {
                Some(i) if self.idle[i].capacity() <= capacity => {
                    self.bytes -= self.idle.swap_remove(i).capacity();
                }
                _ => return, // every idle buffer is larger: keep them, free this one
            }
        }
        self.bytes += capacity;
        self.idle.push(buffer);
    }
}

/// A request body, written piece by piece as it arrives, in a pooled buffer when it is
/// declared large.
pub struct Body {
    bytes: Vec<u8>,
}

impl Body {
    /// A body expected to be `size` bytes: from the pool when that is at least
    /// [`POOLED_BYTES`] and an idle buffer holds it, else a new buffer with headroom.
    ///
    /// Only address space is reserved up front (the pages come as bytes are written);
    /// where even that is refused, the buffer grows as the pieces arrive.
    pub fn with_capacity(size: usize) -> Body {
        let reused = if size >= POOLED_BYTES {
            pool().take(size)
        } else {
            None
        };
        let bytes = reused.unwrap_or_else(|| {
            let mut fresh = Vec::new();
            let _ = fresh.try_reserve_exact(size + size / HEADROOM_DIVISOR);
            fresh
        });
        Body { bytes }
    }

    /// Append a piece; refused, not aborting the process, when memory is.
    pub fn extend(&mut self, piece: &[u8]) -> crate::Result<()> {
        self.bytes.try_reserve(piece.len()).map_err(|_| {
            crate::Error::new(
                crate::Code::InvalidValue,
                "no memory is left for this request body",
            )
        })?;
        self.bytes.extend_from_slice(piece);
        Ok(())
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        pool().put(std::mem::take(&mut self.bytes));
    }
}

/// Idle buffers and their bytes (for tests and the operations page's reckoning).
pub fn pooled() -> (usize, usize) {
    let pool = pool();
    (pool.idle.len(), pool.bytes)
}

/// Free every idle buffer (what a heap trim hands back to the system with the rest).
pub fn release_pooled() {
    let idle = {
        let mut pool = pool();
        pool.bytes = 0;
        std::mem::take(&mut pool.idle)
    };
    drop(idle); // freed outside the lock
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the pool is process-wide, and tests run in parallel threads.
    #[test]
    fn a_body_reuses_a_dropped_buffer_reads_only_its_own_bytes_and_the_pool_stays_bounded() {
        let size = POOLED_BYTES * 2;
        let mut first = Body::with_capacity(size);
        first.extend(&vec![b'x'; size]).unwrap();
        let address = first.as_slice().as_ptr();
        drop(first);
        assert!(pooled().0 >= 1);

        // A body as large, or a little larger (the headroom), gets the same pages, empty.
        let mut second = Body::with_capacity(size + 1000);
        assert_eq!(second.as_ptr_for_test(), address);
        assert!(second.is_empty());
        second.extend(b"{}").unwrap();
        assert_eq!(second.as_slice(), b"{}");
        drop(second);

        // Small bodies never touch the pool.
        let before = pooled();
        drop(Body::with_capacity(100));
        assert_eq!(pooled(), before);

        // Many large bodies alive at once, then dropped: the pool keeps at most its bound.
        let bodies: Vec<Body> = (0..40)
            .map(|_| {
                let mut body = Body::with_capacity(POOL_BYTES / 8);
                body.extend(b"[]").unwrap();
                body
            })
            .collect();
        drop(bodies);
        let (_, bytes) = pooled();
        assert!(bytes <= POOL_BYTES, "{bytes}");

        // A body larger than the whole pool is freed, not kept.
        let huge = Body::with_capacity(POOL_BYTES + 1);
        drop(huge);
        assert!(pooled().1 <= POOL_BYTES);

        // Released, the pool holds nothing.
        release_pooled();
        assert_eq!(pooled(), (0, 0));
    }

    impl Body {
        fn as_ptr_for_test(&self) -> *const u8 {
            self.bytes.as_ptr()
        }
    }
}
