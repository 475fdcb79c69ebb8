//! `Chunks<T>`: the persistent, append-mostly vector that holds a conversation's tokens,
//! its segments and a chat template's text.
//!
//! Elements live in reference-counted leaves of `Element::LEAF` elements under a trie of
//! reference-counted branches of [`FAN`] children. Cloning is O(1) (two Arc bumps); a clone
//! and its original share every node until one of them writes, and a write copies only
//! the nodes on the path to the written leaf (at most one partial leaf plus one branch per
//! level). That is what lets a checkpoint, a fork and a prompt share a million-token
//! history without copying it, and what keeps the bytes a checkpoint adds to its parent
//! proportional to the tokens it added.
//!
//! Every leaf but the last is full, so element `i` sits at a position computed from `i`
//! alone; two vectors that share a prefix of nodes share it at the same positions, which
//! makes `common_prefix_len` and `unique_bytes` walks that skip shared subtrees by pointer.
//!
//! A full leaf of an element type that packs (`Element::pack`: token ids) is kept packed,
//! about half its bytes for the ids of real text: a conversation's cache is mostly full
//! leaves of ids. Reading one unpacks it (`for_each_slice` hands out slices of a scratch
//! leaf), so packed elements are not addressable by reference: `get` is for the element
//! types that never pack (`Addressable`).

use std::mem::{size_of, size_of_val};
use std::sync::Arc;

/// Children per branch.
pub const FAN: usize = 16;

/// Bytes of an `Arc` allocation's header (strong and weak counts).
const ARC_HEADER: usize = 2 * size_of::<usize>();

/// An element type: its leaf size and what it owns outside the trie.
pub trait Element: Clone {
    /// Elements per leaf. About 512 bytes of elements: small enough that copying the partial
    /// tail leaf on a checkpoint costs little, large enough that per-leaf overhead stays
    /// around 10%.
    const LEAF: usize;

    /// Heap bytes the element owns.
    fn heap_bytes(&self) -> usize;
    /// Whether `self` and `other` share their heap storage (counted once).
    fn shares_heap(&self, other: &Self) -> bool;
    /// A full leaf in fewer bytes, kept in its place; None: the leaf stays as it is.
    fn pack(_leaf: &[Self]) -> Option<Arc<[u16]>> {
        None
    }
    /// Appends the elements of a leaf `pack` made to `out`.
    fn unpack(_packed: &[u16], _out: &mut Vec<Self>) {
        unreachable!("only an element type that packs has packed leaves")
    }
}

/// An element type whose leaves never pack: its elements can be read by reference.
pub trait Addressable: Element {}

/// Token ids: most ids of real text are below 65,536 (o200k_base: about 94% of a corpus
/// of Python source), so a full leaf packs as the ids' low halves, then an (index, high
/// half) pair for each id that has one: about 2.1 bytes an id instead of 4 (2.5 against
/// 4.5 with a leaf's headers). Unpacking is a widening copy and a few patches.
impl Element for u32 {
    const LEAF: usize = 128;
    fn heap_bytes(&self) -> usize {
        0
    }
    fn shares_heap(&self, _: &Self) -> bool {
        true
    }
    fn pack(leaf: &[u32]) -> Option<Arc<[u16]>> {
        let mut packed: Vec<u16> = leaf.iter().map(|&id| id as u16).collect();
        for (index, &id) in leaf.iter().enumerate() {
            let high = (id >> 16) as u16;
            if high != 0 {
                packed.extend([index as u16, high]);
            }
        }
        (packed.len() < 2 * leaf.len()).then(|| Arc::from(packed))
    }
    fn unpack(packed: &[u16], out: &mut Vec<u32>) {
        let start = out.len();
        let (low, high) = packed.split_at(Self::LEAF);
        out.extend(low.iter().map(|&half| u32::from(half)));
        for pair in high.chunks_exact(2) {
            out[start + usize::from(pair[0])] |= u32::from(pair[1]) << 16;
        }
    }
}

/// Rendered text (the chat-template prompt's), byte by byte.
impl Element for u8 {
    const LEAF: usize = 512;
    fn heap_bytes(&self) -> usize {
        0
    }
    fn shares_heap(&self, _: &Self) -> bool {
        true
    }
}

impl Addressable for u8 {}

enum Node<T> {
    Leaf(Arc<Vec<T>>),
    /// A full leaf, packed (`Element::pack`).
    Packed(Arc<[u16]>),
    Branch(Arc<Vec<Node<T>>>),
}

