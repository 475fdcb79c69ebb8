//! The BPE engine for open models: byte-level vocabularies (GPT-2 style SmolLM2 and
//! StarCoder, Llama 3, Qwen2/3, DeepSeek, Mistral tekken) and SentencePiece-style ones
//! (Gemma 3, Mistral v1-v7, Phi-3), whatever the source: `tokenizer.json`
//! ([`super::tokenizer_json`]), GGUF metadata ([`super::gguf`]), `tekken.json`
//! ([`super::tekken`]) or a SentencePiece `.model` ([`super::sentencepiece`]). The
//! sources differ in how they spell tokens and rank merges; each turns its file into one
//! [`Vocabulary`] of decoded token bytes and merge ranks.
//!
//! Encoding a text: user-defined (non-special) added tokens are cut out first
//! (leftmost-longest, as Hugging Face and llama.cpp match them); each section between
//! them is normalized (NFC, SentencePiece's space rules), split by the pre-tokenizer,
//! and each piece is encoded by BPE. BPE starts from one symbol per byte (byte-level) or
//! per character (SentencePiece, with byte fallback) and repeatedly merges the adjacent
//! pair of lowest rank, leftmost first on ties, as Hugging Face, llama.cpp and tiktoken
//! all do. Symbols sit in a linked list and candidate pairs in an agenda (`agenda.rs`: a
//! binary heap, or buckets by rank for long pieces), so a piece of n symbols costs
//! O(n log n) at worst: `"A" * 1_000_000`, long space runs and a SentencePiece text with
//! no pre-tokenizer at all stay linear-ish, never quadratic.
//!
//! A long piece is first cut, exactly, between two bytes that sit side by side in no
//! token (a digit and the next in a vocabulary of single digits, a combining accent and
//! the next): no symbol can span such a cut, so each part merges alone to the ids it has
//! in the whole. Only where such cuts exist (`"A" * n` has none when `AA` is a token)
//! the merge loop's memory and working set are bounded by a part instead of the piece.
//!
//! Ranks come in two kinds ([`Merges`]): a ranked list of pairs (Hugging Face `merges`,
//! GGUF `tokenizer.ggml.merges`), or a rank per token where every split of a token into
//! two tokens is a merge of that rank (tiktoken's ranks, SentencePiece scores).
//!
//! SentencePiece vocabularies have no pre-tokenizer: the whole text is one BPE word. It is
//! still cut, exactly, before every space whose previous character never precedes a space
//! inside a token (checked on the vocabulary at load): no token can span such a cut, so
//! no merge crosses it. That keeps the heap small and gives incremental encoding its
//! piece boundaries.
//!
//! Token kinds follow GGUF `token_type`: control tokens (`<|eot_id|>`, `<start_of_turn>`)
//! are reachable only through [`Tokenizer::special`]; user-defined tokens are matched in
//! text, as llama.cpp and Hugging Face (non-special added tokens) do.

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use aho_corasick::{AhoCorasick, MatchKind};
use foldhash::{HashMap as FastMap, HashSet as FastSet};
use regex_syntax::is_word_character;
use unicode_normalization::{is_nfc_quick, IsNormalized, UnicodeNormalization};

use super::agenda::Agenda;
use super::piece_map::{new_owner, with_merged, Ahead, PieceCache, WholeTokens, KEPT_TEXT};
use super::pretokenizer::{begins_line_part, spans_line_start, PreTokenizer};
use super::Tokenizer;
use crate::error::{Code, Error, Result};

/// GGUF `token_type` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    /// SentencePiece's `<0xNN>` byte-fallback tokens.
    Byte,
    /// A user-defined token outside the BPE model's vocabulary: matched in text, never
    /// produced by a merge (Hugging Face added tokens the model lacks; llama.cpp's
    /// SentencePiece tokens spelled with a real space, which its merges cannot reach).
    Added,
}

impl TokenKind {
    pub fn from_gguf(t: i64) -> TokenKind {
        match t {
            2 => TokenKind::Unknown,
            3 => TokenKind::Control,
            4 => TokenKind::UserDefined,
            5 => TokenKind::Unused,
            6 => TokenKind::Byte,
            _ => TokenKind::Normal,
        }
    }

    /// Kinds whose bytes are their literal text, found by name with `special`.
    fn is_literal(self) -> bool {
        matches!(
            self,
            TokenKind::Control | TokenKind::UserDefined | TokenKind::Unknown | TokenKind::Added
        )
    }

    /// Kinds BPE may produce by merging.
    fn is_mergeable(self) -> bool {
        matches!(self, TokenKind::Normal | TokenKind::UserDefined)
    }
}

/// What BPE starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alphabet {
    /// One symbol per byte (byte-level vocabularies).
    Bytes,
    /// One symbol per character; a character without a token becomes the `<0xNN>` tokens
    /// of its bytes (`byte_fallback`) or the unknown token (consecutive ones fused into
    /// one with `fuse_unk`).
    Chars { byte_fallback: bool, fuse_unk: bool },
}

/// Where SentencePiece puts its dummy space prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepend {
    Never,
    /// Before every text section (Hugging Face `Prepend` normalizer, llama.cpp's
    /// `add_space_prefix`: also after an added token matched in the text).
    Always,
    /// Once, before the whole text, even when it starts with an added token (which then
    /// follows a lone `▁`): SentencePiece's `add_dummy_prefix`.
    Once,
    /// Hugging Face's `Metaspace` pre-tokenizer: before every section (`first_only`: only
    /// before a text that starts with a section, not with an added token), but never
    /// before a section that already starts with a space.
    Metaspace {
        first_only: bool,
    },
}

/// How a user-defined token matches in text (Hugging Face's `AddedToken` options).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddedRule {
    /// The match takes the whitespace before it.
    pub lstrip: bool,
    /// The match takes the whitespace after it.
    pub rstrip: bool,
    /// Only a match with no word character (`\w`) right before or after it counts.
    pub single_word: bool,
}

/// Text normalization before the pre-tokenizer, per section between added tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalizer {
    /// Unicode NFC (Qwen).
    pub nfc: bool,
    /// SentencePiece spells a space `▁`: a `▁` in the text is a space too (the vocabulary
    /// is stored decoded, with spaces).
    pub metaspace: bool,
    pub prepend: Prepend,
}

impl Normalizer {
    pub const NONE: Normalizer = Normalizer {
        nfc: false,
        metaspace: false,
        prepend: Prepend::Never,
    };
}

/// How merges are ranked (lower rank merges first).
pub enum Merges {
    /// (left, right) token pairs in rank order; the merged token is their concatenation.
    Ranked(Vec<(u32, u32)>),
    /// A rank per token (`u32::MAX`: never a merge result); any split of a token into two
    /// tokens merges at the token's rank (tiktoken ranks, SentencePiece scores).
    ByTokenRank(Vec<u32>),
}

