//! Pre-tokenizers: the split of text into pieces that BPE then encodes one at a time.
//!
//! Two kinds. [`RegexSplits`]: a sequence of regex splits, each piece of one stage split
//! again by the next, matches and the text between them kept as pieces (Hugging Face's
//! `Split` with `Isolated` or `MergedWithPrevious`, llama.cpp's `regex_exprs`): Llama 3,
//! Qwen2/3, DeepSeek V3, Mistral tekken. The one construct the regex engine lacks,
//! `\s+(?!\S)`, is rewritten as bpe-openai does (a pattern `\s+\s` whose last character is
//! given back, and `\s+$`), which finds the same pieces as a backtracking engine.
//! Any other look-around is refused when the vocabulary loads. The splits of these
//! families are decided without the regex where the text is ASCII (`scanner`), the regex
//! answering for each piece whose end depends on a character outside ASCII.
//!
//! And the GPT-2 scanner: llama.cpp does not run the GPT-2 regex through a regex engine: it hand-codes it
//! (`unicode_regex_split_custom_gpt2`), with its own corners (contractions are
//! lowercase ASCII only; a whitespace run is kept whole at the end of a sub-range
//! instead of giving its last character to the next piece). This module mirrors that
//! scanner over byte offsets, in one linear pass. Character classes (`\p{L}`, `\p{N}`,
//! `\s` as Unicode `White_Space`) come from regex-syntax's Unicode tables, the same
//! definitions llama.cpp generated its tables from.
//!
//! It owns only the split; vocabularies, merges and special tokens live in `bpe_model`.

use std::ops::Range;
use std::sync::{Arc, LazyLock};

use regex_automata::meta::Regex;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Class, HirKind};

use super::scanner::Scanner;
use crate::error::{Code, Error, Result};

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

/// How a vocabulary splits text before BPE.
#[derive(Debug, Clone)]
pub enum PreTokenizer {
    /// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
    Gpt2,
    /// Every `\p{N}` character on its own, then GPT-2 on the rest (SmolLM, StarCoder,
    /// Refact, Command-R, ...).
    DigitsThenGpt2,
    /// A sequence of regex splits (Llama 3, Qwen, DeepSeek, tekken, ...).
    Regex(Arc<RegexSplits>),
    /// No split: the text is one piece (SentencePiece-style vocabularies, which cut it
    /// themselves where no token can span; see `bpe_model`).
    Whole,
    /// A piece starts at every space (Hugging Face `Metaspace` with `split`, on text whose
    /// `▁` are spaces).
    BeforeSpaces,
}