impl<T> Clone for Node<T> {
    fn clone(&self) -> Self {
        match self {
            Node::Leaf(v) => Node::Leaf(Arc::clone(v)),
            Node::Packed(p) => Node::Packed(Arc::clone(p)),
            Node::Branch(c) => Node::Branch(Arc::clone(c)),
        }
    }
}

impl<T> Node<T> {
    fn same(&self, other: &Node<T>) -> bool {
        match (self, other) {
            (Node::Leaf(a), Node::Leaf(b)) => Arc::ptr_eq(a, b),
            (Node::Packed(a), Node::Packed(b)) => Arc::ptr_eq(a, b),
            (Node::Branch(a), Node::Branch(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    fn is_leaf(&self) -> bool {
        !matches!(self, Node::Branch(_))
    }

    fn empty(height: u32) -> Node<T> {
        if height == 0 {
            Node::Leaf(Arc::new(Vec::new()))
        } else {
            Node::Branch(Arc::new(Vec::new()))
        }
    }

    fn first_child(&self) -> &Node<T> {
        match self {
            Node::Branch(c) => &c[0],
            Node::Leaf(_) | Node::Packed(_) => self,
        }
    }
}

impl<T: Element> Node<T> {
    /// The elements of a leaf node: its own, or its packed ones unpacked into `scratch`.
    fn elements<'a>(&'a self, scratch: &'a mut Vec<T>) -> &'a [T] {
        match self {
            Node::Leaf(v) => v,
            Node::Packed(p) => {
                scratch.clear();
                T::unpack(p, scratch);
                scratch
            }
            Node::Branch(_) => unreachable!("a branch has no elements of its own"),
        }
    }
}

/// Elements a subtree of this height holds when full.
fn capacity<T: Element>(height: u32) -> usize {
    T::LEAF * FAN.pow(height)
}

pub struct Chunks<T> {
    root: Option<Node<T>>,
    /// Height of the root: 0 when the root is a leaf.
    height: u32,
    len: usize,
}

impl<T> Clone for Chunks<T> {
    fn clone(&self) -> Self {
        Chunks {
            root: self.root.clone(),
            height: self.height,
            len: self.len,
        }
    }
}

impl<T> Default for Chunks<T> {
    fn default() -> Self {
        Chunks {
            root: None,
            height: 0,
            len: 0,
        }
    }
}

impl<T: Element> Chunks<T> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn push(&mut self, x: T) {
        self.extend_from_slice(std::slice::from_ref(&x));
    }

    pub fn extend_from_slice(&mut self, mut xs: &[T]) {
        while !xs.is_empty() {
            if self.root.is_none() {
                self.root = Some(Node::empty(0));
                self.height = 0;
            }
            if self.len == capacity::<T>(self.height) {
                let old = self.root.take().expect("root exists");
                self.root = Some(Node::Branch(Arc::new(vec![old])));
                self.height += 1;
            }
            let root = self.root.as_mut().expect("root exists");
            let n = fill(root, self.height, self.len, xs);
            self.len += n;
            xs = &xs[n..];
        }
    }

    /// Keep the first `len` elements. Copies at most the nodes on the new right edge that
    /// are shared with another vector.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        if len == 0 {
            *self = Chunks::default();
            return;
        }
        while self.height > 0 && len <= capacity::<T>(self.height - 1) {
            let root = self.root.take().expect("root exists");
            self.root = Some(root.first_child().clone());
            self.height -= 1;
        }
        trim(self.root.as_mut().expect("root exists"), self.height, len);
        self.len = len;
    }

    /// Calls `f` with the elements of `start..end`, leaf by leaf, in order.
    pub fn for_each_slice(&self, start: usize, end: usize, f: &mut impl FnMut(&[T])) {
        let end = end.min(self.len);
        if let Some(root) = &self.root {
            if start < end {
                visit(root, self.height, start, end, f, &mut Vec::new());
            }
        }
    }

    /// Copies `start..end` into a new vector.
    pub fn to_vec(&self, start: usize, end: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(end.min(self.len).saturating_sub(start));
        self.for_each_slice(start, end, &mut |s| out.extend_from_slice(s));
        out
    }

    /// Bytes held by the nodes (and element heap storage) of `self` that `base` does not
    /// share. With `base` = None: everything `self` holds.
    pub fn unique_bytes(&self, base: Option<&Chunks<T>>) -> usize {
        let Some(root) = &self.root else { return 0 };
        let mut node = root;
        let mut height = self.height;
        let mut bytes = 0;
        let base_root = base.and_then(|b| b.root.as_ref().map(|r| (r, b.height)));
        let mut other = match base_root {
            Some((mut r, mut h)) => {
                // Align heights: the shallower root corresponds to the leftmost node of the
                // same height in the deeper trie.
                while h > height {
                    r = r.first_child();
                    h -= 1;
                }
                while height > h {
                    // Above the base's height everything is new except, possibly, the
                    // leftmost subtree, which is compared below.
                    bytes += own_bytes(node);
                    if let Node::Branch(children) = node {
                        bytes += children[1..].iter().map(|c| unique(c, None)).sum::<usize>();
                    }
                    node = node.first_child();
                    height -= 1;
                }
                Some(r)
            }
            None => None,
        };
        if let Some(r) = other {
            if std::mem::discriminant(r) != std::mem::discriminant(node) {
                other = None;
            }
        }
        bytes + unique(node, other)
    }
}

impl<T: Addressable> Chunks<T> {
    pub fn get(&self, mut index: usize) -> Option<&T> {
        if index >= self.len {
            return None;
        }
        let mut node = self.root.as_ref()?;
        let mut height = self.height;
        loop {
            match node {
                Node::Leaf(v) => return v.get(index),
                Node::Branch(c) => {
                    let cap = capacity::<T>(height - 1);
                    node = &c[index / cap];
                    index %= cap;
                    height -= 1;
                }
                Node::Packed(_) => unreachable!("an addressable element type never packs"),
            }
        }
    }