/// Everything needed to build a [`BpeModel`], whatever the source format.
pub struct Vocabulary {
    pub name: String,
    pub pre: PreTokenizer,
    pub normalizer: Normalizer,
    pub alphabet: Alphabet,
    /// Bytes of each token as decoding writes them: byte-level spellings decoded,
    /// SentencePiece `▁` as a space and `<0xNN>` as its byte, literal text for control
    /// and user-defined tokens; empty for ids the vocabulary leaves unused.
    pub tokens: Vec<Vec<u8>>,
    pub kinds: Vec<TokenKind>,
    pub merges: Merges,
    /// A piece that is a token is that token, whatever the merges (Llama 3).
    pub ignore_merges: bool,
    pub unk: Option<u32>,
    /// Decoding drops the first space of a text (SentencePiece's dummy prefix).
    pub strip_leading_space: bool,
    /// Tokens matched in text before anything else, by the text they match (which for
    /// SentencePiece may differ from their decoded bytes: `▁▁` decodes to two spaces).
    pub added: Vec<(String, u32)>,
    /// The added tokens that strip whitespace or match only as a word.
    pub added_rules: Vec<(u32, AddedRule)>,
}

const NONE: u32 = u32::MAX;
/// The id of a symbol the vocabulary cannot spell: dropped from the output.
const MISSING: u32 = u32::MAX - 1;

pub struct BpeModel {
    name: String,
    /// Its identity for the merged pieces a thread keeps (`with_merged`).
    owner: u64,
    pre: PreTokenizer,
    normalizer: Normalizer,
    alphabet: Alphabet,
    /// Token bytes, concatenated; token i is `bytes[starts[i]..starts[i + 1]]`.
    bytes: Vec<u8>,
    starts: Vec<u32>,
    kinds: Vec<TokenKind>,
    /// Bytes: the token of each single byte. Chars: the `<0xNN>` fallback token of each byte.
    byte_ids: [u32; 256],
    /// Chars: the token of each single character.
    char_ids: FastMap<char, u32>,
    /// Chars: `char_ids` of the ASCII characters (NONE where it has none), read without
    /// hashing for the characters most text is made of.
    ascii_ids: [u32; 128],
    /// (left id << 32 | right id) -> (rank, merged id).
    merges: FastMap<u64, (u32, u32)>,
    /// Control, unknown and user-defined tokens by their literal text.
    specials: HashMap<String, u32>,
    /// User-defined tokens, matched in text before normalization, by pattern index.
    added: Option<(AhoCorasick, Vec<(u32, AddedRule)>)>,
    /// Pieces answered by one lookup instead of the merge loop: every token with
    /// `ignore_merges`, else the tokens whose own bytes encode to exactly themselves.
    whole: WholeTokens,
    unk: Option<u32>,
    /// Chars: characters that precede a space inside some token (no cut after them).
    joins_space: FastSet<char>,
    /// Byte pairs that sit side by side inside some mergeable token (see [`JoinedBytes`]).
    joined: JoinedBytes,
    /// See [`Tokenizer::cuts_at_lines`].
    cuts_at_lines: bool,
    strip_leading_space: bool,
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(Code::InvalidVocabulary, message)
}

impl BpeModel {
    pub fn new(v: Vocabulary) -> Result<Self> {
        if v.tokens.len() != v.kinds.len() {
            return Err(invalid(format!(
                "{} tokens but {} token types",
                v.tokens.len(),
                v.kinds.len()
            )));
        }
        if v.tokens.len() >= MISSING as usize {
            return Err(invalid("vocabulary too large"));
        }
        let mut bytes = Vec::new();
        let mut starts = Vec::with_capacity(v.tokens.len() + 1);
        starts.push(0u32);
        // Every mergeable token by its bytes, a later id winning (llama.cpp's text -> id map).
        let mut by_bytes: FastMap<&[u8], u32> = FastMap::default();
        let mut specials: HashMap<String, u32> = v.added.iter().cloned().collect();
        let mut byte_tokens = [MISSING; 256];
        for (id, (token, kind)) in v.tokens.iter().zip(&v.kinds).enumerate() {
            let id = id as u32;
            bytes.extend_from_slice(token);
            starts.push(bytes.len() as u32);
            if token.is_empty() {
                continue;
            }
            if kind.is_mergeable() {
                by_bytes.insert(token, id);
            }
            if *kind == TokenKind::Byte && token.len() == 1 {
                byte_tokens[token[0] as usize] = id;
            }
            if kind.is_literal() {
                specials.insert(String::from_utf8_lossy(token).into_owned(), id);
            }
        }
        let mut char_ids = FastMap::default();
        let mut joins_space = FastSet::default();
        let byte_ids = match v.alphabet {
            Alphabet::Bytes => {
                // Some vocabularies lack a few control bytes (SmolLM2 has no 0x04): llama.cpp
                // then drops that byte.
                let mut ids = [MISSING; 256];
                for (b, id) in ids.iter_mut().enumerate() {
                    if let Some(&t) = by_bytes.get(&[b as u8][..]) {
                        *id = t;
                    }
                }
                ids
            }
            Alphabet::Chars { .. } => {
                for (token, &id) in &by_bytes {
                    let Ok(text) = std::str::from_utf8(token) else {
                        continue;
                    };
                    let mut chars = text.chars();
                    if let (Some(c), None) = (chars.next(), chars.next()) {
                        char_ids.insert(c, id);
                    }
                    let mut prev = None;
                    for c in text.chars() {
                        if let Some(p) = prev.filter(|&p| c == ' ' && p != ' ') {
                            joins_space.insert(p);
                        }
                        prev = Some(c);
                    }
                }
                byte_tokens
            }
        };
        let merges = merge_table(&v.merges, &v.tokens, &v.kinds, &by_bytes, v.alphabet)?;
        let added = if v.added.is_empty() {
            None
        } else {
            let automaton = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(v.added.iter().map(|(text, _)| text))
                .map_err(|e| invalid(format!("added tokens: {e}")))?;
            let rules: HashMap<u32, AddedRule> = v.added_rules.iter().copied().collect();
            let ids = v
                .added
                .iter()
                .map(|(_, id)| (*id, rules.get(id).copied().unwrap_or_default()));
            Some((automaton, ids.collect()))
        };
        let cuts_at_lines = cuts_at_lines(&v, &by_bytes, &char_ids, &byte_ids);
        let joined = JoinedBytes::of(by_bytes.keys());
        let mut model = BpeModel {
            name: v.name,
            owner: new_owner(),
            pre: v.pre,
            normalizer: v.normalizer,
            alphabet: v.alphabet,
            bytes,
            starts,
            kinds: v.kinds,
            byte_ids,
            ascii_ids: std::array::from_fn(|b| char_ids.get(&char::from(b as u8)).copied().unwrap_or(NONE)),
            char_ids,
            merges,
            specials,
            added,
            whole: WholeTokens::new([]),
            unk: v.unk,
            joins_space,
            joined,
            cuts_at_lines,
            strip_leading_space: v.strip_leading_space,
        };
        model.whole = model.whole_tokens(v.ignore_merges);
        Ok(model)
    }

