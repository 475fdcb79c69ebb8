//! The agenda of BPE: candidate merges as (rank, left symbol position), popped lowest
//! rank first, leftmost on ties, whatever order they were queued in.
//!
//! A small piece uses one binary heap. A long piece (`"A" * 1_000_000`, a run of spaces,
//! a SentencePiece text with no space) would make that heap as large as the piece, and
//! each pop would then walk ~20 levels of a heap that no longer fits in cache: the cost
//! per byte grew 2.4x from 10 KB to 1 MB. Long pieces instead queue positions in one
//! bucket per rank. A rank's bucket is sorted once when that rank comes up (positions
//! arrive nearly in order, so the sort is close to a linear scan) and drained in order;
//! positions queued for the rank being drained (a merge re-creating a pair of the same
//! rank to its left) go to a small heap beside it, and pairs of a lower rank (possible
//! with scores or hand-made merges) to another small heap drained before it. The pop
//! order is exactly the heap's.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use foldhash::HashMap as FastMap;

/// Pieces of this many symbols or more use rank buckets.
const BUCKETED_FROM: usize = 512;

#[derive(Default)]
pub(crate) struct Agenda {
    /// Small pieces: (rank << 32 | position), smallest first.
    heap: BinaryHeap<Reverse<u64>>,
    bucketed: bool,
    /// Long pieces: the queued positions of each rank not being drained, unsorted.
    buckets: FastMap<u32, Vec<u32>>,
    /// The ranks that have a bucket, smallest first.
    ranks: BinaryHeap<Reverse<u32>>,
    /// The rank being drained: its bucket sorted, the next position to pop, and the
    /// positions queued for it since.
    current: Option<u32>,
    queue: Vec<u32>,
    next: usize,
    late: BinaryHeap<Reverse<u32>>,
    /// Pairs of a rank lower than the one being drained, queued since it began (a merge
    /// that makes a pair which merges earlier; Gemma's runs of spaces do it at every
    /// merge): (rank << 32 | position), drained first.
    low: BinaryHeap<Reverse<u64>>,
    /// Emptied buckets, reused.
    spare: Vec<Vec<u32>>,
}

fn key(rank: u32, position: u32) -> Reverse<u64> {
    Reverse((u64::from(rank) << 32) | u64::from(position))
}

fn unkey(Reverse(key): Reverse<u64>) -> (u32, u32) {
    ((key >> 32) as u32, key as u32)
}

impl Agenda {
    /// Empty the agenda for a piece of `symbols` symbols.
    pub(crate) fn start(&mut self, symbols: usize) {
        self.start_with(symbols >= BUCKETED_FROM);
    }

    fn start_with(&mut self, bucketed: bool) {
        self.heap.clear();
        self.bucketed = bucketed;
        for (_, bucket) in self.buckets.drain() {
            self.spare.push(bucket);
        }
        self.ranks.clear();
        self.current = None;
        self.queue.clear();
        self.next = 0;
        self.late.clear();
        self.low.clear();
    }

    pub(crate) fn push(&mut self, rank: u32, position: u32) {
        if !self.bucketed {
            self.heap.push(key(rank, position));
            return;
        }
        match self.current {
            Some(current) if rank < current => self.low.push(key(rank, position)),
            Some(current) if rank == current => self.late.push(Reverse(position)),
            // Higher than the rank being drained (or nothing drained yet): a bucket.
            _ => {
                let (ranks, spare) = (&mut self.ranks, &mut self.spare);
                self.buckets
                    .entry(rank)
                    .or_insert_with(|| {
                        ranks.push(Reverse(rank));
                        let mut bucket = spare.pop().unwrap_or_default();
                        bucket.clear();
                        bucket
                    })
                    .push(position);
            }
        }
    }

    /// The lowest (rank, position) queued, removed.
    pub(crate) fn pop(&mut self) -> Option<(u32, u32)> {
        if !self.bucketed {
            return self.heap.pop().map(unkey);
        }
        loop {
            // Everything in `low` ranks below the rank being drained, which ranks below
            // every bucket.
            if let Some(entry) = self.low.pop() {
                return Some(unkey(entry));
            }
            if let Some(rank) = self.current {
                let queued = self.queue.get(self.next).copied();
                let late = self.late.peek().map(|&Reverse(p)| p);
                match (queued, late) {
                    (Some(q), Some(l)) if l < q => {
                        self.late.pop();
                        return Some((rank, l));
                    }
                    (Some(q), _) => {
                        self.next += 1;
                        return Some((rank, q));
                    }
                    (None, Some(l)) => {
                        self.late.pop();
                        return Some((rank, l));
                    }
                    (None, None) => self.current = None,
                }
            }
            let Reverse(rank) = self.ranks.pop()?;
            let mut bucket = self
                .buckets
                .remove(&rank)
                .expect("every queued rank has a bucket");
            bucket.sort_unstable();
            let drained = std::mem::replace(&mut self.queue, bucket);
            self.spare.push(drained);
            self.next = 0;
            self.current = Some(rank);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any interleaving of pushes and pops gives the binary heap's order, in both modes.
        #[test]
        fn pops_in_heap_order(
            ops in prop::collection::vec((0u32..6, 0u32..40, any::<bool>()), 0..300),
            bucketed in any::<bool>(),
        ) {
            let mut agenda = Agenda::default();
            agenda.start_with(bucketed);
            let mut heap = BinaryHeap::new();
            for (rank, position, pop) in ops {
                if pop {
                    prop_assert_eq!(agenda.pop(), heap.pop().map(|Reverse(k)| k));
                } else {
                    agenda.push(rank, position);
                    heap.push(Reverse((rank, position)));
                }
            }
            while let Some(Reverse(k)) = heap.pop() {
                prop_assert_eq!(agenda.pop(), Some(k));
            }
            prop_assert_eq!(agenda.pop(), None);
            // Reused for the next piece with nothing left over.
            agenda.start_with(bucketed);
            agenda.push(3, 1);
            prop_assert_eq!(agenda.pop(), Some((3, 1)));
        }
    }
}