    pub fn last(&self) -> Option<&T> {
        self.len.checked_sub(1).and_then(|i| self.get(i))
    }
}

impl<T: Element + PartialEq> Chunks<T> {
    /// Length of the common prefix of two vectors. Subtrees shared by pointer are skipped
    /// whole, so the cost is O(shared subtrees on the boundary + one leaf compared).
    pub fn common_prefix_len(&self, other: &Chunks<T>) -> usize {
        let (Some(mut a), Some(mut b)) = (self.root.as_ref(), other.root.as_ref()) else {
            return 0;
        };
        let (mut ha, mut hb) = (self.height, other.height);
        let (mut la, mut lb) = (self.len, other.len);
        while ha > hb {
            a = a.first_child();
            ha -= 1;
            la = la.min(capacity::<T>(ha));
        }
        while hb > ha {
            b = b.first_child();
            hb -= 1;
            lb = lb.min(capacity::<T>(hb));
        }
        common(a, b, ha, la, lb, &mut (Vec::new(), Vec::new()))
    }
}

/// Append as much of `xs` as fits in the subtree `node` (height `height`, `filled`
/// elements already in it); returns how many were appended.
fn fill<T: Element>(node: &mut Node<T>, height: u32, filled: usize, xs: &[T]) -> usize {
    match node {
        Node::Leaf(v) => {
            let v = Arc::make_mut(v);
            let n = (T::LEAF - v.len()).min(xs.len());
            // Grow by doubling, capped at LEAF: a checkpoint that shares a partial leaf
            // keeps only what it holds (a copy on write has capacity == len), and no leaf
            // ever has more than LEAF elements of capacity.
            let cap = (v.len() + n).max(2 * v.len()).min(T::LEAF);
            v.reserve_exact(cap - v.len());
            v.extend_from_slice(&xs[..n]);
            if v.len() == T::LEAF {
                if let Some(packed) = T::pack(v) {
                    *node = Node::Packed(packed);
                }
            }
            n
        }
        // Full: it takes nothing more.
        Node::Packed(_) => 0,
        Node::Branch(children) => {
            let children = Arc::make_mut(children);
            let child_cap = capacity::<T>(height - 1);
            let mut done = 0;
            while done < xs.len() {
                let at = filled + done;
                let index = at / child_cap;
                if index >= FAN {
                    break;
                }
                if index == children.len() {
                    children.push(Node::empty(height - 1));
                }
                done += fill(&mut children[index], height - 1, at % child_cap, &xs[done..]);
            }
            done
        }
    }
}

/// Keep the first `keep` (> 0) elements of the subtree `node`.
fn trim<T: Element>(node: &mut Node<T>, height: u32, keep: usize) {
    match node {
        Node::Leaf(v) => {
            if v.len() > keep {
                Arc::make_mut(v).truncate(keep);
            }
        }
        Node::Packed(_) => {
            if keep < T::LEAF {
                let mut kept = Vec::new();
                node.elements(&mut kept);
                kept.truncate(keep);
                *node = Node::Leaf(Arc::new(kept));
            }
        }
        Node::Branch(children) => {
            let child_cap = capacity::<T>(height - 1);
            let n = keep.div_ceil(child_cap);
            let children = Arc::make_mut(children);
            children.truncate(n);
            trim(&mut children[n - 1], height - 1, keep - (n - 1) * child_cap);
        }
    }
}

fn visit<T: Element>(
    node: &Node<T>,
    height: u32,
    start: usize,
    end: usize,
    f: &mut impl FnMut(&[T]),
    scratch: &mut Vec<T>,
) {
    match node {
        Node::Leaf(_) | Node::Packed(_) => {
            let elements = node.elements(scratch);
            f(&elements[start..end.min(elements.len())]);
        }
        Node::Branch(children) => {
            let cap = capacity::<T>(height - 1);
            let first = start / cap;
            for (i, child) in children.iter().enumerate().skip(first) {
                let base = i * cap;
                if base >= end {
                    break;
                }
                visit(
                    child,
                    height - 1,
                    start.saturating_sub(base),
                    (end - base).min(cap),
                    f,
                    scratch,
                );
            }
        }
    }
}

fn own_bytes<T: Element>(node: &Node<T>) -> usize {
    match node {
        Node::Leaf(v) => {
            ARC_HEADER
                + size_of::<Vec<T>>()
                + v.capacity() * size_of::<T>()
                + v.iter().map(Element::heap_bytes).sum::<usize>()
        }
        Node::Packed(p) => ARC_HEADER + size_of_val::<[u16]>(p),
        Node::Branch(c) => ARC_HEADER + size_of::<Vec<Node<T>>>() + c.capacity() * size_of::<Node<T>>(),
    }
}

fn unique<T: Element>(node: &Node<T>, other: Option<&Node<T>>) -> usize {
    match (node, other) {
        (n, Some(o)) if n.same(o) => 0,
        (Node::Leaf(v), Some(Node::Leaf(w))) => {
            let shared: usize = v
                .iter()
                .zip(w.iter())
                .filter(|(a, b)| a.shares_heap(b))
                .map(|(a, _)| a.heap_bytes())
                .sum();
            own_bytes(node) - shared
        }
        (Node::Branch(c), Some(Node::Branch(d))) => {
            own_bytes(node)
                + c.iter()
                    .enumerate()
                    .map(|(i, child)| unique(child, d.get(i)))
                    .sum::<usize>()
        }
        (Node::Branch(c), _) => own_bytes(node) + c.iter().map(|child| unique(child, None)).sum::<usize>(),
        (Node::Leaf(_) | Node::Packed(_), _) => own_bytes(node),
    }
}

fn common<T: Element + PartialEq>(
    a: &Node<T>,
    b: &Node<T>,
    height: u32,
    la: usize,
    lb: usize,
    scratch: &mut (Vec<T>, Vec<T>),
) -> usize {
    if a.same(b) {
        return la.min(lb);
    }
    match (a, b) {
        _ if a.is_leaf() && b.is_leaf() => {
            let (x, y) = (a.elements(&mut scratch.0), b.elements(&mut scratch.1));
            x.iter().zip(y.iter()).take_while(|(p, q)| p == q).count()
        }
        (Node::Branch(x), Node::Branch(y)) => {
            let cap = capacity::<T>(height - 1);
            let mut total = 0;
            for (i, (cx, cy)) in x.iter().zip(y.iter()).enumerate() {
                let (ca, cb) = ((la - i * cap).min(cap), (lb - i * cap).min(cap));
                let n = common(cx, cy, height - 1, ca, cb, scratch);
                total += n;
                if n < ca.max(cb) || ca != cb {
                    break;
                }
            }
            total
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn from(xs: &[u32]) -> Chunks<u32> {
        let mut c = Chunks::default();
        c.extend_from_slice(xs);
        c
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(Vec<u32>),
        Truncate(usize),
        Snapshot,
        Restore(usize),
    }

    /// Ids as a vocabulary's: mostly below 65,536, a few above (a leaf packs with
    /// patches), now and then runs of large ones (a leaf that does not pack).
    fn id() -> impl Strategy<Value = u32> {
        prop_oneof![
            8 => 0u32..5,
            4 => 60_000u32..70_000,
            1 => any::<u32>(),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => prop::collection::vec(id(), 0..600).prop_map(Op::Push),
            2 => (0usize..10_000).prop_map(Op::Truncate),
            1 => Just(Op::Snapshot),
            1 => (0usize..100).prop_map(Op::Restore),
        ]
    }

    proptest! {
        /// Any sequence of pushes, truncations and restores of older snapshots behaves like
        /// a plain Vec, and snapshots never change when the vector they came from does.
        #[test]
        fn behaves_like_a_vec(ops in prop::collection::vec(op(), 1..40)) {
            let mut c = Chunks::default();
            let mut v: Vec<u32> = Vec::new();
            let mut snaps: Vec<(Chunks<u32>, Vec<u32>)> = Vec::new();
            for op in ops {
                match op {
                    Op::Push(xs) => { c.extend_from_slice(&xs); v.extend_from_slice(&xs); }
                    Op::Truncate(n) => { let n = n % (v.len() + 1); c.truncate(n); v.truncate(n); }
                    Op::Snapshot => snaps.push((c.clone(), v.clone())),
                    Op::Restore(i) => if !snaps.is_empty() {
                        let (sc, sv) = snaps[i % snaps.len()].clone();
                        c = sc; v = sv;
                    },
                }
                prop_assert_eq!(c.len(), v.len());
                prop_assert_eq!(&c.to_vec(0, c.len()), &v);
                for (sc, sv) in &snaps {
                    prop_assert_eq!(&sc.to_vec(0, sc.len()), sv);
                    let expect = sv.iter().zip(v.iter()).take_while(|(a, b)| a == b).count();
                    prop_assert_eq!(sc.common_prefix_len(&c), expect);
                    prop_assert_eq!(c.common_prefix_len(sc), expect);
                    // What one holds = what the other holds + what it adds - what it lacks.
                    prop_assert_eq!(
                        c.unique_bytes(None) + sc.unique_bytes(Some(&c)),
                        sc.unique_bytes(None) + c.unique_bytes(Some(sc))
                    );
                }
            }
        }

        #[test]
        fn ranges(xs in prop::collection::vec(id(), 0..5000), a in 0usize..6000, b in 0usize..6000) {
            let c = from(&xs);
            let (lo, hi) = (a.min(b).min(xs.len()), a.max(b).min(xs.len()));
            prop_assert_eq!(c.to_vec(lo, hi), xs[lo..hi].to_vec());
            let mut pieces = Vec::new();
            c.for_each_slice(lo, hi, &mut |s| pieces.extend_from_slice(s));
            prop_assert_eq!(pieces, xs[lo..hi].to_vec());
        }

        #[test]
        fn get(xs in prop::collection::vec(any::<u8>(), 0..5000), a in 0usize..6000) {
            let mut c = Chunks::default();
            c.extend_from_slice(&xs);
            prop_assert_eq!(c.get(a), xs.get(a));
            prop_assert_eq!(c.last(), xs.last());
        }
    }

    #[test]
    fn deep_tries_share_and_compare() {
        let n = capacity::<u32>(2) + 77;
        let xs: Vec<u32> = (0..n as u32).collect();
        let a = from(&xs);
        let mut b = a.clone();
        b.push(1);
        assert_eq!(a.common_prefix_len(&b), n);
        // Only the right edge is new: a leaf and one branch per level.
        let added = b.unique_bytes(Some(&a));
        assert!(added < 3 * (u32::LEAF * 4 + FAN * 16 + 100), "{added}");
        let mut c = a.clone();
        c.truncate(5);
        assert_eq!(c.to_vec(0, 10), xs[..5].to_vec());
        assert_eq!(a.common_prefix_len(&c), 5);
    }

    #[test]
    fn accounting_is_close_to_four_bytes_per_token_when_ids_do_not_pack() {
        // Every id above 65,535: a packed leaf would be larger, so none packs.
        let xs: Vec<u32> = (1 << 16..(1 << 16) + 1_000_000).collect();
        let c = from(&xs);
        let bytes = c.unique_bytes(None);
        assert!(bytes < xs.len() * 4 * 115 / 100, "{bytes}");
        assert!(bytes >= xs.len() * 4);
    }

    #[test]
    fn full_leaves_of_ids_mostly_below_65536_pack_to_under_three_bytes_an_id() {
        // One id in 16 above 65,535, as in real text: a patch each.
        let xs: Vec<u32> = (0..1_000_000u32)
            .map(|i| if i % 16 == 0 { 100_000 + i } else { i % 60_000 })
            .collect();
        let c = from(&xs);
        let bytes = c.unique_bytes(None);
        assert!(bytes < xs.len() * 11 / 4, "{bytes}");
        assert!(bytes >= xs.len() * 2);
        assert_eq!(c.to_vec(0, c.len()), xs);
        // Cut inside a packed leaf, then grown again: the cut leaf is plain, then packs.
        let mut d = c.clone();
        d.truncate(1000);
        d.extend_from_slice(&[7; 100]);
        let mut expect = xs[..1000].to_vec();
        expect.extend_from_slice(&[7; 100]);
        assert_eq!(d.to_vec(0, d.len()), expect);
        assert_eq!(d.common_prefix_len(&c), 1000);
        assert_eq!(c.common_prefix_len(&d), 1000);
    }
}