/// Llama 3's split (also cl100k_base's): three-digit number groups.
pub const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's (Hugging Face `ByteLevel` with `use_regex`).
pub const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Qwen2 / Qwen2.5 / Qwen3: Llama 3's with single digits.
pub const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: Qwen2's with combining marks inside words.
pub const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// DeepSeek V3 / R1: digits in threes, CJK runs, then words and punctuation.
pub const DEEPSEEK_V3: [&str; 3] = [
    r"\p{N}{1,3}",
    "[\u{4e00}-\u{9fa5}\u{3040}-\u{309f}\u{30a0}-\u{30ff}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
/// Mistral tekken (as `mistral-common` and tiktoken run it).
pub const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Falcon, as llama.cpp splits it.
pub const FALCON: [&str; 3] = [
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
];
/// DeepSeek LLM (v1/v2) and DeepSeek Coder, as llama.cpp splits them.
pub const DEEPSEEK_LLM: [&str; 6] = [
    "[\r\n]",
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}+",
];
pub const DEEPSEEK_CODER: [&str; 5] = [
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}",
];

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for a GGUF `tokenizer.ggml.pre` value; None for
    /// a name it does not know or a split we do not reproduce.
    pub fn from_llama_pre(pre: &str) -> Result<Option<Self>> {
        let splits = |patterns: &[&str]| -> Result<Option<Self>> {
            let stages = patterns
                .iter()
                .map(|p| RegexSplit::new(p, Behavior::Isolated))
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(PreTokenizer::Regex(Arc::new(RegexSplits { stages }))))
        };
        match pre {
            "gpt-2" | "gpt2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" | "phi-2" => {
                Ok(Some(PreTokenizer::Gpt2))
            }
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b" => {
                Ok(Some(PreTokenizer::DigitsThenGpt2))
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe"
            | "chatglm-bpe" => splits(&[LLAMA3]),
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" => splits(&[QWEN2]),
            "qwen35" => splits(&[QWEN35]),
            "deepseek-v3" => splits(&DEEPSEEK_V3),
            "deepseek-llm" => splits(&DEEPSEEK_LLM),
            "deepseek-coder" => splits(&DEEPSEEK_CODER),
            "falcon" => splits(&FALCON),
            "tekken" => splits(&[TEKKEN]),
            _ => Ok(None),
        }
    }

    /// True when a line start (a byte after `\n` that is ASCII and not whitespace) always
    /// begins a piece, and the pieces of the text before it do not depend on the text
    /// after it: the splits whose every stage is scanned (Llama 3, Qwen2/3, DeepSeek V3,
    /// tekken). Their patterns look behind nothing, and every alternative that can take a
    /// `\n` takes what follows it only if it is whitespace (`\s*[\r\n]+`), another newline
    /// or, after punctuation, a `/` (`[\r\n/]*`): a text cut there splits, part by part,
    /// into the pieces of the whole ([`line_cut`], the `line_cuts` fuzz target).
    pub fn cuts_at_lines(&self) -> bool {
        match self {
            PreTokenizer::Regex(splits) => splits
                .stages
                .iter()
                .all(|s| s.scanner.is_some() && s.behavior == Behavior::Isolated),
            _ => false,
        }
    }

    /// True when a text cut at a line start splits, part by part, into the pieces of the
    /// whole with the cut as one more boundary: the splits that [`Self::cuts_at_lines`],
    /// no split at all, and splits at a character (spaces). What a SentencePiece
    /// vocabulary, where no token spans a line start, needs to encode in parts.
    pub fn splits_alike_in_line_parts(&self) -> bool {
        match self {
            PreTokenizer::Whole | PreTokenizer::BeforeSpaces => true,
            PreTokenizer::Regex(splits) => self.cuts_at_lines() || splits.stages.iter().all(|s| s.one_char),
            PreTokenizer::Gpt2 | PreTokenizer::DigitsThenGpt2 => false,
        }
    }

    /// Call `out` with the byte range of each piece of `text[range]`, in order (a
    /// callback, not a vector: a 1 MB text has ~300k pieces, and streaming them keeps
    /// the working set in cache).
    pub fn split(&self, text: &str, range: Range<usize>, out: &mut impl FnMut(Range<usize>)) {
        match self {
            PreTokenizer::Regex(splits) => splits.split(text, range, out),
            PreTokenizer::Whole => {
                if !range.is_empty() {
                    out(range)
                }
            }
            PreTokenizer::BeforeSpaces => {
                let mut start = range.start;
                for at in memchr::memchr_iter(b' ', &text.as_bytes()[range.clone()]) {
                    let at = range.start + at;
                    if at > start {
                        out(start..at);
                        start = at;
                    }
                }
                if start < range.end {
                    out(start..range.end);
                }
            }
            PreTokenizer::Gpt2 => split_gpt2(text, range, out),
            PreTokenizer::DigitsThenGpt2 => {
                let mut run = range.start;
                for (i, c) in text[range.clone()].char_indices() {
                    if flags(c) & NUMBER != 0 {
                        let at = range.start + i;
                        split_gpt2(text, run..at, out);
                        out(at..at + c.len_utf8());
                        run = at + c.len_utf8();
                    }
                }
                split_gpt2(text, run..range.end, out);
            }
        }
    }
}

/// What a `Split` stage does with a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    /// The match is a piece of its own (the text between matches too).
    Isolated,
    /// The match ends the piece before it.
    MergedWithPrevious,
}

/// One split stage: a regex compiled as several patterns in priority order, with the
/// patterns whose last character is a look-ahead marked (it is given back).
#[derive(Debug)]
pub struct RegexSplit {
    regex: Regex,
    lookahead: Vec<bool>,
    behavior: Behavior,
    /// Decides pieces without the regex where the text is ASCII (`Isolated` splits by a
    /// pattern [`Scanner::for_pattern`] knows).
    scanner: Option<Scanner>,
    /// The pattern is one literal character (Gemma's split on spaces): a match depends on
    /// nothing around it.
    one_char: bool,
}

/// `\s+(?!\S)`, as a top-level alternative: the only look-around we rewrite.
const WHITESPACE_LOOKAHEAD: &str = r"\s+(?!\S)";

