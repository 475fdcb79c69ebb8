//! [`PromptBody`]: a token-id prompt written as the JSON array an upstream's request
//! body carries (vLLM's `prompt`, SGLang's `input_ids`, llama.cpp's `prompt`), straight
//! from the ids the cache holds.
//!
//! A conversation's prompt grows by a few thousand ids a turn behind a prefix of tens of
//! thousands that the previous turn already sent. The writer keeps the previous prompt
//! (sharing its chunks: no copy) and the byte offset in its array of every `MARK`-th id;
//! the next prompt keeps the bytes of the prefix the two share, up to the last mark
//! inside it, and writes only the ids after it. The caller holds the array's bytes (the
//! request body it sends, rewritten in place): a turn costs its new ids, never a copy
//! of the history's, nor a Python int per id.

use crate::prompt_chain::Prompt;

/// Ids between two remembered byte offsets: a changed id costs at most this many
/// rewritten ids before it.
const MARK: usize = 128;

#[derive(Default)]
pub struct PromptBody {
    /// The prompt the caller's array holds.
    prompt: Prompt,
    /// The array's length: `[` then the ids, comma-separated, without the closing bracket.
    len: usize,
    /// `marks[k]`: the array's length before id `k * MARK` (and its comma) was written.
    marks: Vec<usize>,
}

impl PromptBody {
    /// Brings the caller's array (the last call's, or empty) up to `prompt`: returns how
    /// many of its leading bytes stay, and the bytes that replace the rest (the array
    /// without its closing `]`, which the caller writes with the rest of the body). The
    /// new bytes are the caller's to drop: the first write of a long prompt is all of it.
    pub fn update(&mut self, prompt: &Prompt) -> (usize, Vec<u8>) {
        let shared = prompt.common_prefix_len(&self.prompt);
        let keep = shared / MARK;
        if keep < self.marks.len() {
            self.len = self.marks[keep];
            self.marks.truncate(keep);
        }
        let kept = self.len;
        let mut written = Vec::new();
        if kept == 0 {
            written.push(b'[');
        }
        let mut index = self.marks.len() * MARK;
        // Up to 10 digits and a comma an id; o200k's ids take 6-7.
        written.reserve(prompt.len().saturating_sub(index) * 7);
        let marks = &mut self.marks;
        prompt
            .tokens
            .for_each_slice(index, prompt.len(), &mut |ids: &[u32]| {
                for &id in ids {
                    if index.is_multiple_of(MARK) {
                        marks.push(kept + written.len());
                    }
                    if index > 0 {
                        written.push(b',');
                    }
                    write_decimal(&mut written, id);
                    index += 1;
                }
            });
        self.len = kept + written.len();
        self.prompt = prompt.clone();
        (kept, written)
    }
}

/// `value` in decimal, appended to `out`.
fn write_decimal(out: &mut Vec<u8>, mut value: u32) {
    let mut digits = [0u8; 10];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The caller's side: `json` (the last array) brought up to `prompt`.
    fn apply(body: &mut PromptBody, json: &mut Vec<u8>, prompt: &Prompt) -> usize {
        let (kept, written) = body.update(prompt);
        json.truncate(kept);
        json.extend_from_slice(&written);
        kept
    }

    fn array(body: &mut PromptBody, json: &mut Vec<u8>, ids: &[u32]) -> String {
        apply(body, json, &Prompt::from_tokens(ids));
        String::from_utf8(json.clone()).unwrap() + "]"
    }

    fn expected(ids: &[u32]) -> String {
        serde_json::to_string(ids).unwrap()
    }

    #[test]
    fn writes_the_ids_as_json() {
        let (mut body, mut json) = (PromptBody::default(), Vec::new());
        assert_eq!(array(&mut body, &mut json, &[]), "[]");
        let ids = [0, 7, 10, 99, 100, 200_012, u32::MAX];
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
    }

    #[test]
    fn a_grown_prompt_equals_a_fresh_write() {
        let (mut body, mut json) = (PromptBody::default(), Vec::new());
        let mut ids: Vec<u32> = (0..1000).map(|i| i * 37 % 5000).collect();
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
        // Grown past several marks, then exactly to a mark boundary.
        ids.extend((0..300).map(|i| i * 11));
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
        ids.truncate(1280);
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
        ids.push(5);
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
    }

    #[test]
    fn a_changed_prefix_is_rewritten() {
        let (mut body, mut json) = (PromptBody::default(), Vec::new());
        let mut ids: Vec<u32> = (0..700).collect();
        array(&mut body, &mut json, &ids);
        ids[300] = 123_456;
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
        ids[0] = 9;
        ids.truncate(10);
        assert_eq!(array(&mut body, &mut json, &ids), expected(&ids));
    }

    #[test]
    fn a_prompt_sharing_chunks_keeps_the_prefix() {
        let (mut body, mut json) = (PromptBody::default(), Vec::new());
        let first = Prompt::from_tokens(&(0..1000).collect::<Vec<u32>>());
        let mut tokens = first.tokens.clone();
        tokens.extend_from_slice(&[1, 2, 3]);
        let second = Prompt { tokens };
        apply(&mut body, &mut json, &first);
        let marks = body.marks.clone();
        let before = json.clone();
        let kept = apply(&mut body, &mut json, &second);
        // Only the ids after the last full mark were rewritten.
        assert_eq!(kept, marks[1000 / MARK]);
        assert_eq!(json[..kept], before[..kept]);
        assert_eq!(&body.marks[..marks.len() - 1], &marks[..marks.len() - 1]);
        let mut ids: Vec<u32> = (0..1000).collect();
        ids.extend([1, 2, 3]);
        assert_eq!(String::from_utf8(json).unwrap() + "]", expected(&ids));
    }
}
