//! Incremental re-tokenization of a growing text: streamed deltas, a tool output
//! arriving in chunks, the open text run at the end of a conversation. The text keeps
//! its ids; appending a chunk costs O(chunk + a few pieces), not O(text).
//!
//! Why it is exact: BPE never merges across a pre-tokenizer piece boundary, and an
//! appended chunk can only change the last pieces of the text (a word that grows, a
//! whitespace run that gives its last space to the next word, a contraction that
//! joins its word). So an append re-encodes from the start of the second piece before
//! the join and keeps every id before it. One more piece before that is re-encoded as
//! the *overlap*: its ids must come out equal to the cached ones, which shows the
//! pre-tokenizer resynchronised there. If they disagree, the whole text is re-encoded
//! (counted in [`Stats::fallbacks`]). A property test checks incremental == full encode
//! for random texts split at random points, on every vocabulary.
//!
//! # Use from the rendered-token cache
//!
//! ```
//! use hotloop_core::tokenizer::{by_name, incremental::IncrementalText};
//!
//! let tok = by_name("o200k_base").unwrap();
//! // The open run: everything after the last special token, e.g. "user\nHel".
//! let mut run = IncrementalText::with_text(tok.as_ref(), "user\nHel");
//! let mut cached: Vec<u32> = run.ids().to_vec(); // the run's ids inside the segment
//!
//! let start = run.push_str(tok.as_ref(), "lo, world");
//! // ids before `start` are unchanged: cut the cache there and append the rest.
//! cached.truncate(start);
//! cached.extend_from_slice(&run.ids()[start..]);
//! assert_eq!(cached, run.ids());
//! ```
//!
//! The caller passes the same tokenizer on every call; the value does not hold it,
//! so one can live inside a segment without a lifetime. A special token ends a run:
//! start a new `IncrementalText` after it.
//!
//! Limits: a single piece that keeps growing (100k spaces arriving in chunks, one
//! endless word) is re-encoded whole on each append, since BPE of a piece depends on
//! all of it. A vocabulary with user-defined tokens matched in text (none of ours
//! so far) could complete such a token across more than three pieces before the join,
//! which the overlap check does not see; use a full encode for those.

use super::Tokenizer;

/// Piece starts kept at the end of the text: the overlap piece, the two pieces before
/// the join, and slack so a merge of pieces does not exhaust them.
const TAIL: usize = 8;

/// Where a pre-tokenizer piece starts: its byte offset in the text and the index of
/// its first id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Boundary {
    byte: usize,
    token: usize,
}

/// Counters for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Chunks appended.
    pub appends: u64,
    /// Appends whose overlap check failed and re-encoded the whole text.
    pub fallbacks: u64,
    /// Bytes re-encoded in total (appended bytes plus the re-encoded tail).
    pub bytes_encoded: u64,
}

/// A text and its ids, kept equal to `tokenizer.encode(text)` as chunks are appended.
#[derive(Debug, Clone, Default)]
pub struct IncrementalText {
    text: String,
    ids: Vec<u32>,
    /// Starts of the last pieces (at most `TAIL`), oldest first. Empty when the
    /// piece/id alignment is unknown: every append then re-encodes everything.
    tail: Vec<Boundary>,
    stats: Stats,
}

impl IncrementalText {
    pub fn new() -> Self {
        IncrementalText::default()
    }