    /// Mergeable tokens of two bytes or more that a piece equal to them encodes to: all
    /// of them with `ignore_merges`; otherwise usually all, but a vocabulary may hold
    /// tokens no merge sequence reaches, so each is encoded once here rather than assumed.
    fn whole_tokens(&self, ignore_merges: bool) -> WholeTokens {
        let mut whole = Vec::new();
        let mut work = Work::default();
        let mut ids = Vec::new();
        for id in 0..self.kinds.len() as u32 {
            let bytes = self.token_bytes(id);
            if bytes.len() < 2 || !self.kinds[id as usize].is_mergeable() {
                continue;
            }
            if !ignore_merges {
                let Ok(text) = std::str::from_utf8(bytes) else {
                    continue;
                };
                ids.clear();
                self.encode_piece(text, &mut work, &mut ids);
                if ids != [id] {
                    continue;
                }
            }
            whole.push((bytes, id));
        }
        WholeTokens::new(whole)
    }

    /// Assert that BPE on `text` as one piece gives the same ids cut at every point
    /// [`BpeModel::cut_after`] finds (each part at least `every` bytes) as uncut: what
    /// [`BpeModel::encode_piece`] relies on, checked by tests and the `line_cuts` fuzz
    /// target.
    pub fn assert_piece_cuts_exact(&self, text: &str, every: usize) {
        let mut work = Work::default();
        let mut whole = Vec::new();
        self.merge_piece(text, &mut work, &mut whole);
        let mut parts = Vec::new();
        let mut start = 0;
        while let Some(cut) = self.cut_after(text, start + every) {
            self.merge_piece(&text[start..cut], &mut work, &mut parts);
            start = cut;
        }
        self.merge_piece(&text[start..], &mut work, &mut parts);
        assert_eq!(parts, whole, "cut every {every} bytes of {text:?}");
    }

    pub fn kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// Call `f` with each section of `text`: its byte range and, for a user-defined token
    /// matched in the text, that token's id.
    fn for_each_section(&self, text: &str, mut f: impl FnMut(Range<usize>, Option<u32>)) {
        let Some((automaton, ids)) = &self.added else {
            f(0..text.len(), None);
            return;
        };
        let mut at = 0;
        for m in automaton.find_iter(text) {
            let (id, rule) = ids[m.pattern().as_usize()];
            let (mut start, mut end) = (m.start(), m.end());
            let word_before = text[..start].chars().next_back().is_some_and(is_word_character);
            let word_after = text[end..].chars().next().is_some_and(is_word_character);
            // A match inside whitespace an earlier `rstrip` took is no match.
            if start < at || (rule.single_word && (word_before || word_after)) {
                continue;
            }
            if rule.lstrip {
                start = at.max(text[..start].trim_end_matches(char::is_whitespace).len());
            }
            if rule.rstrip {
                end = text.len() - text[end..].trim_start_matches(char::is_whitespace).len();
            }
            if start > at {
                f(at..start, None);
            }
            f(start..end, Some(id));
            at = end;
        }
        if at < text.len() {
            f(at..text.len(), None);
        }
    }

