//! Pre-tokenizer splits decided byte by byte where the text is ASCII, without the regex.
//!
//! The split regexes of the common vocabularies (o200k_base, Llama 3, Qwen2/3, DeepSeek
//! V3's last stage, Mistral tekken) are alternatives tried in order at the start of each
//! piece. Over ASCII their character classes reduce to a handful (upper- and lower-case
//! letters, digits, newlines, other whitespace, punctuation, control characters), so the
//! piece that starts at a given position is found by a few table lookups and runs. A
//! [`Scanner`] answers with the end of that piece, or None when the answer depends on a
//! character outside ASCII (a letter? a mark? whitespace?): the caller then asks the
//! regex for that one piece and scans on from its end. The same pieces as the regex (the
//! `split_scanners` fuzz target and the proptests below compare them on any text), at a
//! fraction of its cost and with no automaton tables to bring into cache.
//!
//! A scanner is chosen by the exact text of a split pattern ([`Scanner::for_pattern`]);
//! any other pattern keeps the regex.

use std::sync::Arc;

use super::pretokenizer::{
    Behavior, PreTokenizer, RegexSplit, RegexSplits, DEEPSEEK_V3, LLAMA3, QWEN2, TEKKEN,
};
use crate::error::Result;

/// o200k_base's pattern, as tiktoken and bpe-openai write it.
pub const O200K: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
);

/// The ASCII classes the patterns tell apart.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Upper,
    Lower,
    Digit,
    /// `\r` or `\n`.
    Newline,
    /// The other whitespace: space, tab, vertical tab, form feed.
    Space,
    /// Punctuation and symbols (`\p{P}`, `\p{S}`).
    Punct,
    /// Control characters that are not whitespace (`\p{Cc}`).
    Control,
    /// Past the end of the text.
    End,
}

/// The class of `text[i]`; None for a byte outside ASCII.
#[inline]
fn class(text: &[u8], i: usize) -> Option<Class> {
    Some(match text.get(i) {
        None => Class::End,
        Some(&b) if b >= 0x80 => return None,
        Some(b'A'..=b'Z') => Class::Upper,
        Some(b'a'..=b'z') => Class::Lower,
        Some(b'0'..=b'9') => Class::Digit,
        Some(b'\r' | b'\n') => Class::Newline,
        Some(b' ' | b'\t' | 0x0b | 0x0c) => Class::Space,
        Some(0..=0x1f | 0x7f) => Class::Control,
        Some(_) => Class::Punct,
    })
}

#[inline]
fn is_letter(c: Class) -> bool {
    matches!(c, Class::Upper | Class::Lower)
}

/// The end of the run of bytes from `i` whose class `member` accepts; None when a byte
/// outside ASCII ends it (it might belong).
#[inline]
fn run(text: &[u8], mut i: usize, member: impl Fn(Class) -> bool) -> Option<usize> {
    while member(class(text, i)?) {
        i += 1;
    }
    Some(i)
}

/// How a pattern spells the English contractions `(?i:'s|'t|'re|'ve|'m|'ll|'d)`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Contractions {
    None,
    /// An alternative of their own, before the words (Llama 3, Qwen).
    First,
    /// An optional suffix of each word (o200k).
    Suffix,
}

/// What a family's pattern is made of.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Rules {
    contractions: Contractions,
    /// Words are `[^\r\n\p{L}\p{N}]?` then upper-case letters then lower-case ones
    /// (o200k, tekken); else `[^\r\n\p{L}\p{N}]?\p{L}+` (Llama 3, Qwen).
    cased: bool,
    /// `\p{N}{1,digits}`.
    digits: usize,
    /// Punctuation runs end with `[\r\n/]*` (o200k, tekken) rather than `[\r\n]*`.
    slash_tail: bool,
}

/// A split pattern this module decides without the regex where the text is ASCII.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Scanner {
    O200k,
    Llama3,
    /// Qwen2, Qwen2.5, Qwen3.
    Qwen2,
    Tekken,
    /// DeepSeek V3's first stage, `\p{N}{1,3}`: a piece is up to three digits or the
    /// text up to the next digit.
    Numbers,
    /// DeepSeek V3's second stage: runs of CJK ideographs and kana, which ASCII text has
    /// none of.
    Cjk,
    /// DeepSeek V3's third stage.
    DeepSeekV3,
}

