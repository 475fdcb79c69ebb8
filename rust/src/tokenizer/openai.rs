//! OpenAI encodings, embedded by the `bpe-openai` crate (no download at run time):
//! `o200k_base`, `o200k_harmony` (o200k plus the harmony special tokens gpt-oss uses)
//! and `cl100k_base`.
//!
//! Encoding is the pre-tokenizer split of `bpe-openai` (its regexes reproduce tiktoken's
//! `pat_str`; o200k's is decided without the regex where the text is ASCII, see
//! [`Scanner`]), then BPE per piece. A piece that is itself a token (most
//! words) is one hash lookup; the others take the linear-time backtracking encoder of
//! the `bpe` crate (same ids as tiktoken's merge loop, without its quadratic worst case;
//! it also measured faster than that loop on our corpus).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use super::piece_map::{new_owner, with_merged, Ahead, PieceCache, WholeTokens, KEPT_TEXT};
use super::scanner::Scanner;
use super::Tokenizer;

/// Token bytes -> id (= rank) for the ordinary vocabulary.
fn ranks(bpe: &bpe::byte_pair_encoding::BytePairEncoding) -> WholeTokens {
    WholeTokens::new((0..bpe.num_tokens() as u32).map(|id| (bpe.token_bytes(id), id)))
}

pub struct OpenAiTokenizer {
    name: &'static str,
    /// Its identity for the merged pieces a thread keeps (`with_merged`).
    owner: u64,
    inner: &'static bpe_openai::Tokenizer,
    /// The ordinary vocabulary by bytes: the single-token fast path and the merge loop.
    ranks: WholeTokens,
    /// id -> literal text, for special and reserved tokens (ids above the ordinary vocabulary).
    specials: HashMap<u32, String>,
    /// literal text -> id; may hold aliases (two names for one id).
    by_text: HashMap<String, u32>,
    vocab_size: usize,
    /// The split is o200k's: ASCII text is split without the regex.
    o200k_split: bool,
}

impl OpenAiTokenizer {
    fn new(
        name: &'static str,
        inner: &'static bpe_openai::Tokenizer,
        specials: Vec<(String, u32)>,
        aliases: &[(&str, u32)],
        o200k_split: bool,
    ) -> Self {
        let ordinary = inner.bpe.num_tokens();
        assert!(
            specials.iter().all(|(_, id)| *id as usize >= ordinary),
            "{name}: special tokens must sit above the ordinary vocabulary"
        );
        let top = specials.iter().map(|(_, id)| *id as usize + 1).max().unwrap_or(0);
        let mut by_text: HashMap<String, u32> = specials.iter().cloned().collect();
        by_text.extend(aliases.iter().map(|(t, id)| (t.to_string(), *id)));
        OpenAiTokenizer {
            name,
            owner: new_owner(),
            inner,
            ranks: ranks(&inner.bpe),
            by_text,
            specials: specials.into_iter().map(|(t, id)| (id, t)).collect(),
            vocab_size: ordinary.max(top),
            o200k_split,
        }
    }

    /// Encode `text`, the ids of pieces that took the merge loop kept in `merged`.
    fn encode_with(&self, text: &str, merged: &mut PieceCache, out: &mut Vec<u32>) {
        out.reserve(text.len() / 4);
        let mut ahead = Ahead::default();
        let mut each = |piece: &str, id: Option<u32>| match id {
            Some(id) => out.push(id),
            None => match merged.get(piece.as_bytes()) {
                Some(ids) => out.extend_from_slice(ids),
                None => {
                    let ids = self.inner.bpe.encode_via_backtracking(piece.as_bytes());
                    merged.insert(piece.as_bytes(), &ids);
                    out.extend(ids);
                }
            },
        };
        for piece in self.split(text) {
            if ahead.push(&self.ranks, piece) {
                ahead.drain(&self.ranks, &mut each);
            }
        }
        ahead.drain(&self.ranks, each);
    }