    /// A section as the pre-tokenizer sees it.
    fn normalize<'a>(&self, section: &'a str, prepend: bool) -> Cow<'a, str> {
        let mut text = Cow::Borrowed(section);
        if self.normalizer.nfc {
            text = nfc(section);
        }
        if self.normalizer.metaspace && text.contains('▁') {
            text = Cow::Owned(text.replace('▁', " "));
        }
        let has_space = matches!(self.normalizer.prepend, Prepend::Metaspace { .. }) && text.starts_with(' ');
        if prepend && !text.is_empty() && !has_space {
            text = Cow::Owned(format!(" {text}"));
        }
        text
    }

    /// True when normalizing changes nothing but the dummy prefix: the section's pieces
    /// are then pieces of the original text.
    fn normalizes_to_itself(&self, section: &str) -> bool {
        let nfc_stable = !self.normalizer.nfc
            || (is_nfc_quick(section.chars()) == IsNormalized::Yes
                // A first character that could compose with the text before it.
                && section
                    .chars()
                    .next()
                    .is_none_or(|c| is_nfc_quick(std::iter::once(c)) == IsNormalized::Yes));
        nfc_stable && !(self.normalizer.metaspace && section.contains('▁'))
    }

    /// Split a normalized section into pieces.
    fn split(&self, text: &str, out: &mut impl FnMut(Range<usize>)) {
        match (&self.pre, self.alphabet) {
            (PreTokenizer::Whole, Alphabet::Chars { .. }) => self.split_words(text, out),
            (pre, _) => pre.split(text, 0..text.len(), out),
        }
    }

    /// SentencePiece text: cut before each space that follows a character no token
    /// joins to a space (see the module docs).
    fn split_words(&self, text: &str, out: &mut impl FnMut(Range<usize>)) {
        let mut start = 0;
        let mut prev = ' ';
        for (i, c) in text.char_indices() {
            if c == ' ' && prev != ' ' && i > start && !self.joins_space.contains(&prev) {
                out(start..i);
                start = i;
            }
            prev = c;
        }
        if start < text.len() {
            out(start..text.len());
        }
    }

    /// Encode `text`; `at_start` says whether it begins the text (SentencePiece's
    /// dummy prefix goes only there and after added tokens).
    fn encode_text(&self, text: &str, at_start: bool, out: &mut Vec<u32>) {
        if text.len() > KEPT_TEXT {
            return self.encode_with(text, at_start, &mut Work::default(), out);
        }
        with_merged(self.owner, |merged| {
            // The thread's pieces for this call, back to it after.
            let mut work = Work {
                cache: std::mem::take(merged),
                ..Work::default()
            };
            self.encode_with(text, at_start, &mut work, out);
            *merged = work.cache;
        });
    }

    fn encode_with(&self, text: &str, at_start: bool, work: &mut Work, out: &mut Vec<u32>) {
        out.reserve(text.len() / 3);
        let mut after_token = at_start;
        let mut first = at_start;
        self.for_each_section(text, |range, token| {
            let prepend = match self.normalizer.prepend {
                Prepend::Never => false,
                Prepend::Always | Prepend::Metaspace { first_only: false } => after_token,
                Prepend::Once | Prepend::Metaspace { first_only: true } => first,
            };
            first = false;
            if let Some(id) = token {
                if prepend && self.normalizer.prepend == Prepend::Once {
                    self.encode_split(" ", work, out);
                }
                out.push(id);
                after_token = true;
                return;
            }
            after_token = false;
            let section = self.normalize(&text[range], prepend);
            self.encode_split(&section, work, out);
        });
    }

    /// Split a normalized section and encode its pieces: a piece that is a token by one
    /// lookup, others by [`BpeModel::encode_piece`].
    fn encode_split(&self, section: &str, work: &mut Work, out: &mut Vec<u32>) {
        let mut ahead = Ahead::default();
        let mut each = |piece: &str, id: Option<u32>| match id {
            Some(id) => out.push(id),
            None => self.encode_piece(piece, work, out),
        };
        self.split(section, &mut |r| {
            if ahead.push(&self.whole, &section[r]) {
                ahead.drain(&self.whole, &mut each);
            }
        });
        ahead.drain(&self.whole, each);
    }

    /// BPE on one piece, appending its ids. A long piece is cut where no merge can cross
    /// ([`BpeModel::cut_after`]), each part at least [`CUT_EVERY`] bytes long, and each
    /// part is encoded alone: the ids of the whole, with the merge loop's memory and its
    /// working set bounded by a part instead of the piece (a 10 MB piece of digits costs
    /// per byte what a 1 MB one does). A part seen before in this call comes from the
    /// cache.
    fn encode_piece(&self, piece: &str, work: &mut Work, out: &mut Vec<u32>) {
        let mut start = 0;
        while let Some(cut) = self.cut_after(piece, start + CUT_EVERY) {
            self.encode_part(&piece[start..cut], work, out);
            start = cut;
        }
        self.encode_part(&piece[start..], work, out);
    }

    /// The first position at or after `from` (and before the end) where `piece` may be
    /// cut: between two characters whose bytes there (the last of the one, the first of
    /// the other) sit side by side in no mergeable token, so no symbol BPE builds ever
    /// spans the cut, and the pairs to its left and right merge exactly as they would
    /// with the other side gone. Characters the vocabulary cannot spell (the unknown
    /// token, which a merge table may name and `fuse_unk` fuses) are never beside a cut.
    fn cut_after(&self, piece: &str, from: usize) -> Option<usize> {
        let bytes = piece.as_bytes();
        (from.max(1)..bytes.len()).find(|&i| {
            piece.is_char_boundary(i)
                && !self.joined.contains(bytes[i - 1], bytes[i])
                && match self.alphabet {
                    Alphabet::Bytes => true,
                    Alphabet::Chars { byte_fallback, .. } => {
                        let spelled = |c: Option<char>| c.is_some_and(|c| self.spells(c, byte_fallback));
                        spelled(piece[..i].chars().next_back()) && spelled(piece[i..].chars().next())
                    }
                }
        })
    }

    /// Chars: `c` starts as its own token or as byte tokens, never the unknown token.
    fn spells(&self, c: char, byte_fallback: bool) -> bool {
        let ascii = self.ascii_ids.get(c as usize).is_some_and(|&id| id != NONE);
        ascii
            || self.char_ids.contains_key(&c)
            || byte_fallback
                && c.encode_utf8(&mut [0; 4])
                    .bytes()
                    .all(|b| self.byte_ids[b as usize] != MISSING)
    }

    /// A part of a piece: from the cache if this call encoded it before, else by BPE.
    fn encode_part(&self, part: &str, work: &mut Work, out: &mut Vec<u32>) {
        if let Some(ids) = work.cache.get(part.as_bytes()) {
            return out.extend_from_slice(ids);
        }
        let at = out.len();
        self.merge_piece(part, work, out);
        work.cache.insert(part.as_bytes(), &out[at..]);
    }

    /// The first symbols of a piece, before any merge.
    fn symbols(&self, piece: &str, syms: &mut Vec<Sym>) {
        // At most one symbol per byte: no regrowth (and copy) on a long piece.
        syms.reserve(piece.len());
        let mut push = |id: u32| {
            let i = syms.len() as u32;
            syms.push(Sym {
                id,
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
            });
        };
        match self.alphabet {
            Alphabet::Bytes => piece.bytes().for_each(|b| push(self.byte_ids[b as usize])),
            Alphabet::Chars {
                byte_fallback,
                fuse_unk,
            } => {
                let mut last_unk = false;
                for c in piece.chars() {
                    let ascii = self.ascii_ids.get(c as usize).copied().filter(|&id| id != NONE);
                    if let Some(id) = ascii.or_else(|| self.char_ids.get(&c).copied()) {
                        push(id);
                        last_unk = false;
                        continue;
                    }
                    let mut buf = [0u8; 4];
                    let utf8 = c.encode_utf8(&mut buf).as_bytes();
                    if byte_fallback && utf8.iter().all(|&b| self.byte_ids[b as usize] != MISSING) {
                        utf8.iter().for_each(|&b| push(self.byte_ids[b as usize]));
                        last_unk = false;
                    } else if !(fuse_unk && last_unk) {
                        push(self.unk.unwrap_or(MISSING));
                        last_unk = true;
                    }
                }
            }
        }
        if let Some(last) = syms.last_mut() {
            last.next = NONE;
        }
    }

    /// BPE on `piece` as one whole, appending its ids.
    fn merge_piece(&self, piece: &str, work: &mut Work, out: &mut Vec<u32>) {
        work.syms.clear();
        self.symbols(piece, &mut work.syms);
        let n = work.syms.len() as u32;
        if n as usize <= SHORT {
            return self.encode_short(&work.syms, out);
        }
        if n > 1 {
            work.agenda.start(n as usize);
            for i in 0..n - 1 {
                if let Some((rank, _)) = self.merge_at(&work.syms, i) {
                    work.agenda.push(rank, i);
                }
            }
            self.merge_all(work);
        }
        let mut i = if n == 0 { NONE } else { 0 };
        while i != NONE {
            let sym = work.syms[i as usize];
            if sym.id != MISSING {
                out.push(sym.id);
            }
            i = sym.next;
        }
    }

    /// BPE on a piece of at most [`SHORT`] symbols: ids and pair ranks in arrays, the
    /// lowest rank (leftmost on ties) found by a scan, two neighbours looked up again
    /// after each merge. The same merges as the agenda, without its bookkeeping.
    fn encode_short(&self, syms: &[Sym], out: &mut Vec<u32>) {
        let mut ids = [0u32; SHORT];
        let n = syms.len();
        for (id, sym) in ids.iter_mut().zip(syms) {
            *id = sym.id;
        }
        let pair = |l: u32, r: u32| self.merges.get(&pair_key(l, r)).copied().unwrap_or((NONE, NONE));
        // (rank, merged) of each pair (ids[i], ids[i + 1]); NONE for no merge.
        let mut pairs = [(NONE, NONE); SHORT];
        for i in 0..n.saturating_sub(1) {
            pairs[i] = pair(ids[i], ids[i + 1]);
        }
        let mut len = n;
        while len > 1 {
            let (mut best, mut at) = (NONE, 0);
            for (i, &(rank, _)) in pairs[..len - 1].iter().enumerate() {
                if rank < best {
                    (best, at) = (rank, i);
                }
            }
            if best == NONE {
                break;
            }
            ids[at] = pairs[at].1;
            ids.copy_within(at + 2..len, at + 1);
            pairs.copy_within(at + 1..len - 1, at);
            len -= 1;
            if at + 1 < len {
                pairs[at] = pair(ids[at], ids[at + 1]);
            }
            if at > 0 {
                pairs[at - 1] = pair(ids[at - 1], ids[at]);
            }
        }
        out.extend(ids[..len].iter().copied().filter(|&id| id != MISSING));
    }

    fn merge_all(&self, work: &mut Work) {
        while let Some((rank, left)) = work.agenda.pop() {
            let sym = work.syms[left as usize];
            // A stale entry: the pair at `left` changed since it was queued. A pair that
            // changed into another of the same rank is as good a next merge.
            let merged = match self.merge_at(&work.syms, left) {
                Some((r, merged)) if r == rank => merged,
                _ => continue,
            };
            let right = sym.next;
            let after = work.syms[right as usize].next;
            work.syms[left as usize].id = merged;
            work.syms[left as usize].next = after;
            work.syms[right as usize].id = NONE;
            if after != NONE {
                work.syms[after as usize].prev = left;
            }
            for i in [sym.prev, left] {
                if let Some((rank, _)) = self.merge_at(&work.syms, i) {
                    work.agenda.push(rank, i);
                }
            }
        }
    }

    /// The merge (rank, merged id) of live symbol `left` with its right neighbour.
    fn merge_at(&self, syms: &[Sym], left: u32) -> Option<(u32, u32)> {
        let l = syms.get(left as usize)?;
        if l.id == NONE || l.next == NONE {
            return None;
        }
        self.merges
            .get(&pair_key(l.id, syms[l.next as usize].id))
            .copied()
    }
}

