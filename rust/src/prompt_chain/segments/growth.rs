//! Growing text: re-tokenizing the end of one text run after text was added to it.
//!
//! BPE never merges across a pre-tokenizer piece boundary, so the ids of a text are the
//! ids of its pieces, concatenated. When text is added at byte `join`, the pieces that end
//! well before the join keep their ids; only the last pieces before the join and what
//! follows are encoded again. The restart is taken two pieces before the join and at least
//! [`MARGIN`] bytes before it (the pre-tokenizer's lookahead never reaches that far back),
//! and the re-encoded ids of the unchanged stretch are checked against the cached ids
//! before they are trusted; a failed check makes the caller re-encode the whole segment.
//!
//! This module also finds *which* text of an item's rendering grew: the item is rendered
//! twice through a [`Recorder`], a tokenizer that encodes nothing and records each text
//! instead, and the two recordings are compared.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::tokenizer::Tokenizer;

/// Bytes between the restart and the join. The o200k/cl100k pre-tokenizers look at most
/// three characters ahead (`'ll`), i.e. at most 12 bytes; 32 leaves room for any of them.
pub const MARGIN: usize = 32;

/// Stands for "an encoded text" in a recording; no vocabulary has this id.
const PLACEHOLDER: u32 = u32::MAX;

/// A tokenizer that encodes text its own way over a real tokenizer's vocabulary:
/// [`Recorder`] and [`Continuation`] differ from the tokenizer they wrap only in `encode`.
trait Encoder: Send + Sync {
    /// The wrapped tokenizer: name, pieces, token bytes and specials are its own.
    fn vocabulary(&self) -> &dyn Tokenizer;
    fn encode_text(&self, text: &str, out: &mut Vec<u32>);
}

impl<E: Encoder> Tokenizer for E {
    fn name(&self) -> &str {
        self.vocabulary().name()
    }
    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        self.encode_text(text, out);
    }
    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        self.vocabulary().pieces(text)
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        self.vocabulary().token_bytes(id)
    }
    fn special(&self, name: &str) -> Option<u32> {
        self.vocabulary().special(name)
    }
    fn is_special(&self, id: u32) -> bool {
        self.vocabulary().is_special(id)
    }
    fn vocab_size(&self) -> usize {
        self.vocabulary().vocab_size()
    }
    fn prefix_len(&self) -> usize {
        self.vocabulary().prefix_len()
    }
    fn strips_leading_space(&self) -> bool {
        self.vocabulary().strips_leading_space()
    }
}

/// A tokenizer that records the texts a renderer asks it to encode and emits one
/// placeholder id for each. Special tokens and their ids come from the real tokenizer.
pub(crate) struct Recorder<'t> {
    inner: &'t dyn Tokenizer,
    texts: Mutex<Vec<String>>,
}

impl<'t> Recorder<'t> {
    pub fn new(inner: &'t dyn Tokenizer) -> Self {
        Recorder {
            inner,
            texts: Mutex::new(Vec::new()),
        }
    }

    pub fn into_texts(self) -> Vec<String> {
        self.texts.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

impl Encoder for Recorder<'_> {
    fn vocabulary(&self) -> &dyn Tokenizer {
        self.inner
    }
    fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        self.texts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(text.to_owned());
        out.push(PLACEHOLDER);
    }
}

/// A tokenizer for rendering after a chain's open run. The first text the renderer encodes
/// starts with that run (the renderer continues it), and the run's ids are cached: that
/// text is re-tokenized from just before the run's end instead of from its start.
pub(crate) struct Continuation<'t> {
    inner: &'t dyn Tokenizer,
    /// The open run and its cached ids, until the first encode takes them.
    run: Mutex<Option<(&'t str, Vec<u32>)>>,
    /// Cached ids the first encode kept.
    reused: AtomicUsize,
}

impl<'t> Continuation<'t> {
    pub fn new(inner: &'t dyn Tokenizer, run: &'t str, ids: Vec<u32>) -> Self {
        Continuation {
            inner,
            run: Mutex::new(Some((run, ids))),
            reused: AtomicUsize::new(0),
        }
    }

    /// How many of the run's cached ids were kept rather than encoded again.
    pub fn reused(&self) -> usize {
        self.reused.load(Ordering::Relaxed)
    }
}

impl Encoder for Continuation<'_> {
    fn vocabulary(&self) -> &dyn Tokenizer {
        self.inner
    }
    fn encode_text(&self, text: &str, out: &mut Vec<u32>) {
        let cached = self.run.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((run, ids)) = cached.filter(|(run, _)| text.starts_with(run)) {
            let tail = |n: usize| ids[ids.len().saturating_sub(n)..].to_vec();
            if let Some(regrown) = regrow(self.inner, run, text, None, tail) {
                let kept = ids.len() - regrown.drop;
                self.reused.store(kept, Ordering::Relaxed);
                out.extend_from_slice(&ids[..kept]);
                out.extend_from_slice(&regrown.ids);
                return;
            }
        }
        self.inner.encode(text, out);
    }
}