    /// The pre-tokenizer's pieces of `text`, in order.
    fn split<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        // Other encodings keep bpe-openai's iterator.
        let mut regex = (!self.o200k_split).then(|| self.inner.split(text));
        let mut start = 0;
        std::iter::from_fn(move || {
            if let Some(pieces) = regex.as_mut() {
                return pieces.next();
            }
            if start >= text.len() {
                return None;
            }
            let end = match Scanner::O200k.piece(text.as_bytes(), start) {
                Some(end) => end,
                None => {
                    let rest = &text[start..];
                    start + self.inner.split(rest).next().map_or(rest.len(), str::len)
                }
            };
            let piece = &text[start..end];
            start = end;
            Some(piece)
        })
    }
}

fn o200k_specials() -> Vec<(String, u32)> {
    vec![
        ("<|endoftext|>".into(), 199_999),
        ("<|endofprompt|>".into(), 200_018),
    ]
}

/// The harmony vocabulary, as tiktoken's `o200k_harmony` defines it: o200k_base ids
/// 0..199997, `<|startoftext|>` and `<|endoftext|>`, then 200000..201087 where the named
/// harmony tokens sit among `<|reserved_N|>` ids. 200018 keeps o200k's `<|endofprompt|>`
/// name; tiktoken and openai-harmony also call it `<|reserved_200018|>` (an alias here).
fn o200k_harmony_specials() -> Vec<(String, u32)> {
    let named: &[(&str, u32)] = &[
        ("<|startoftext|>", 199_998),
        ("<|endoftext|>", 199_999),
        ("<|return|>", 200_002),
        ("<|constrain|>", 200_003),
        ("<|channel|>", 200_005),
        ("<|start|>", 200_006),
        ("<|end|>", 200_007),
        ("<|message|>", 200_008),
        ("<|call|>", 200_012),
        ("<|endofprompt|>", 200_018),
    ];
    let mut out: Vec<(String, u32)> = named.iter().map(|(t, id)| (t.to_string(), *id)).collect();
    for id in 200_000..201_088u32 {
        if !named.iter().any(|(_, n)| *n == id) {
            out.push((format!("<|reserved_{id}|>"), id));
        }
    }
    out
}

fn cl100k_specials() -> Vec<(String, u32)> {
    vec![
        ("<|endoftext|>".into(), 100_257),
        ("<|fim_prefix|>".into(), 100_258),
        ("<|fim_middle|>".into(), 100_259),
        ("<|fim_suffix|>".into(), 100_260),
        ("<|endofprompt|>".into(), 100_276),
    ]
}

static O200K_BASE: LazyLock<Arc<OpenAiTokenizer>> = LazyLock::new(|| {
    Arc::new(OpenAiTokenizer::new(
        "o200k_base",
        bpe_openai::o200k_base(),
        o200k_specials(),
        &[],
        true,
    ))
});
static O200K_HARMONY: LazyLock<Arc<OpenAiTokenizer>> = LazyLock::new(|| {
    Arc::new(OpenAiTokenizer::new(
        "o200k_harmony",
        bpe_openai::o200k_base(),
        o200k_harmony_specials(),
        &[("<|reserved_200018|>", 200_018)],
        true,
    ))
});
static CL100K_BASE: LazyLock<Arc<OpenAiTokenizer>> = LazyLock::new(|| {
    Arc::new(OpenAiTokenizer::new(
        "cl100k_base",
        bpe_openai::cl100k_base(),
        cl100k_specials(),
        &[],
        false,
    ))
});

pub fn by_name(name: &str) -> Option<Arc<dyn Tokenizer>> {
    let t: Arc<OpenAiTokenizer> = match name {
        "o200k_base" => O200K_BASE.clone(),
        "o200k_harmony" => O200K_HARMONY.clone(),
        "cl100k_base" => CL100K_BASE.clone(),
        _ => return None,
    };
    Some(t)
}

impl Tokenizer for OpenAiTokenizer {
    fn name(&self) -> &str {
        self.name
    }

    fn encode(&self, text: &str, out: &mut Vec<u32>) {
        if text.len() > KEPT_TEXT {
            return self.encode_with(text, &mut PieceCache::default(), out);
        }
        with_merged(self.owner, |merged| self.encode_with(text, merged, out));
    }