impl RegexSplit {
    /// Compile `pattern` (Oniguruma / PCRE syntax as tokenizer.json and llama.cpp write it).
    pub fn new(pattern: &str, behavior: Behavior) -> Result<Self> {
        let mut split = Self::without_scanner(pattern, behavior)?;
        if behavior == Behavior::Isolated {
            split.scanner = Scanner::for_pattern(pattern);
        }
        Ok(split)
    }

    /// The split by the regex alone (what the scanners are checked against).
    pub fn without_scanner(pattern: &str, behavior: Behavior) -> Result<Self> {
        let alternatives = top_level_alternatives(pattern);
        let mut patterns: Vec<(String, bool)> = Vec::new();
        let mut head: Vec<&str> = Vec::new();
        let mut rest = alternatives.as_slice();
        while let Some((first, tail)) = rest.split_first() {
            rest = tail;
            if *first != WHITESPACE_LOOKAHEAD {
                head.push(first);
                continue;
            }
            // `\s+(?!\S)`: at the end of the text, the whole run (`\s+$`, same priority);
            // before other text, the run less its last character (`\s+\s`, one given back).
            // A run of one before other text fails here, as it does in a backtracking engine.
            head.push(r"\s+$");
            patterns.push((head.join("|"), false));
            head.clear();
            patterns.push((r"\s+\s".to_owned(), true));
        }
        if !head.is_empty() {
            patterns.push((head.join("|"), false));
        }
        let (sources, lookahead): (Vec<String>, Vec<bool>) = patterns.into_iter().unzip();
        let regex = Regex::new_many(&sources).map_err(|e| {
            Error::new(
                Code::InvalidVocabulary,
                format!(
                    "pre-tokenizer regex {pattern:?} is not supported: {}",
                    e.syntax_error()
                        .map_or_else(|| e.to_string(), ToString::to_string)
                ),
            )
        })?;
        Ok(RegexSplit {
            regex,
            lookahead,
            behavior,
            scanner: None,
            one_char: false,
        })
    }

    /// A literal string split (tokenizer.json `Split` with a `String` pattern).
    pub fn literal(text: &str, behavior: Behavior) -> Result<Self> {
        let mut split = Self::new(&regex_syntax::escape(text), behavior)?;
        split.one_char = text.chars().count() == 1;
        Ok(split)
    }

    /// The first match in `hay` at or after `at` that is not empty once a look-ahead
    /// pattern gave its last character back: (start, end).
    #[inline]
    fn next_match(&self, hay: &str, mut at: usize) -> Option<(usize, usize)> {
        while at < hay.len() {
            // These regexes match at almost every position: an anchored search (no scan
            // for a start) finds the next piece; only a gap takes the unanchored search.
            let input = Input::new(hay).range(at..);
            let m = self
                .regex
                .search(&input.clone().anchored(Anchored::Yes))
                .or_else(|| self.regex.search(&input))?;
            let mut end = m.end();
            if self.lookahead[m.pattern().as_usize()] {
                end -= hay[..end].chars().next_back().map_or(0, char::len_utf8);
            }
            if end > m.start() {
                return Some((m.start(), end));
            }
            // Empty matches cut nothing.
            at = m.start() + hay[m.start()..].chars().next().map_or(1, char::len_utf8);
        }
        None
    }

    fn split(&self, text: &str, range: Range<usize>, out: &mut dyn FnMut(Range<usize>)) {
        let hay = &text[range.clone()];
        let base = range.start;
        if let Some(scanner) = self.scanner {
            return Self::split_scanned(scanner, hay, base, out, |at| self.next_match(hay, at));
        }
        let mut at = 0;
        while let Some((start, end)) = self.next_match(hay, at) {
            match self.behavior {
                Behavior::Isolated => {
                    if start > at {
                        out(base + at..base + start);
                    }
                    out(base + start..base + end);
                }
                Behavior::MergedWithPrevious => out(base + at..base + end),
            }
            at = end;
        }
        if at < hay.len() {
            out(base + at..base + hay.len());
        }
    }

    /// An `Isolated` split, piece by piece: the scanner's answer where it has one, else
    /// the piece the regex finds from there (a match, or the gap before the next one).
    fn split_scanned(
        scanner: Scanner,
        hay: &str,
        base: usize,
        out: &mut dyn FnMut(Range<usize>),
        next_match: impl Fn(usize) -> Option<(usize, usize)>,
    ) {
        let bytes = hay.as_bytes();
        let mut at = 0;
        while at < hay.len() {
            let end = match scanner.piece(bytes, at) {
                Some(end) => end,
                None => match next_match(at) {
                    Some((start, end)) if start == at => end,
                    Some((start, _)) => start,
                    None => hay.len(),
                },
            };
            out(base + at..base + end);
            at = end;
        }
    }
}