/// True when a text cut at a line start ([`pretokenizer::line_cut`]) encodes, part by
/// part, to the ids of the whole ([`Tokenizer::cuts_at_lines`]).
///
/// Byte-level vocabularies: the split always begins a piece there, and no normalization
/// adds a prefix to a part or reads `▁` as a space. SentencePiece ones (no split, or at
/// spaces): no token holds a newline and the character after it, so no merge crosses
/// the cut, and that character has a token (or byte tokens) of its own, so no unknown
/// token fuses across it; the dummy prefix goes before the first part alone, as before
/// the whole, and a `▁` (never at a cut) reads alike.
///
/// Both: no added token reaches across a cut: none holds a newline and the character
/// after it or takes the whitespace before it (`lstrip`), and none that may end right
/// before a cut looks at the character after it (`single_word`) or is followed by a
/// dummy prefix (which a part after a cut does not get).
fn cuts_at_lines(
    v: &Vocabulary,
    by_bytes: &FastMap<&[u8], u32>,
    char_ids: &FastMap<char, u32>,
    byte_ids: &[u32; 256],
) -> bool {
    let splits = match v.alphabet {
        Alphabet::Bytes => {
            v.pre.cuts_at_lines() && v.normalizer.prepend == Prepend::Never && !v.normalizer.metaspace
        }
        Alphabet::Chars { byte_fallback, .. } => {
            let spelled = |b: u8| {
                char_ids.contains_key(&char::from(b)) || byte_fallback && byte_ids[b as usize] != MISSING
            };
            v.pre.splits_alike_in_line_parts()
                && !by_bytes.keys().any(|token| spans_line_start(token))
                && (0..=0x7f).filter(|&b| begins_line_part(b)).all(spelled)
        }
    };
    let prefix_after_tokens = matches!(
        v.normalizer.prepend,
        Prepend::Always | Prepend::Metaspace { first_only: false }
    );
    let rules: HashMap<u32, AddedRule> = v.added_rules.iter().copied().collect();
    let added = v.added.iter().all(|(text, id)| {
        let rule = rules.get(id).copied().unwrap_or_default();
        let looks_past_a_cut = text.ends_with('\n') && (rule.single_word || prefix_after_tokens);
        !spans_line_start(text.as_bytes()) && !rule.lstrip && !looks_past_a_cut
    });
    splits && added
}

/// `text` in Unicode NFC, line by line: a `\n` neither composes nor reorders with the
/// characters around it, so each line normalizes alone, and only the lines that need it
/// are rebuilt (a text of 10 MB with one accent to compose costs what its line does).
fn nfc(text: &str) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let stable = is_nfc_quick(line.chars()) == IsNormalized::Yes;
        at += line.len();
        if stable && out.is_none() {
            continue;
        }
        let out = out.get_or_insert_with(|| {
            let mut owned = String::with_capacity(text.len() + text.len() / 8);
            owned.push_str(&text[..at - line.len()]);
            owned
        });
        if stable {
            out.push_str(line);
        } else {
            out.extend(line.nfc());
        }
    }
    out.map_or(Cow::Borrowed(text), Cow::Owned)
}

/// The pair table: (left, right) -> (rank, merged). A merge whose parts or result are
/// not tokens can never apply and is skipped (damaged vocabularies have a few).
fn merge_table(
    merges: &Merges,
    tokens: &[Vec<u8>],
    kinds: &[TokenKind],
    by_bytes: &FastMap<&[u8], u32>,
    alphabet: Alphabet,
) -> Result<FastMap<u64, (u32, u32)>> {
    let mut table = FastMap::default();
    match merges {
        Merges::Ranked(pairs) => {
            table.reserve(pairs.len());
            let mut joined = Vec::new();
            for (rank, &(l, r)) in pairs.iter().enumerate() {
                let (Some(left), Some(right)) = (tokens.get(l as usize), tokens.get(r as usize)) else {
                    return Err(invalid(format!(
                        "merge {rank} names an id outside the vocabulary"
                    )));
                };
                joined.clear();
                joined.extend_from_slice(left);
                joined.extend_from_slice(right);
                if let Some(&m) = by_bytes.get(&joined[..]) {
                    table.entry(pair_key(l, r)).or_insert((rank as u32, m));
                }
            }
        }
        Merges::ByTokenRank(ranks) => {
            if ranks.len() != tokens.len() {
                return Err(invalid("one rank per token expected"));
            }
            let mut order: Vec<u32> = (0..tokens.len() as u32)
                .filter(|&id| ranks[id as usize] != u32::MAX && kinds[id as usize].is_mergeable())
                .collect();
            order.sort_by_key(|&id| ranks[id as usize]);
            for id in order {
                let token = &tokens[id as usize];
                for cut in 1..token.len() {
                    if alphabet != Alphabet::Bytes
                        && !std::str::from_utf8(token).is_ok_and(|t| t.is_char_boundary(cut))
                    {
                        continue;
                    }
                    if let (Some(&l), Some(&r)) = (by_bytes.get(&token[..cut]), by_bytes.get(&token[cut..])) {
                        table.entry(pair_key(l, r)).or_insert((ranks[id as usize], id));
                    }
                }
            }
        }
    }
    Ok(table)
}

fn pair_key(left: u32, right: u32) -> u64 {
    ((left as u64) << 32) | right as u64
}

#[derive(Clone, Copy)]
struct Sym {
    /// Token id, or NONE once merged into its left neighbour.
    id: u32,
    prev: u32,
    next: u32,
}

/// Pieces of up to this many symbols take [`BpeModel::encode_short`].
const SHORT: usize = 32;

/// Parts of a long piece ([`BpeModel::encode_piece`]) are at least this many bytes: few
/// enough symbols for the merge loop's short paths, short enough for the piece cache.
const CUT_EVERY: usize = 48;

/// Byte pairs (a, b) that occur as adjacent bytes inside some mergeable token, a bit
/// each. BPE only builds symbols that are mergeable tokens whose bytes are the text they
/// cover (a merge's result is the concatenation of its parts), so a symbol spanning the
/// point between two bytes of the text holds that pair: where the pair is in no token,
/// no symbol ever spans it.
struct JoinedBytes(Box<[u64; 1024]>);

impl JoinedBytes {
    fn of<'a>(tokens: impl Iterator<Item = &'a &'a [u8]>) -> JoinedBytes {
        let mut bits = Box::new([0u64; 1024]);
        for token in tokens {
            for pair in token.windows(2) {
                let i = (usize::from(pair[0]) << 8) | usize::from(pair[1]);
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        JoinedBytes(bits)
    }

    #[inline]
    fn contains(&self, a: u8, b: u8) -> bool {
        let i = (usize::from(a) << 8) | usize::from(b);
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
}

/// Scratch buffers reused across the pieces of one `encode` call.
#[derive(Default)]
struct Work {
    /// Ids of the pieces encoded so far: this call's, or its thread's (`with_merged`).
    cache: PieceCache,
    syms: Vec<Sym>,
    /// Candidate merges as (rank, left symbol), popped smallest first.
    agenda: Agenda,
}

impl Tokenizer for BpeModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        self.encode_text(text, true, out);
    }