    /// o200k's split cuts at line starts as the scanned open-model splits do (its pattern
    /// is tekken's with contractions and digits in threes); special tokens are never
    /// matched in text.
    fn cuts_at_lines(&self) -> bool {
        self.o200k_split
    }

    fn pieces<'a>(&'a self, text: &'a str) -> Box<dyn Iterator<Item = &'a str> + 'a> {
        Box::new(self.split(text))
    }

    /// Ids in the gaps of a vocabulary (e.g. 199998 in `o200k_base`) and ids past its
    /// end have no bytes.
    fn token_bytes(&self, id: u32) -> &[u8] {
        // Special tokens sit above the byte-pair ranks (checked at construction), so the
        // per-token path skips hashing for every ordinary token.
        if (id as usize) < self.inner.bpe.num_tokens() {
            return self.inner.bpe.token_bytes(id);
        }
        self.specials.get(&id).map_or(&[], |text| text.as_bytes())
    }

    fn special(&self, name: &str) -> Option<u32> {
        self.by_text.get(name).copied()
    }

    fn is_special(&self, id: u32) -> bool {
        id as usize >= self.inner.bpe.num_tokens() && self.specials.contains_key(&id)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::piece_map::{merged_here, KEPT_PIECES};
    use crate::tokenizer::scanner::ALPHABET;
    use proptest::prelude::*;

    fn o200k_regex_pieces(text: &str) -> Vec<&str> {
        bpe_openai::o200k_base().split(text).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn the_ascii_split_finds_the_regex_pieces(
            parts in proptest::collection::vec(proptest::sample::select(ALPHABET), 0..40)
        ) {
            let text = parts.concat();
            let t = by_name("o200k_harmony").unwrap();
            prop_assert_eq!(t.pieces(&text).collect::<Vec<_>>(), o200k_regex_pieces(&text));
        }
    }

    #[test]
    fn the_ascii_split_finds_the_regex_pieces_of_code_and_prose() {
        let text = concat!(
            "fn main() {\n    let x = \"It's a dog's LIFE\";\r\n\tprintln!(\"{x}\");\n}\n\n",
            "  // We'RE here, they'll see; you'VE 12345 items/sec -> 3.14159\n",
            "HTTPServer's URLs: https://example.com/a/b?c=d&e=f  \n\n\n   end   ",
            "naïve café CAFÉ ſ'ſ Don'ſ x²+y½ \u{a0}\u{3000}tail\u{85}",
        );
        let t = by_name("o200k_base").unwrap();
        assert_eq!(t.pieces(text).collect::<Vec<_>>(), o200k_regex_pieces(text));
        for cut in 0..text.len() {
            if text.is_char_boundary(cut) {
                let tail = &text[cut..];
                assert_eq!(
                    t.pieces(tail).collect::<Vec<_>>(),
                    o200k_regex_pieces(tail),
                    "{tail:?}"
                );
            }
        }
    }

    #[test]
    fn the_pieces_a_thread_keeps_merged_are_its_tokenizers_and_bounded() {
        // Turns of identifiers that are not one token, more of them than the thread
        // keeps, and a text too long to use what the thread keeps.
        let turn = |t: usize| -> String {
            (0..KEPT_PIECES)
                .map(|i| format!(" zq{}xv_{}", t * KEPT_PIECES + i, i * 7919 % 10_007))
                .collect()
        };
        let mut texts: Vec<String> = (0..3).map(turn).collect();
        texts.push(texts.concat());
        assert!(texts[..3].iter().all(|t| t.len() <= KEPT_TEXT) && texts[3].len() > KEPT_TEXT);
        let (o200k, cl100k) = (by_name("o200k_base").unwrap(), by_name("cl100k_base").unwrap());
        let encode = |t: &Arc<dyn Tokenizer>, text: &str| {
            let mut ids = Vec::new();
            t.encode(text, &mut ids);
            ids
        };
        for _ in 0..2 {
            for text in &texts {
                // Each encode after the other tokenizer's, and again with the pieces kept.
                assert_eq!(encode(&o200k, text), bpe_openai::o200k_base().encode(text));
                assert_eq!(encode(&cl100k, text), bpe_openai::cl100k_base().encode(text));
                assert_eq!(encode(&cl100k, text), bpe_openai::cl100k_base().encode(text));
            }
        }
        let (owner, kept) = merged_here();
        assert_eq!(owner, CL100K_BASE.owner);
        assert!((1..=KEPT_PIECES).contains(&kept), "{kept}");
    }

    #[test]
    fn a_text_encoded_in_parts_on_threads_has_the_ids_of_the_whole() {
        // This crate's sources, three times: code with line starts of every kind.
        let mut text = String::new();
        for _ in 0..3 {
            for dir in ["src", "src/tokenizer", "src/validate", "src/format"] {
                let mut paths: Vec<_> = std::fs::read_dir(dir)
                    .unwrap()
                    .map(|e| e.unwrap().path())
                    .collect();
                paths.sort();
                for path in paths.iter().filter(|p| p.extension().is_some_and(|e| e == "rs")) {
                    text += &std::fs::read_to_string(path).unwrap();
                }
            }
        }
        assert!(
            text.len() >= 4 * crate::tokenizer::PARALLEL_BYTES,
            "{}",
            text.len()
        );
        let t = by_name("o200k_base").unwrap();
        let mut whole = Vec::new();
        t.encode(&text, &mut whole);
        for parts in [2, 3, 8] {
            let mut ids = Vec::new();
            crate::tokenizer::encode_parallel(&*t, &text, parts, &mut ids);
            assert_eq!(ids, whole, "{parts} parts");
        }
    }

    #[test]
    fn special_strings_in_text_stay_plain() {
        let t = by_name("o200k_harmony").unwrap();
        let mut ids = Vec::new();
        t.encode("<|end|>", &mut ids);
        assert!(ids.len() > 1);
        assert!(ids.iter().all(|&id| !t.is_special(id)));
        assert_eq!(t.special("<|end|>"), Some(200_007));
    }

    #[test]
    fn harmony_ids_match_tiktoken() {
        let t = by_name("o200k_harmony").unwrap();
        let expect = [
            ("<|startoftext|>", 199_998),
            ("<|endoftext|>", 199_999),
            ("<|reserved_200000|>", 200_000),
            ("<|reserved_200001|>", 200_001),
            ("<|return|>", 200_002),
            ("<|constrain|>", 200_003),
            ("<|reserved_200004|>", 200_004),
            ("<|channel|>", 200_005),
            ("<|start|>", 200_006),
            ("<|end|>", 200_007),
            ("<|message|>", 200_008),
            ("<|reserved_200011|>", 200_011),
            ("<|call|>", 200_012),
            ("<|reserved_200013|>", 200_013),
            ("<|endofprompt|>", 200_018),
            ("<|reserved_200018|>", 200_018),
            ("<|reserved_201087|>", 201_087),
        ];
        for (name, id) in expect {
            assert_eq!(t.special(name), Some(id), "{name}");
            assert!(t.is_special(id));
        }
        assert_eq!(t.special("<|reserved_201088|>"), None);
        assert_eq!(t.vocab_size(), 201_088);
        assert_eq!(t.token_bytes(200_018), b"<|endofprompt|>");
        assert!(!t.is_special(199_997));
    }

    #[test]
    fn gaps_have_no_bytes() {
        let t = by_name("o200k_base").unwrap();
        assert_eq!(t.token_bytes(199_998), b"");
        assert_eq!(t.token_bytes(300_000), b"");
        let c = by_name("cl100k_base").unwrap();
        assert_eq!(c.token_bytes(100_256), b"");
        assert_eq!(c.vocab_size(), 100_277);
    }

    #[test]
    fn known_encodings() {
        // Reference ids from tiktoken.
        let t = by_name("cl100k_base").unwrap();
        let mut ids = Vec::new();
        t.encode("hello world", &mut ids);
        assert_eq!(ids, vec![15339, 1917]);
        let o = by_name("o200k_base").unwrap();
        ids.clear();
        o.encode("hello world", &mut ids);
        assert_eq!(ids, vec![24912, 2375]);
    }
}