/// A byte that begins a line part after a `\n` ([`line_cut`]): ASCII, not whitespace
/// and not `/`.
pub fn begins_line_part(b: u8) -> bool {
    b.is_ascii_graphic() && b != b'/'
}

/// True when `bytes` hold a newline and a byte that [`begins_line_part`] after it: a
/// token that would reach across a line cut.
pub fn spans_line_start(bytes: &[u8]) -> bool {
    bytes.windows(2).any(|w| w[0] == b'\n' && begins_line_part(w[1]))
}

/// The first line start at or after `from`: a byte after `\n` that [`begins_line_part`]
/// (where [`PreTokenizer::cuts_at_lines`] splits always cut).
pub fn line_cut(text: &[u8], from: usize) -> Option<usize> {
    let mut at = from.max(1);
    while at < text.len() {
        let newline = at - 1 + memchr::memchr(b'\n', &text[at - 1..])?;
        let cut = newline + 1;
        if text.get(cut).is_some_and(|&b| begins_line_part(b)) {
            return Some(cut);
        }
        at = cut + 1;
    }
    None
}

/// Assert that `text` cut at each of its line starts splits, part by part, into the
/// pieces of the whole (`pieces` gives a text's pieces): the property
/// [`PreTokenizer::cuts_at_lines`] claims, checked by tests and the `line_cuts` fuzz target.
pub fn assert_line_cuts_exact<'a>(pieces: impl Fn(&'a str) -> Vec<&'a str>, text: &'a str) {
    let whole = pieces(text);
    let mut at = 0;
    while let Some(cut) = line_cut(text.as_bytes(), at + 1) {
        let mut parts = pieces(&text[..cut]);
        parts.extend(pieces(&text[cut..]));
        assert_eq!(parts, whole, "cut at {cut} of {text:?}");
        at = cut;
    }
}