    fn encode_continuation(&self, text: &str, out: &mut Vec<u32>) {
        self.encode_text(text, false, out);
    }

    fn cuts_at_lines(&self) -> bool {
        self.cuts_at_lines
    }

    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        let mut ranges = Vec::new();
        self.for_each_section(text, |range, token| {
            if token.is_some() || !self.normalizes_to_itself(&text[range.clone()]) {
                // The tokens of a section that normalization changes do not line up with
                // its text: one piece, which incremental encoding treats as a fallback.
                ranges.push(range);
                return;
            }
            let start = range.start;
            self.split(&text[range], &mut |r| ranges.push(start + r.start..start + r.end));
        });
        Box::new(ranges.into_iter().map(move |r| &text[r]))
    }

    fn prefix_len(&self) -> usize {
        usize::from(self.normalizer.prepend != Prepend::Never)
    }

    fn token_bytes(&self, id: u32) -> &[u8] {
        match self.starts.get(id as usize..id as usize + 2) {
            Some(&[start, end]) => &self.bytes[start as usize..end as usize],
            _ => &[],
        }
    }

    fn special(&self, name: &str) -> Option<u32> {
        self.specials.get(name).copied()
    }

    fn is_special(&self, id: u32) -> bool {
        self.kind(id).is_some_and(TokenKind::is_literal)
    }

    fn vocab_size(&self) -> usize {
        self.kinds.len()
    }

    fn strips_leading_space(&self) -> bool {
        self.strip_leading_space
    }
}

/// A tiny SentencePiece-style vocabulary, for the tests and the `line_cuts` fuzz target:
/// `<unk>`, `<s>`, 256 byte tokens, then characters and words ranked by position
/// (earlier merges first), dummy prefix on.
pub fn tiny_spm_vocabulary() -> Vocabulary {
    let mut tokens: Vec<Vec<u8>> = vec![b"<unk>".to_vec(), b"<s>".to_vec()];
    let mut kinds = vec![TokenKind::Unknown, TokenKind::Control];
    for b in 0..=255u8 {
        tokens.push(vec![b]);
        kinds.push(TokenKind::Byte);
    }
    let words = [
        " ", "a", "b", "e", "h", "l", "o", "x", "y", "\n", "he", "ll", " h", "hell", " hell", " hello",
        "hello", " a", "aa", "x ", "x y", "  ",
    ];
    for w in words {
        tokens.push(w.as_bytes().to_vec());
        kinds.push(TokenKind::Normal);
    }
    let ranks = (0..tokens.len() as u32)
        .map(|id| {
            if kinds[id as usize] == TokenKind::Normal {
                id
            } else {
                u32::MAX
            }
        })
        .collect();
    Vocabulary {
        name: "tiny-spm".into(),
        pre: PreTokenizer::Whole,
        normalizer: Normalizer {
            nfc: false,
            metaspace: true,
            prepend: Prepend::Always,
        },
        alphabet: Alphabet::Chars {
            byte_fallback: true,
            fuse_unk: false,
        },
        tokens,
        kinds,
        merges: Merges::ByTokenRank(ranks),
        ignore_merges: false,
        unk: Some(0),
        strip_leading_space: true,
        added: Vec::new(),
        added_rules: Vec::new(),
    }
}

/// [`tiny_spm_vocabulary`]'s tokenizer.
pub fn tiny_spm() -> BpeModel {
    BpeModel::new(tiny_spm_vocabulary()).expect("a valid vocabulary")
}

/// GPT-2's map from a byte to the printable character that spells it in byte-level
/// vocabularies: printable Latin-1 bytes stand for themselves, the other 68 take 256, ...
pub(crate) fn gpt2_byte_chars() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        map[b as usize] = if printable {
            b as char
        } else {
            next += 1;
            char::from_u32(next - 1).expect("256..324 are chars")
        };
    }
    map
}