/// An item's rendering with every encoded text replaced by a placeholder.
pub(crate) struct Recording {
    /// Special ids, verbatim ids, and a [`PLACEHOLDER`] per encoded text.
    pub shape: Vec<u32>,
    /// The encoded texts, in order.
    pub texts: Vec<String>,
    /// The text run left open at the end.
    pub run: String,
}

/// Where two recordings of one item differ.
pub(crate) enum Change {
    /// The `index`-th encoded text; `after` = the tokens the rendering emits after it.
    Text { index: usize, after: Vec<Position> },
    /// Only the open run at the end.
    Run,
}

/// An element of a recording that follows the changed text.
pub(crate) enum Position {
    Id,
    Text(usize),
}

impl Recording {
    /// The single text that differs between two recordings, or None when their structure
    /// differs (more than one text changed, or specials appeared).
    pub fn change(&self, grown: &Recording) -> Option<Change> {
        if self.shape != grown.shape || self.texts.len() != grown.texts.len() {
            return None;
        }
        let mut changed = (0..self.texts.len()).filter(|&i| self.texts[i] != grown.texts[i]);
        match (changed.next(), changed.next()) {
            (None, _) if self.run != grown.run => Some(Change::Run),
            (Some(index), None) if self.run == grown.run => {
                let mut text = 0;
                let mut after = Vec::new();
                for &id in &self.shape {
                    if id == PLACEHOLDER {
                        if text > index {
                            after.push(Position::Text(text));
                        }
                        text += 1;
                    } else if text > index {
                        after.push(Position::Id);
                    }
                }
                Some(Change::Text { index, after })
            }
            _ => None,
        }
    }
}

/// The result of re-tokenizing a grown text.
pub(crate) struct Regrown {
    /// How many cached ids at the end of the old text are replaced.
    pub drop: usize,
    /// Their replacement: the ids of the new text from the restart on.
    pub ids: Vec<u32>,
    /// A piece boundary of the new text, far enough before its growth point to restart
    /// from next time without scanning the text from its beginning.
    pub hint: usize,
}

/// Re-tokenize `new`, which shares a prefix with `old`. `cached_tail(n)` returns the last
/// `n` cached ids of `old` (or fewer if the text has fewer). `hint`, when given, is a piece
/// boundary of `old` found by an earlier call. None means the check against the cached
/// ids failed: the caller re-encodes from scratch.
pub(crate) fn regrow(
    tokenizer: &dyn Tokenizer,
    old: &str,
    new: &str,
    hint: Option<usize>,
    cached_tail: impl FnOnce(usize) -> Vec<u32>,
) -> Option<Regrown> {
    let mut join = old.bytes().zip(new.bytes()).take_while(|(a, b)| a == b).count();
    while !old.is_char_boundary(join) {
        join -= 1;
    }
    let restart = match hint {
        Some(h) if h + MARGIN <= join && old.is_char_boundary(h) => h,
        _ => restart_before(tokenizer, old, 0, join),
    };

    // From the very start, a SentencePiece dummy prefix is a cached id no byte of the text
    // spells: a short run is re-encoded whole instead.
    if restart == 0 && tokenizer.prefix_len() > 0 {
        return None;
    }

    // The cached ids of old[restart..]: walk back over them, each id spelling the bytes
    // just before the previous one's. A vocabulary that drops bytes it cannot spell
    // (SmolLM2 does, like llama.cpp) makes this fail: the caller re-encodes instead.
    let tail = cached_tail(old.len() - restart);
    let mut end = old.len();
    let mut drop = 0;
    for &id in tail.iter().rev() {
        if end == restart {
            break;
        }
        let bytes = tokenizer.token_bytes(id);
        if end < restart + bytes.len() || &old.as_bytes()[end - bytes.len()..end] != bytes {
            return None;
        }
        end -= bytes.len();
        drop += 1;
    }
    if end != restart {
        return None;
    }
    let old_ids = &tail[tail.len() - drop..];

    let mut ids = Vec::with_capacity(drop + (new.len() - old.len()) / 2);
    let mut starts = Vec::new();
    let mut at = restart;
    for piece in tokenizer.pieces(&new[restart..]) {
        starts.push(at);
        // Only the run's first piece takes a SentencePiece dummy prefix.
        if at == 0 {
            tokenizer.encode(piece, &mut ids);
        } else {
            tokenizer.encode_continuation(piece, &mut ids);
        }
        at += piece.len();
    }

    // The whole pieces that end MARGIN bytes or more before the join are unchanged text cut
    // where it was cut before: their re-encoded ids must equal the cached ones. A piece that
    // reaches further may have been cut shorter this time (a run of spaces now followed by
    // `'ll`), and BPE need not agree with itself on a piece's prefix: it is not checked.
    let ends = starts.iter().skip(1).copied().chain([at]);
    let stable = ends.take_while(|&e| e + MARGIN <= join).last().unwrap_or(restart) - restart;
    let mut covered = 0;
    for (a, b) in old_ids.iter().zip(ids.iter()) {
        let len = tokenizer.token_bytes(*a).len();
        if covered + len > stable {
            break;
        }
        if a != b {
            return None;
        }
        covered += len;
    }

    // The next growth most likely continues where this one ended.
    let next_join = new.len() - (old.len() - join);
    let hint = two_back(starts.iter().copied().take_while(|&s| s + MARGIN <= next_join)).unwrap_or(restart);
    Some(Regrown { drop, ids, hint })
}