/// The top-level `|`-separated alternatives of a regex (not inside groups or classes).
fn top_level_alternatives(pattern: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut in_class, mut escaped, mut start) = (0i32, false, false, 0);
    for (i, c) in pattern.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '[' if !in_class => in_class = true,
            ']' if in_class => in_class = false,
            '(' if !in_class => depth += 1,
            ')' if !in_class => depth -= 1,
            '|' if !in_class && depth == 0 => {
                out.push(&pattern[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&pattern[start..]);
    out
}

/// A sequence of split stages: each piece of one stage is split by the next.
#[derive(Debug)]
pub struct RegexSplits {
    pub stages: Vec<RegexSplit>,
}

impl RegexSplits {
    fn split(&self, text: &str, range: Range<usize>, out: &mut impl FnMut(Range<usize>)) {
        fn stage(stages: &[RegexSplit], text: &str, range: Range<usize>, out: &mut dyn FnMut(Range<usize>)) {
            match stages.split_first() {
                None => out(range),
                Some((first, rest)) => first.split(text, range, &mut |r| stage(rest, text, r, out)),
            }
        }
        stage(&self.stages, text, range, out);
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
fn split_gpt2(text: &str, range: Range<usize>, out: &mut impl FnMut(Range<usize>)) {
    let end = range.end;
    let mut pos = range.start;
    while pos < end {
        let start = pos;
        let c = char_at(text, pos, end).expect("pos < end is a char boundary");

        if c == '\'' {
            let next = char_at(text, pos + 1, end);
            if matches!(next, Some('s' | 't' | 'm' | 'd')) {
                pos += 2;
                out(start..pos);
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
                out(start..pos);
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
            out(start..pos);
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
        out(start..pos);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::Strategy;

    use super::*;

    fn pieces<'a>(pre: &PreTokenizer, text: &'a str) -> Vec<&'a str> {
        let mut out = Vec::new();
        pre.split(text, 0..text.len(), &mut |r| out.push(&text[r]));
        out
    }

    #[test]
    fn gpt2_words_spaces_and_contractions() {
        let p = PreTokenizer::Gpt2;
        assert_eq!(pieces(&p, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(&p, "don't  stop"), ["don", "'t", " ", " stop"]);
        assert_eq!(pieces(&p, "DON'T"), ["DON", "'", "T"]);
        assert_eq!(pieces(&p, "a  \n"), ["a", "  \n"]);
        assert_eq!(pieces(&p, "x = 12;"), ["x", " =", " 12", ";"]);
        assert_eq!(pieces(&p, "  \tb"), ["  ", "\t", "b"]);
    }

    #[test]
    fn digits_split_before_gpt2() {
        let p = PreTokenizer::DigitsThenGpt2;
        assert_eq!(pieces(&p, "abc 123"), ["abc", " ", "1", "2", "3"]);
        assert_eq!(pieces(&p, "v2.0  x"), ["v", "2", ".", "0", " ", " x"]);
        assert_eq!(pieces(&p, "a   1"), ["a", "   ", "1"]);
    }

    #[test]
    fn pieces_cover_the_text() {
        let text = "Größe: 10€ — 東京 🙂 'll\r\n\n  end ";
        for p in [PreTokenizer::Gpt2, PreTokenizer::DigitsThenGpt2] {
            assert_eq!(pieces(&p, text).concat(), text);
        }
        for name in [
            "llama-bpe",
            "qwen2",
            "deepseek-v3",
            "tekken",
            "deepseek-llm",
            "deepseek-coder",
        ] {
            let p = PreTokenizer::from_llama_pre(name).unwrap().unwrap();
            assert_eq!(pieces(&p, text).concat(), text, "{name}");
        }
    }

    #[test]
    fn whitespace_lookahead_gives_back_one_character() {
        let p = PreTokenizer::from_llama_pre("llama-bpe").unwrap().unwrap();
        assert_eq!(pieces(&p, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(&p, "a   "), ["a", "   "]);
        assert_eq!(pieces(&p, "a \tb"), ["a", " ", "\tb"]);
        assert_eq!(pieces(&p, "x  \n\n y"), ["x", "  \n\n", " y"]);
        assert_eq!(pieces(&p, "12345 don't"), ["123", "45", " don", "'t"]);
        // GPT-2's regex ends with the look-ahead alternative: no `\s+` after it.
        let gpt2 = PreTokenizer::Regex(Arc::new(RegexSplits {
            stages: vec![RegexSplit::new(GPT2, Behavior::Isolated).unwrap()],
        }));
        assert_eq!(
            pieces(&gpt2, "a  b\t\tc "),
            ["a", " ", " b", "\t", "\t", "c", " "]
        );
    }

    #[test]
    fn merged_with_previous_ends_pieces_at_matches() {
        let split = RegexSplit::literal(" ", Behavior::MergedWithPrevious).unwrap();
        let text = "a b  c";
        let mut out = Vec::new();
        split.split(text, 0..text.len(), &mut |r| out.push(&text[r]));
        assert_eq!(out, ["a ", "b ", " ", "c"]);
    }

    /// Texts of lines that start with each kind of character, after each kind of line end.
    fn lines() -> impl Strategy<Value = String> {
        let line = proptest::sample::select(
            &[
                "x", "Ab", "'s", "'ll", "12345", "{", "}", "/", "//c", "#!", "  ", "\t", "é", "中", "٣",
                "\u{1}", " y", "a\r", "a/", "}/", "\r", "\u{a0}", "\u{301}", "\u{85}",
            ][..],
        );
        proptest::collection::vec(proptest::collection::vec(line, 0..4), 0..8)
            .prop_map(|lines| lines.iter().map(|l| l.concat()).collect::<Vec<_>>().join("\n"))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        #[test]
        fn splits_cut_at_line_starts_find_the_pieces_of_the_whole(text in lines()) {
            for name in ["llama-bpe", "qwen2", "deepseek-v3", "tekken"] {
                let p = PreTokenizer::from_llama_pre(name).unwrap().unwrap();
                assert!(p.cuts_at_lines(), "{name}");
                assert_line_cuts_exact(|t| pieces(&p, t), &text);
            }
        }
    }

    #[test]
    fn only_scanned_splits_cut_at_line_starts() {
        for name in ["gpt2", "qwen35", "deepseek-llm", "falcon"] {
            assert!(
                !PreTokenizer::from_llama_pre(name)
                    .unwrap()
                    .unwrap()
                    .cuts_at_lines(),
                "{name}"
            );
        }
        assert_eq!(line_cut(b"a\n b\n/\nc", 0), Some(7));
        assert_eq!(line_cut(b"a\nb", 3), None);
    }

    #[test]
    fn unsupported_look_around_is_refused() {
        let err = RegexSplit::new(r"(?=a)b", Behavior::Isolated).unwrap_err();
        assert_eq!(err.code, Code::InvalidVocabulary);
    }
}