/// The bytes a byte-level vocabulary string spells. Characters outside the map
/// (malformed vocabularies) keep their UTF-8 bytes.
pub(crate) fn gpt2_byte_decoder() -> impl Fn(&str) -> Vec<u8> {
    let char_to_byte: HashMap<char, u8> = gpt2_byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect();
    move |text| {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match char_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tokenizer::gguf::{self, Value};
    use crate::tokenizer::piece_map::{merged_here, KEPT_PIECES};
    use crate::tokenizer::tokenizer_json;

    const TINY_MERGES: [(&str, &str); 10] = [
        ("h", "e"),
        ("l", "l"),
        ("he", "ll"),
        ("hell", "o"),
        ("Ġ", "w"),
        ("o", "r"),
        ("Ġw", "or"),
        ("l", "d"),
        ("Ġwor", "ld"),
        ("a", "a"),
    ];

    /// A tiny byte-level vocabulary: all bytes, then merges building "hello", " world", "aa".
    pub(crate) fn tiny() -> BpeModel {
        BpeModel::new(tiny_vocabulary()).unwrap()
    }

    /// Its tokens as GPT-2 spells them.
    fn tiny_spelled() -> Vec<String> {
        let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<tool>".into()];
        tokens.extend(gpt2_byte_chars().iter().map(|c| c.to_string()));
        tokens.extend(TINY_MERGES.iter().map(|(l, r)| format!("{l}{r}")));
        tokens
    }

    fn tiny_vocabulary() -> Vocabulary {
        let spelled = tiny_spelled();
        let decode = gpt2_byte_decoder();
        let mut tokens: Vec<Vec<u8>> = spelled.iter().map(|t| decode(t)).collect();
        tokens[0] = b"<|endoftext|>".to_vec();
        tokens[1] = b"<tool>".to_vec();
        let id = |t: &str| spelled.iter().position(|s| s == t).unwrap() as u32;
        let merges = TINY_MERGES.iter().map(|(l, r)| (id(l), id(r))).collect();
        let mut kinds = vec![TokenKind::Normal; tokens.len()];
        kinds[0] = TokenKind::Control;
        kinds[1] = TokenKind::UserDefined;
        Vocabulary {
            name: "tiny".into(),
            pre: PreTokenizer::DigitsThenGpt2,
            normalizer: Normalizer::NONE,
            alphabet: Alphabet::Bytes,
            tokens,
            kinds,
            merges: Merges::Ranked(merges),
            ignore_merges: false,
            unk: None,
            strip_leading_space: false,
            added: vec![("<tool>".into(), 1)],
            added_rules: Vec::new(),
        }
    }

    #[test]
    fn a_turn_encodes_with_its_threads_kept_pieces_as_with_its_own() {
        // Two models whose merges differ: what the thread keeps for one must not answer
        // for the other. Words with merges ("hello world") and without ("hexlo").
        let full = tiny();
        let mut v = tiny_vocabulary();
        if let Merges::Ranked(merges) = &mut v.merges {
            merges.truncate(4);
        }
        let fewer = BpeModel::new(v).unwrap();
        let text = "hello world hexlo wor ld helloworld aaa\n".repeat(50);
        let own = |t: &BpeModel| {
            let mut ids = Vec::new();
            t.encode_with(&text, true, &mut Work::default(), &mut ids);
            ids
        };
        assert_ne!(own(&full), own(&fewer));
        for _ in 0..2 {
            for t in [&full, &fewer, &fewer] {
                assert!(text.len() <= KEPT_TEXT);
                assert_eq!(encode(t, &text), own(t));
            }
        }
        let (owner, kept) = merged_here();
        assert_eq!(owner, fewer.owner);
        assert!((1..=KEPT_PIECES).contains(&kept), "{kept}");
    }

    #[test]
    fn sentencepiece_cuts_at_lines_unless_a_token_spans_one() {
        assert!(tiny_spm().cuts_at_lines());
        let text = "ab\nx y\n\n  a\nhello\n€\nb";
        crate::tokenizer::assert_line_cut_ids_exact(&tiny_spm(), text);
        let mut v = tiny_spm_vocabulary();
        v.tokens.push(b"\nh".to_vec());
        v.kinds.push(TokenKind::Normal);
        if let Merges::ByTokenRank(ranks) = &mut v.merges {
            ranks.push(0);
        }
        assert!(!BpeModel::new(v).unwrap().cuts_at_lines());
        // Byte-level vocabularies cut only where their split does.
        assert!(!tiny().cuts_at_lines());
    }

    /// tiny_spm with one added token, its dummy prefix put `prepend`.
    fn tiny_spm_adding(text: &str, prepend: Prepend, single_word: bool) -> BpeModel {
        let mut v = tiny_spm_vocabulary();
        let id = v.tokens.len() as u32;
        v.normalizer.prepend = prepend;
        v.tokens.push(text.into());
        v.kinds.push(TokenKind::UserDefined);
        if let Merges::ByTokenRank(ranks) = &mut v.merges {
            ranks.push(u32::MAX);
        }
        v.added = vec![(text.into(), id)];
        let rule = AddedRule {
            single_word,
            ..AddedRule::default()
        };
        v.added_rules = vec![(id, rule)];
        BpeModel::new(v).unwrap()
    }

    #[test]
    fn added_tokens_that_reach_past_a_line_start_stop_the_cuts() {
        let newlines = tiny_spm_adding("\n\n", Prepend::Once, false);
        assert!(newlines.cuts_at_lines());
        crate::tokenizer::assert_line_cut_ids_exact(&newlines, "a\n\nb x\n\n\nhello\n\n");
        // A part after the token would lack the prefix the whole puts after it.
        let prefixed = tiny_spm_adding("\n\n", Prepend::Always, false);
        assert!(!prefixed.cuts_at_lines());
        let mut parts = encode(&prefixed, "a\n\n");
        prefixed.encode_continuation("b", &mut parts);
        assert_ne!(parts, encode(&prefixed, "a\n\nb"));
        assert!(!tiny_spm_adding("\n", Prepend::Once, true).cuts_at_lines());
        assert!(!tiny_spm_adding("x\nh", Prepend::Once, false).cuts_at_lines());
    }

    proptest::proptest! {
        #[test]
        fn pieces_cut_where_no_token_joins_encode_to_the_ids_of_the_whole(
            parts in proptest::collection::vec(proptest::sample::select(
                &["a", "aa", "hello", " world", "h", "e", "l", "o", "d", "w", "é", "€", "x", " ", "\u{301}", "\n", "▁"][..]
            ), 0..200),
            every in 1usize..60,
        ) {
            let text = parts.concat();
            tiny().assert_piece_cuts_exact(&text, every);
            tiny_spm().assert_piece_cuts_exact(&text, every);
        }
    }

    #[test]
    fn long_pieces_are_cut_only_between_bytes_no_token_joins() {
        let t = tiny();
        let text = "hello".repeat(30);
        // `o` then `h` sit side by side in no token: cuts there, and only there.
        let cut = t.cut_after(&text, 1).unwrap();
        assert_eq!(cut, 5);
        assert_eq!(t.cut_after(&text, 48), Some(50));
        assert_eq!(t.cut_after(&"a".repeat(100), 0), None);
        assert_eq!(encode(&t, &text), vec![t.whole.get(b"hello").unwrap(); 30]);
        // SentencePiece: never beside a character that falls to the unknown token.
        let mut v = tiny_spm_vocabulary();
        v.alphabet = Alphabet::Chars {
            byte_fallback: false,
            fuse_unk: true,
        };
        let unk = BpeModel::new(v).unwrap();
        assert_eq!(unk.cut_after("ab€€ab", 1), Some(1));
        assert_eq!(unk.cut_after("ab€€ab", 2), Some(9));
        unk.assert_piece_cuts_exact(&"b€€a".repeat(20), 1);
    }

    proptest::proptest! {
        #[test]
        fn sentencepiece_line_parts_encode_to_the_ids_of_the_whole(
            lines in proptest::collection::vec(proptest::sample::select(
                &["a", "aa", " a", "hello", " hello", "x y", "  ", "\n", "é", "€", "▁", "b", "\t"][..]
            ), 0..30)
        ) {
            crate::tokenizer::assert_line_cut_ids_exact(&tiny_spm(), &lines.concat());
        }
    }

    #[test]
    fn sentencepiece_prefix_fallback_and_words() {
        let t = tiny_spm();
        let word = |w: &str| t.whole.get(w.as_bytes()).unwrap();
        assert_eq!(encode(&t, "hello"), [word(" hello")]);
        let mut ids = Vec::new();
        t.encode_continuation("hello", &mut ids);
        assert_eq!(ids, [word("hello")]);
        // `é` has no token: its two UTF-8 bytes' tokens; `▁` in text is a space.
        let ids = encode(&t, "é▁a");
        assert_eq!(ids, [t.char_ids[&' '], 2 + 0xC3, 2 + 0xA9, word(" a")]);
        let mut text = Vec::new();
        t.decode_text(&encode(&t, "hello aa é"), &mut text);
        assert_eq!(text, "hello aa é".as_bytes());
        // Cut before each space, except after `x`, which a token joins to a space.
        assert_eq!(t.pieces("ab x y  a").collect::<Vec<_>>(), ["ab", " x y", "  a"]);
        assert_eq!(encode(&t, "x y")[1..], [word("x y")]);
    }

    fn encode(t: &dyn Tokenizer, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        t.encode(text, &mut out);
        out
    }

    fn decode(t: &dyn Tokenizer, ids: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        t.decode_bytes(ids, &mut out);
        out
    }

    proptest::proptest! {
        #[test]
        fn nfc_line_by_line_is_nfc_of_the_whole(
            parts in proptest::collection::vec(proptest::sample::select(
                &["a", "e", "A", "\n", "\r", " ", "\u{301}", "\u{327}", "\u{323}", "\u{1100}", "\u{1161}", "\u{11a8}", "é", "Å", "\u{212b}", "\u{f900}", "中"][..]
            ), 0..40)
        ) {
            let text = parts.concat();
            proptest::prop_assert_eq!(nfc(&text), text.nfc().collect::<String>());
        }
    }

    #[test]
    fn byte_map_is_gpt2s() {
        let chars = gpt2_byte_chars();
        assert_eq!(chars[b' ' as usize], 'Ġ');
        assert_eq!(chars[b'\n' as usize], 'Ċ');
        assert_eq!(chars[b'A' as usize], 'A');
        assert_eq!(chars[0xAD], '\u{143}');
    }

    #[test]
    fn merges_by_rank() {
        let t = tiny();
        let ids = encode(&t, "hello world");
        assert_eq!(ids.len(), 2);
        assert_eq!(t.token_bytes(ids[0]), b"hello");
        assert_eq!(t.token_bytes(ids[1]), b" world");
        // "aaa": the leftmost pair merges first.
        let ids = encode(&t, "aaa");
        assert_eq!(decode(&t, &ids[..1]), b"aa");
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn control_tokens_stay_text_user_tokens_match() {
        let t = tiny();
        let ids = encode(&t, "<|endoftext|>");
        assert!(ids.len() > 1 && !ids.contains(&0));
        assert_eq!(t.special("<|endoftext|>"), Some(0));
        assert!(t.is_special(0));
        assert_eq!(
            encode(&t, "a<tool>b"),
            vec![t.byte_ids[b'a' as usize], 1, t.byte_ids[b'b' as usize]]
        );
        assert_eq!(t.pieces("a<tool>b").collect::<Vec<_>>(), ["a", "<tool>", "b"]);
    }

    #[test]
    fn added_token_rules_strip_whitespace_and_match_words() {
        let with_rule = |rule| {
            let mut v = tiny_vocabulary();
            v.added_rules = vec![(1, rule)];
            BpeModel::new(v).unwrap()
        };
        let strip = with_rule(AddedRule {
            lstrip: true,
            rstrip: true,
            single_word: false,
        });
        assert_eq!(
            strip.pieces("a  <tool> \nb").collect::<Vec<_>>(),
            ["a", "  <tool> \n", "b"]
        );
        assert_eq!(encode(&strip, " <tool> "), [1]);
        let word = with_rule(AddedRule {
            single_word: true,
            ..AddedRule::default()
        });
        assert!(!encode(&word, "a<tool>").contains(&1));
        assert!(!encode(&word, "<tool>é").contains(&1));
        assert!(encode(&word, "a <tool>.").contains(&1));
    }

    #[test]
    fn round_trips_any_text() {
        let t = tiny();
        for text in [
            "",
            "hello",
            "Größe 10€ 東京 🙂\r\n\t x",
            "  leading",
            "trailing  ",
        ] {
            assert_eq!(decode(&t, &encode(&t, text)), text.as_bytes());
        }
    }

    #[test]
    fn long_runs_are_not_quadratic() {
        // Correctness at size; speed is measured in benches/.
        let t = tiny();
        let text = "a".repeat(100_001);
        let ids = encode(&t, &text);
        assert_eq!(ids.len(), 50_001);
        assert_eq!(decode(&t, &ids), text.as_bytes());
        let spaces = " ".repeat(100_000);
        assert_eq!(decode(&t, &encode(&t, &spaces)), spaces.as_bytes());
    }

    #[test]
    fn bytes_without_tokens_are_dropped() {
        let mut v = tiny_vocabulary();
        v.tokens[2 + 4].clear();
        let t = BpeModel::new(v).unwrap();
        assert_eq!(decode(&t, &encode(&t, "a\u{4}b")), b"ab");
        assert_eq!(decode(&t, &encode(&t, "\u{4}")), b"");
    }

    #[test]
    fn merges_split_after_first_char() {
        use tokenizer_json::split_merge;
        assert_eq!(split_merge("Ġ t").unwrap(), ("Ġ", "t"));
        assert_eq!(split_merge("  x").unwrap(), (" ", "x"));
        assert!(split_merge("abc").is_err());
    }

    #[test]
    fn tokenizer_json_round_trip() {
        let spelled = tiny_spelled();
        let vocab: HashMap<&str, u32> = spelled
            .iter()
            .enumerate()
            .skip(2)
            .map(|(id, s)| (s.as_str(), id as u32))
            .collect();
        let json = serde_json::json!({
            "added_tokens": [
                {"id": 0, "content": "<|endoftext|>", "special": true},
                {"id": 1, "content": "<tool>", "special": false},
            ],
            "normalizer": null,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
            ]},
            "model": {"type": "BPE", "vocab": vocab, "merges": [
                "h e", "l l", ["he", "ll"], "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "a a"
            ]},
        });
        let from_json =
            BpeModel::new(tokenizer_json::vocabulary(json.to_string().as_bytes()).unwrap()).unwrap();
        let t = tiny();
        for text in ["hello world", "aaaa <tool> 12", "<|endoftext|>"] {
            assert_eq!(encode(&from_json, text), encode(&t, text));
        }
        assert_eq!(from_json.special("<|endoftext|>"), Some(0));
    }

    #[test]
    fn gguf_metadata_round_trip() {
        let spelled = tiny_spelled();
        let types = (0..spelled.len())
            .map(|id| Value::Int([3, 4].get(id).copied().unwrap_or(1)))
            .collect();
        let merges = TINY_MERGES
            .iter()
            .map(|(l, r)| Value::Str(format!("{l} {r}")))
            .collect();
        let bytes = gguf::tests::write_metadata(&[
            ("general.name", Value::Str("tiny".into())),
            ("tokenizer.ggml.model", Value::Str("gpt2".into())),
            ("tokenizer.ggml.pre", Value::Str("smollm".into())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(spelled.into_iter().map(Value::Str).collect()),
            ),
            ("tokenizer.ggml.token_type", Value::Array(types)),
            ("tokenizer.ggml.merges", Value::Array(merges)),
        ]);
        let meta = gguf::read_metadata(&bytes[..]).unwrap();
        let from_gguf = BpeModel::new(gguf::vocabulary(&meta).unwrap()).unwrap();
        assert_eq!(from_gguf.name(), "tiny");
        let t = tiny();
        for text in ["hello world", "aaaa <tool> 12"] {
            assert_eq!(encode(&from_gguf, text), encode(&t, text));
        }
    }

    #[test]
    fn unsupported_sources_are_errors() {
        let bytes = gguf::tests::write_metadata(&[("tokenizer.ggml.model", Value::Str("bert".into()))]);
        let err = gguf::vocabulary(&gguf::read_metadata(&bytes[..]).unwrap())
            .err()
            .unwrap();
        assert_eq!(err.code, Code::InvalidVocabulary);
        assert!(err.message.contains("bert"), "{}", err.message);
        assert!(tokenizer_json::vocabulary(b"{}").is_err());
        let lookbehind = serde_json::json!({
            "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?<=a)b"}, "behavior": "Isolated", "invert": false},
            "model": {"type": "BPE", "vocab": {}, "merges": []},
        });
        let err = tokenizer_json::vocabulary(lookbehind.to_string().as_bytes())
            .err()
            .unwrap();
        assert!(err.message.contains("(?<=a)b"), "{}", err.message);
        let wordpiece = serde_json::json!({"model": {"type": "WordPiece", "vocab": {}, "merges": []}});
        let err = tokenizer_json::vocabulary(wordpiece.to_string().as_bytes())
            .err()
            .unwrap();
        assert!(err.message.contains("WordPiece"), "{}", err.message);
    }
}