impl Scanner {
    /// The scanner of a split pattern known by its exact text, if any.
    pub fn for_pattern(pattern: &str) -> Option<Scanner> {
        Some(match pattern {
            O200K => Scanner::O200k,
            LLAMA3 => Scanner::Llama3,
            QWEN2 => Scanner::Qwen2,
            TEKKEN => Scanner::Tekken,
            p if p == DEEPSEEK_V3[0] => Scanner::Numbers,
            p if p == DEEPSEEK_V3[1] => Scanner::Cjk,
            p if p == DEEPSEEK_V3[2] => Scanner::DeepSeekV3,
            _ => return None,
        })
    }

    /// The end of the piece that starts at `start` (a piece boundary, before the end of
    /// `text`), or None when it depends on a character outside ASCII.
    #[inline]
    pub fn piece(self, text: &[u8], start: usize) -> Option<usize> {
        let rules = match self {
            Scanner::DeepSeekV3 => return deepseek_v3_piece(text, start),
            Scanner::Numbers if class(text, start)? == Class::Digit => {
                let mut end = start + 1;
                while end < start + 3 && class(text, end)? == Class::Digit {
                    end += 1;
                }
                return Some(end);
            }
            // The text between matches: up to a digit, or to the end.
            Scanner::Numbers => return run(text, start, |c| c != Class::Digit && c != Class::End),
            Scanner::Cjk => return run(text, start, |c| c != Class::End),
            Scanner::O200k => Rules {
                contractions: Contractions::Suffix,
                cased: true,
                digits: 3,
                slash_tail: true,
            },
            Scanner::Llama3 => Rules {
                contractions: Contractions::First,
                cased: false,
                digits: 3,
                slash_tail: false,
            },
            Scanner::Qwen2 => Rules {
                contractions: Contractions::First,
                cased: false,
                digits: 1,
                slash_tail: false,
            },
            Scanner::Tekken => Rules {
                contractions: Contractions::None,
                cased: true,
                digits: 1,
                slash_tail: true,
            },
        };
        words_piece(rules, text, start)
    }
}

/// The class of `text[start + 1]` if `want` accepts it: the optional leading character
/// of a word or of a punctuation run.
#[inline]
fn lead(text: &[u8], start: usize, want: impl Fn(Class) -> bool) -> Option<Option<usize>> {
    let next = class(text, start + 1)?;
    Some(want(next).then_some(start + 1))
}

/// The tiktoken-style patterns' alternatives, first match wins:
///
/// 1. (Llama 3, Qwen) `(?i:'s|'t|'re|'ve|'m|'ll|'d)`;
/// 2. words: `[^\r\n\p{L}\p{N}]?\p{L}+` (Llama 3, Qwen), or (o200k, tekken)
///    `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+` and
///    `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*`: in
///    ASCII an optional leading character, upper-case letters, then lower-case ones;
///    o200k follows each with an optional contraction;
/// 3. `\p{N}{1,3}` or `\p{N}`;
/// 4. ` ?[^\s\p{L}\p{N}]+[\r\n]*` (o200k and tekken: `[\r\n/]*`);
/// 5. `\s*[\r\n]+`: whitespace up to its last newline;
/// 6. `\s+$`, `\s+(?!\S)` (a run but its last character), `\s+`.
fn words_piece(rules: Rules, text: &[u8], start: usize) -> Option<usize> {
    use Class::*;
    let first = class(text, start)?;
    if rules.contractions == Contractions::First && text[start] == b'\'' {
        let end = contraction(text, start)?;
        if end > start {
            return Some(end);
        }
    }
    let word = match first {
        Upper | Lower => Some(start),
        Space | Punct | Control => lead(text, start, is_letter)?,
        _ => None,
    };
    if let Some(at) = word {
        let end = if rules.cased {
            let upper = run(text, at, |c| c == Upper)?;
            run(text, upper, |c| c == Lower)?
        } else {
            run(text, at, is_letter)?
        };
        return match rules.contractions {
            Contractions::Suffix => contraction(text, end),
            _ => Some(end),
        };
    }
    if first == Digit {
        let mut end = start + 1;
        while end < start + rules.digits && class(text, end)? == Digit {
            end += 1;
        }
        return Some(end);
    }
    let other = |c| matches!(c, Punct | Control);
    let punctuation = match first {
        Punct | Control => Some(start),
        Space if text[start] == b' ' => lead(text, start, other)?,
        _ => None,
    };
    if let Some(at) = punctuation {
        let mut end = run(text, at, other)?;
        while matches!(text.get(end), Some(b'\r' | b'\n'))
            || (rules.slash_tail && text.get(end) == Some(&b'/'))
        {
            end += 1;
        }
        return Some(end);
    }
    whitespace(text, start)
}