    /// Start from `text`, encoded in full.
    pub fn with_text(tokenizer: &dyn Tokenizer, text: &str) -> Self {
        let mut t = IncrementalText::new();
        t.push_str(tokenizer, text);
        t.stats = Stats::default();
        t
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// Bytes held: text, ids and the boundary tail (for the cache's memory accounting).
    pub fn memory_bytes(&self) -> usize {
        self.text.capacity()
            + self.ids.capacity() * 4
            + self.tail.capacity() * std::mem::size_of::<Boundary>()
    }

    /// Append `chunk`. Returns the index of the first id that changed: ids before it are
    /// the same as before the call, ids from it on are new (`ids()[start..]`).
    pub fn push_str(&mut self, tokenizer: &dyn Tokenizer, chunk: &str) -> usize {
        if chunk.is_empty() {
            return self.ids.len();
        }
        self.stats.appends += 1;
        self.text.push_str(chunk);
        let k = self.tail.len();
        if k < 3 {
            // Fewer than three known pieces: the text is short (or one long piece, or
            // its alignment is unknown); re-encoding it whole is the exact answer.
            return self.reencode(tokenizer);
        }
        let anchor = self.tail[k - 3];
        let overlap_end = self.tail[k - 2];
        let Some((ids, pieces)) = encode_aligned(tokenizer, &self.text, anchor) else {
            return self.fallback(tokenizer);
        };
        // The overlap piece must come out as the same piece with the same ids.
        let same_piece = pieces.get(1) == Some(&overlap_end)
            && ids[..overlap_end.token - anchor.token] == self.ids[anchor.token..overlap_end.token];
        if !same_piece {
            return self.fallback(tokenizer);
        }
        self.stats.bytes_encoded += (self.text.len() - anchor.byte) as u64;
        let start = anchor.token + common_prefix(&self.ids[anchor.token..], &ids);
        self.ids.truncate(anchor.token);
        self.ids.extend_from_slice(&ids);
        self.tail.truncate(k - 3);
        self.tail.extend_from_slice(&pieces);
        self.trim_tail();
        start
    }

    fn fallback(&mut self, tokenizer: &dyn Tokenizer) -> usize {
        self.stats.fallbacks += 1;
        self.reencode(tokenizer)
    }

    fn reencode(&mut self, tokenizer: &dyn Tokenizer) -> usize {
        self.stats.bytes_encoded += self.text.len() as u64;
        let origin = Boundary { byte: 0, token: 0 };
        let (ids, tail) = encode_aligned(tokenizer, &self.text, origin).unwrap_or_else(|| {
            let mut ids = Vec::new();
            tokenizer.encode(&self.text, &mut ids);
            (ids, Vec::new())
        });
        let start = common_prefix(&self.ids, &ids);
        self.ids = ids;
        self.tail = tail;
        self.trim_tail();
        start
    }

    fn trim_tail(&mut self) {
        if self.tail.len() > TAIL {
            self.tail.drain(..self.tail.len() - TAIL);
        }
    }
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Encode `text[from.byte..]` and find where each of its pieces starts, as absolute
/// byte offsets and absolute id indices (the region's first id has index `from.token`).
/// None if the ids do not line up with the pieces (no id may straddle a piece boundary).
fn encode_aligned(
    tokenizer: &dyn Tokenizer,
    text: &str,
    from: Boundary,
) -> Option<(Vec<u32>, Vec<Boundary>)> {
    let region = &text[from.byte..];
    let mut ids = Vec::new();
    // A SentencePiece dummy prefix goes only before the text's first piece.
    let mut prefix = 0;
    if from.byte == 0 {
        tokenizer.encode(region, &mut ids);
        prefix = tokenizer.prefix_len();
    } else {
        tokenizer.encode_continuation(region, &mut ids);
    }
    let mut pieces = Vec::new();
    let mut token = 0usize;
    let mut byte = from.byte;
    for piece in tokenizer.pieces(region) {
        pieces.push(Boundary {
            byte,
            token: from.token + token,
        });
        let expected = piece.len() + std::mem::take(&mut prefix);
        let mut covered = 0usize;
        while covered < expected {
            covered += tokenizer.token_bytes(*ids.get(token)?).len();
            token += 1;
        }
        if covered != expected {
            return None;
        }
        byte += piece.len();
    }
    (token == ids.len()).then_some((ids, pieces))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::bpe_model::tests::tiny;
    use crate::tokenizer::bpe_model::tiny_spm;
    use crate::tokenizer::by_name;
    use proptest::prelude::*;

    fn full(tok: &dyn Tokenizer, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        tok.encode(text, &mut ids);
        ids
    }

    /// Append `text` cut at `cuts`, checking ids and the returned change index each time.
    fn check_chunked(tok: &dyn Tokenizer, text: &str, cuts: &[usize]) -> Stats {
        let mut bounds: Vec<usize> = cuts.iter().map(|&c| c % (text.len() + 1)).collect();
        bounds.push(text.len());
        bounds.sort_unstable();
        let mut inc = IncrementalText::new();
        let mut at = 0;
        for b in bounds {
            let b = (b..=text.len()).find(|&i| text.is_char_boundary(i)).unwrap();
            if b <= at {
                continue;
            }
            let before = inc.ids().to_vec();
            let start = inc.push_str(tok, &text[at..b]);
            at = b;
            assert_eq!(inc.ids(), full(tok, &text[..at]), "after {:?}", &text[..at]);
            assert_eq!(&inc.ids()[..start], &before[..start]);
        }
        assert_eq!(inc.text(), text);
        inc.stats()
    }

    const SAMPLES: &[&str] = &[
        "fn main() {\n    println!(\"hello, world\");\n}\n",
        "don't stop   believing\t\r\n\n  we'll see 12345678 ... !!",
        "Grüße aus Köln — 東京タワー 🙂🙃 مرحبا",
        "    indented\n\n\n    more   \n",
    ];

    #[test]
    fn streamed_chunks_match_full_encode() {
        let tiny = tiny();
        let vocabularies: Vec<Box<dyn Fn() -> std::sync::Arc<dyn Tokenizer>>> = vec![
            Box::new(|| by_name("o200k_base").unwrap()),
            Box::new(|| by_name("cl100k_base").unwrap()),
        ];
        for text in SAMPLES {
            for make in &vocabularies {
                let tok = make();
                let cuts: Vec<usize> = (0..text.len()).step_by(3).collect();
                check_chunked(tok.as_ref(), text, &cuts);
            }
            let cuts: Vec<usize> = (0..text.len()).collect();
            check_chunked(&tiny, text, &cuts);
            check_chunked(&tiny_spm(), text, &cuts);
        }
    }

    #[test]
    fn appends_cost_the_tail_not_the_text() {
        let tok = by_name("o200k_base").unwrap();
        let word = "lorem ipsum dolor sit amet, ";
        let mut inc = IncrementalText::with_text(tok.as_ref(), &word.repeat(1000));
        for _ in 0..100 {
            inc.push_str(tok.as_ref(), word);
        }
        let stats = inc.stats();
        assert_eq!(stats.fallbacks, 0);
        assert!(stats.bytes_encoded < 100 * 3 * word.len() as u64, "{stats:?}");
        assert!(inc.memory_bytes() >= inc.text().len() + 4 * inc.ids().len());
        assert_eq!(inc.ids(), full(tok.as_ref(), inc.text()));
    }

    #[test]
    fn sentencepiece_appends_keep_the_dummy_prefix_once() {
        let t = tiny_spm();
        let text = "hello aa hello x y hello ".repeat(20);
        let cuts: Vec<usize> = (0..text.len()).step_by(7).collect();
        let stats = check_chunked(&t, &text, &cuts);
        assert_eq!(stats.fallbacks, 0, "{stats:?}");
    }

    #[test]
    fn contraction_joining_its_word_is_exact() {
        // o200k: "don" + "'" are two pieces until "t" arrives and makes "don't" one.
        let tok = by_name("o200k_base").unwrap();
        check_chunked(tok.as_ref(), "we don't", &[7]);
        check_chunked(tok.as_ref(), "x  y", &[1, 2, 3]);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn incremental_equals_full(
            text in "[a-zA-Z0-9 '\\n\\t.,;:!?(){}<>_/-]{0,80}|\\PC{0,40}",
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            for name in ["o200k_base", "o200k_harmony", "cl100k_base"] {
                check_chunked(by_name(name).unwrap().as_ref(), &text, &cuts);
            }
            check_chunked(&tiny(), &text, &cuts);
            check_chunked(&tiny_spm(), &text, &cuts);
        }
    }
}