/// A piece boundary of `text` two pieces and at least MARGIN bytes before `join`, found by
/// scanning from `from` (a known boundary); `from` itself when none is.
fn restart_before(tokenizer: &dyn Tokenizer, text: &str, from: usize, join: usize) -> usize {
    let mut at = from;
    let starts = tokenizer.pieces(&text[from..]).map(|piece| {
        let start = at;
        at += piece.len();
        start
    });
    two_back(starts.take_while(|&s| s + MARGIN <= join)).unwrap_or(from)
}

/// The second-to-last of a sequence of piece starts (the last one alone if only one).
fn two_back(starts: impl Iterator<Item = usize>) -> Option<usize> {
    let (mut last, mut before) = (None, None);
    for s in starts {
        before = last;
        last = Some(s);
    }
    before.or(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer;
    use proptest::prelude::*;

    fn encode(t: &dyn Tokenizer, s: &str) -> Vec<u32> {
        let mut v = Vec::new();
        t.encode(s, &mut v);
        v
    }

    /// Grow `parts[0]` by each following part; every step must equal a full encode.
    fn check_growth(name: &str, parts: &[String]) -> Result<(), TestCaseError> {
        let t: std::sync::Arc<dyn Tokenizer> = match name {
            "tiny-spm" => std::sync::Arc::new(crate::tokenizer::bpe_model::tiny_spm()),
            _ => tokenizer::by_name(name).unwrap(),
        };
        let mut text = parts[0].clone();
        let mut ids = encode(t.as_ref(), &text);
        let mut hint = None;
        for part in &parts[1..] {
            let new = format!("{text}{part}");
            match regrow(t.as_ref(), &text, &new, hint, |n| {
                ids[ids.len().saturating_sub(n)..].to_vec()
            }) {
                Some(r) => {
                    ids.truncate(ids.len() - r.drop);
                    ids.extend(r.ids);
                    hint = Some(r.hint);
                }
                None => {
                    ids = encode(t.as_ref(), &new);
                    hint = None;
                }
            }
            text = new;
            prop_assert_eq!(&ids, &encode(t.as_ref(), &text), "text {:?}", text);
        }
        Ok(())
    }

    fn piece_text() -> impl Strategy<Value = String> {
        let atoms = prop_oneof![
            Just(" ".to_string()),
            Just("  ".to_string()),
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            Just("\t".to_string()),
            Just("'ll".to_string()),
            Just("'s".to_string()),
            Just("é".to_string()),
            Just("日本".to_string()),
            Just("🦀".to_string()),
            Just("{\"a\": 1}".to_string()),
            "[a-zA-Z]{1,8}",
            "[0-9]{1,7}",
            "[ !-/:-@]{1,4}",
            "\\PC{1,3}",
        ];
        prop::collection::vec(atoms, 0..12).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn growing_text_equals_full_encode_o200k(parts in prop::collection::vec(piece_text(), 1..12)) {
            check_growth("o200k_base", &parts)?;
        }

        #[test]
        fn growing_text_equals_full_encode_cl100k(parts in prop::collection::vec(piece_text(), 1..12)) {
            check_growth("cl100k_base", &parts)?;
        }

        #[test]
        fn growing_text_equals_full_encode_sentencepiece(parts in prop::collection::vec(piece_text(), 1..12)) {
            check_growth("tiny-spm", &parts)?;
        }
    }

    #[test]
    fn a_run_of_spaces_cut_shorter_by_what_follows_is_regrown_not_refused() {
        let t = tokenizer::by_name("o200k_base").unwrap();
        let old = " ".repeat(480);
        let new = format!("{old}'ll");
        let ids = encode(t.as_ref(), &old);
        let regrown = regrow(t.as_ref(), &old, &new, None, |n| {
            ids[ids.len().saturating_sub(n)..].to_vec()
        })
        .expect("the restart is a piece boundary of both texts");
        let mut grown = ids[..ids.len() - regrown.drop].to_vec();
        grown.extend(regrown.ids);
        assert_eq!(grown, encode(t.as_ref(), &new));
    }

    #[test]
    fn long_whitespace_and_letter_runs() {
        let parts: Vec<String> = vec![
            "a".repeat(300),
            "a".repeat(100),
            " ".repeat(200),
            "x".into(),
            " ".repeat(50),
            "\n\n".into(),
            "9".repeat(40),
        ];
        check_growth("o200k_base", &parts).unwrap();
    }
}