/// The whitespace alternatives from `start`, a whitespace character: `\s*[\r\n]+`
/// (whitespace up to its last newline), `\s+$`, `\s+(?!\S)` (a run but its last
/// character), `\s+`.
#[inline]
fn whitespace(text: &[u8], start: usize) -> Option<usize> {
    let mut end = start;
    let mut after_newline = None;
    loop {
        match class(text, end)? {
            Class::Space => end += 1,
            Class::Newline => {
                end += 1;
                after_newline = Some(end);
            }
            _ => break,
        }
    }
    Some(match after_newline {
        Some(at) => at,
        None if end == text.len() || end - start == 1 => end,
        None => end - 1,
    })
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at `end`, in ASCII (`ſ` also matches `(?i:s)`, so a
/// byte outside ASCII there is undecided).
#[inline]
fn contraction(text: &[u8], end: usize) -> Option<usize> {
    if text.get(end) != Some(&b'\'') {
        return Some(end);
    }
    let lower = |i: usize| -> Option<Option<u8>> {
        match text.get(i) {
            None => Some(None),
            Some(&b) if b >= 0x80 => None,
            Some(&b) => Some(Some(b.to_ascii_lowercase())),
        }
    };
    Some(match lower(end + 1)? {
        Some(b's' | b't' | b'm' | b'd') => end + 2,
        Some(c @ (b'r' | b'v' | b'l')) => {
            let want = if c == b'l' { b'l' } else { b'e' };
            if lower(end + 2)? == Some(want) {
                end + 3
            } else {
                end
            }
        }
        _ => end,
    })
}

/// DeepSeek V3's third split stage, alternatives in order:
///
/// 1. `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+`: one ASCII punctuation character
///    and ASCII letters (a byte outside ASCII ends the run: it is no `[A-Za-z]`);
/// 2. `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+`: a word after at most one space, control
///    character or digit;
/// 3. ` ?[\p{P}\p{S}]+[\r\n]*`;
/// 4. `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
///
/// What none of them matches (control characters and digits not before a letter) is a
/// gap piece up to the next match.
fn deepseek_v3_piece(text: &[u8], start: usize) -> Option<usize> {
    use Class::*;
    let first = class(text, start)?;
    if first == Punct && class(text, start + 1).is_some_and(is_letter) {
        // A byte outside ASCII ends the run: it is no `[A-Za-z]`.
        let mut end = start + 2;
        while text.get(end).is_some_and(u8::is_ascii_alphabetic) {
            end += 1;
        }
        return Some(end);
    }
    let word = match first {
        Upper | Lower => Some(start),
        Space | Control | Digit => lead(text, start, is_letter)?,
        _ => None,
    };
    if let Some(at) = word {
        return run(text, at, is_letter);
    }
    let punctuation = match first {
        Punct => Some(start),
        Space if text[start] == b' ' => lead(text, start, |c| c == Punct)?,
        _ => None,
    };
    if let Some(at) = punctuation {
        let mut end = run(text, at, |c| c == Punct)?;
        while matches!(text.get(end), Some(b'\r' | b'\n')) {
            end += 1;
        }
        return Some(end);
    }
    if matches!(first, Space | Newline) {
        return whitespace(text, start);
    }
    // A gap: control characters and digits, up to one that leads a word.
    let mut end = start + 1;
    loop {
        match class(text, end)? {
            Control | Digit if !is_letter(class(text, end + 1)?) => end += 1,
            _ => return Some(end),
        }
    }
}

/// Every pattern with a scanner.
pub const SCANNED: [&str; 7] = [
    O200K,
    LLAMA3,
    QWEN2,
    TEKKEN,
    DEEPSEEK_V3[0],
    DEEPSEEK_V3[1],
    DEEPSEEK_V3[2],
];

/// Each scanned pattern with its split with the scanner and by the regex alone: what the
/// tests and the `split_scanners` fuzz target compare.
pub fn checked_splits() -> Vec<(&'static str, PreTokenizer, PreTokenizer)> {
    let split = |split: Result<RegexSplit>| {
        PreTokenizer::Regex(Arc::new(RegexSplits {
            stages: vec![split.expect("the scanned patterns compile")],
        }))
    };
    SCANNED
        .iter()
        .map(|p| {
            (
                *p,
                split(RegexSplit::new(p, Behavior::Isolated)),
                split(RegexSplit::without_scanner(p, Behavior::Isolated)),
            )
        })
        .collect()
}

/// Characters that steer the patterns: every ASCII class, the contractions, and outside
/// ASCII letters of each case class, a long s (`(?i:s)`), marks, digits, whitespace,
/// punctuation, symbols and CJK (what the proptests of the splits draw texts from).
#[cfg(test)]
pub(crate) const ALPHABET: &[&str] = &[
    "a", "z", "A", "Z", "s", "t", "r", "e", "v", "l", "m", "d", "S", "T", "R", "E", "V", "L", "M", "D", "'",
    "'s", "'LL", "'rE", "'ve", "0", "7", "1234", " ", "  ", "\t", "\n", "\r", "\u{b}", "\u{c}", "/", "(",
    ".", "_", "-", "\u{0}", "\u{1f}", "\u{7f}", "é", "É", "ſ", "ǅ", "ʰ", "中", "の", "\u{301}", "²", "½",
    "١", "\u{85}", "\u{a0}", "\u{2028}", "\u{3000}", "€", "«", "😀",
];

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use proptest::prelude::*;

    use super::*;
    use crate::tokenizer::pretokenizer::GPT2;

    static SPLITS: LazyLock<Vec<(&str, PreTokenizer, PreTokenizer)>> = LazyLock::new(checked_splits);

    fn pieces<'a>(pre: &PreTokenizer, text: &'a str) -> Vec<&'a str> {
        let mut out = Vec::new();
        pre.split(text, 0..text.len(), &mut |r| out.push(&text[r]));
        out
    }

    /// The scanned and the regex pieces of `text` for each pattern.
    fn both(text: &str) -> impl Iterator<Item = (&'static str, Vec<&str>, Vec<&str>)> {
        SPLITS
            .iter()
            .map(move |(p, scanned, regex)| (*p, pieces(scanned, text), pieces(regex, text)))
    }

    #[test]
    fn every_pattern_has_its_scanner() {
        for pattern in SCANNED {
            assert!(Scanner::for_pattern(pattern).is_some(), "{pattern}");
        }
        assert_eq!(Scanner::for_pattern(GPT2), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        #[test]
        fn scanners_find_the_regex_pieces(
            parts in proptest::collection::vec(proptest::sample::select(ALPHABET), 0..40)
        ) {
            let text = parts.concat();
            for (pattern, scanned, regex) in both(&text) {
                prop_assert_eq!(scanned, regex, "{}", pattern);
            }
        }
    }

    #[test]
    fn scanners_find_the_regex_pieces_of_code_and_prose() {
        let text = concat!(
            "fn main() {\n    let x = \"It's a dog's LIFE\";\r\n\tprintln!(\"{x}\");\n}\n\n",
            "  // We'RE here, they'll see; you'VE 12345 items/sec -> 3.14159\n",
            "HTTPServer's URLs: https://example.com/a/b?c=d&e=f  \n\n\n   end   ",
            "\u{1}\u{2}x 7y _foo.bar(\u{7f}) 中文12の ",
            "naïve café CAFÉ ſ'ſ Don'ſ x²+y½ \u{a0}\u{3000}tail\u{85}",
        );
        for cut in (0..text.len()).filter(|&c| text.is_char_boundary(c)) {
            let tail = &text[cut..];
            for (pattern, scanned, regex) in both(tail) {
                assert_eq!(scanned, regex, "{pattern} {tail:?}");
            }
        }
    }
}
