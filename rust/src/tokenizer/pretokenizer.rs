//! Pre-tokenizers for byte-level BPE vocabularies: the split of text into pieces that
//! BPE then encodes one at a time, reproducing llama.cpp for the vocabulary's `pre` type.
//!
//! llama.cpp does not run the GPT-2 regex through a regex engine: it hand-codes it
//! (`unicode_regex_split_custom_gpt2`), with its own corners (contractions are
//! lowercase ASCII only; a whitespace run is kept whole at the end of a sub-range
//! instead of giving its last character to the next piece). This module mirrors that
//! scanner over byte offsets, in one linear pass. Character classes (`\p{L}`, `\p{N}`,
//! `\s` as Unicode `White_Space`) come from regex-syntax's Unicode tables, the same
//! definitions llama.cpp generated its tables from.
//!
//! It owns only the split; vocabularies, merges and special tokens live in `bytelevel`.

use std::ops::Range;
use std::sync::LazyLock;

use regex_syntax::hir::{Class, HirKind};

const LETTER: u8 = 1;
const NUMBER: u8 = 2;
const WHITESPACE: u8 = 4;

/// Flags of every code point (1.1 MB, built once on first use).
static FLAGS: LazyLock<Vec<u8>> = LazyLock::new(|| {
    let mut table = vec![0u8; 0x11_0000];
    for (class, flag) in [(r"\p{L}", LETTER), (r"\p{N}", NUMBER), (r"\s", WHITESPACE)] {
        let hir = regex_syntax::parse(class).expect("a Unicode class regex-syntax knows");
        let HirKind::Class(Class::Unicode(set)) = hir.kind() else {
            unreachable!("{class} parses to a Unicode class")
        };
        for range in set.ranges() {
            for f in &mut table[range.start() as usize..=range.end() as usize] {
                *f |= flag;
            }
        }
    }
    table
});

#[inline]
fn flags(c: char) -> u8 {
    FLAGS[c as usize]
}

/// How a vocabulary splits text before BPE, by llama.cpp's `tokenizer.ggml.pre` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Every `\p{N}` character on its own, then GPT-2 on the rest (SmolLM, StarCoder,
    /// Refact, Command-R, ...).
    DigitsThenGpt2,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for a GGUF `tokenizer.ggml.pre` value.
    pub fn from_llama_pre(pre: &str) -> Option<Self> {
        match pre {
            "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => {
                Some(PreTokenizer::Gpt2)
            }
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
                Some(PreTokenizer::DigitsThenGpt2)
            }
            _ => None,
        }
    }

    /// Append the byte ranges of the pieces of `text[range]` to `out`, in order.
    pub fn split(self, text: &str, range: Range<usize>, out: &mut Vec<Range<usize>>) {
        match self {
            PreTokenizer::Gpt2 => split_gpt2(text, range, out),
            PreTokenizer::DigitsThenGpt2 => {
                let mut run = range.start;
                for (i, c) in text[range.clone()].char_indices() {
                    if flags(c) & NUMBER != 0 {
                        let at = range.start + i;
                        split_gpt2(text, run..at, out);
                        out.push(at..at + c.len_utf8());
                        run = at + c.len_utf8();
                    }
                }
                split_gpt2(text, run..range.end, out);
            }
        }
    }
}

/// The character at byte `pos` if it lies inside `end`.
#[inline]
fn char_at(text: &str, pos: usize, end: usize) -> Option<char> {
    if pos < end {
        text[pos..].chars().next()
    } else {
        None
    }
}

/// llama.cpp's hand-written GPT-2 scanner over `text[range]`.
fn split_gpt2(text: &str, range: Range<usize>, out: &mut Vec<Range<usize>>) {
    let end = range.end;
    let mut pos = range.start;
    while pos < end {
        let start = pos;
        let c = char_at(text, pos, end).expect("pos < end is a char boundary");

        if c == '\'' {
            let next = char_at(text, pos + 1, end);
            if matches!(next, Some('s' | 't' | 'm' | 'd')) {
                pos += 2;
                out.push(start..pos);
                continue;
            }
            // `next` is ASCII in every arm below, so `pos + 2` is a char boundary.
            let after = |n: char| {
                n.is_ascii()
                    && matches!(
                        (n, char_at(text, pos + 2, end)),
                        ('r' | 'v', Some('e')) | ('l', Some('l'))
                    )
            };
            if next.is_some_and(after) {
                pos += 3;
                out.push(start..pos);
                continue;
            }
        }

        // ` ?X+` for the three classes: a leading space joins the run that follows it.
        let (lead, f, exists) = if c == ' ' {
            char_at(text, pos + 1, end).map_or((1, 0, false), |n| (1, flags(n), true))
        } else {
            (0, flags(c), true)
        };
        let in_class: Option<fn(u8) -> bool> = if f & LETTER != 0 {
            Some(|f| f & LETTER != 0)
        } else if f & NUMBER != 0 {
            Some(|f| f & NUMBER != 0)
        } else if exists && f & WHITESPACE == 0 {
            Some(|f| f & (LETTER | NUMBER | WHITESPACE) == 0)
        } else {
            None
        };
        if let Some(member) = in_class {
            pos += lead;
            while let Some(ch) = char_at(text, pos, end) {
                if !member(flags(ch)) {
                    break;
                }
                pos += ch.len_utf8();
            }
            out.push(start..pos);
            continue;
        }

        // A whitespace run: `\s+(?!\S)` leaves its last character to the piece after it,
        // unless the run reaches the end of the range (then `\s+` takes it whole).
        let mut last = pos;
        let mut count = 0usize;
        let mut scan = pos;
        while let Some(ch) = char_at(text, scan, end) {
            if flags(ch) & WHITESPACE == 0 {
                break;
            }
            last = scan;
            scan += ch.len_utf8();
            count += 1;
        }
        pos = if count > 1 && scan < end {
            last
        } else if count > 0 {
            scan
        } else {
            pos + c.len_utf8()
        };
        out.push(start..pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        pre.split(text, 0..text.len(), &mut out);
        out.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_words_spaces_and_contractions() {
        let p = PreTokenizer::Gpt2;
        assert_eq!(pieces(p, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(p, "don't  stop"), ["don", "'t", " ", " stop"]);
        assert_eq!(pieces(p, "DON'T"), ["DON", "'", "T"]);
        assert_eq!(pieces(p, "a  \n"), ["a", "  \n"]);
        assert_eq!(pieces(p, "x = 12;"), ["x", " =", " 12", ";"]);
        assert_eq!(pieces(p, "  \tb"), ["  ", "\t", "b"]);
    }

    #[test]
    fn digits_split_before_gpt2() {
        let p = PreTokenizer::DigitsThenGpt2;
        assert_eq!(pieces(p, "abc 123"), ["abc", " ", "1", "2", "3"]);
        assert_eq!(pieces(p, "v2.0  x"), ["v", "2", ".", "0", " ", " x"]);
        assert_eq!(pieces(p, "a   1"), ["a", "   ", "1"]);
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "Größe: 10€ — 東京 🙂 'll\r\n\n  end ";
        for p in [PreTokenizer::Gpt2, PreTokenizer::DigitsThenGpt2] {
            assert_eq!(pieces(p, text).concat(), text);
        }
    }
}
