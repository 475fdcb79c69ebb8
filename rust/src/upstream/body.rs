//! [`PromptBody`]: a token-id prompt written as the JSON array an upstream's request
//! body carries (vLLM's `prompt`, SGLang's `input_ids`, llama.cpp's `prompt`), straight
//! from the ids the cache holds.
//!
//! A conversation's prompt grows by a few thousand ids a turn behind a prefix of tens of
//! thousands that the previous turn already sent. The writer keeps the previous prompt
//! (sharing its chunks: no copy) and the bytes it wrote for it, with the byte offset of
//! every `MARK`-th id; the next prompt keeps the bytes of the prefix the two share, up to
//! the last mark inside it, and writes only the ids after it. A turn costs the new ids,
//! never a Python int per id; [`PromptBody::unchanged`] tells the caller how much of the
//! array it already holds from the previous call, so it copies only the rest.

use crate::conversation::Prompt;

/// Ids between two remembered byte offsets: a changed id costs at most this many
/// rewritten ids before it.
const MARK: usize = 128;

#[derive(Default)]
pub struct PromptBody {
    /// The prompt `json` holds.
    prompt: Prompt,
    /// `[` then the ids, comma-separated, without the closing bracket.
    json: Vec<u8>,
    /// `marks[k]`: the length of `json` before id `k * MARK` (and its comma) was written.
    marks: Vec<usize>,
    /// How many leading bytes of `json` the last [`PromptBody::ids_json`] kept from the
    /// call before it.
    unchanged: usize,
}

impl PromptBody {
    /// The JSON array of `prompt`'s ids, without its closing `]`: the caller writes it
    /// (with the rest of the body) in the same copy.
    pub fn ids_json(&mut self, prompt: &Prompt) -> &[u8] {
        let shared = prompt.common_prefix_len(&self.prompt);
        let keep = shared / MARK;
        if keep < self.marks.len() {
            self.json.truncate(self.marks[keep]);
            self.marks.truncate(keep);
        }
        self.unchanged = self.json.len();
        if self.json.is_empty() {
            self.json.push(b'[');
        }
        let mut index = self.marks.len() * MARK;
        let json = &mut self.json;
        let marks = &mut self.marks;
        prompt
            .tokens
            .for_each_slice(index, prompt.len(), &mut |ids: &[u32]| {
                for &id in ids {
                    if index.is_multiple_of(MARK) {
                        marks.push(json.len());
                    }
                    if index > 0 {
                        json.push(b',');
                    }
                    write_decimal(json, id);
                    index += 1;
                }
            });
        self.prompt = prompt.clone();
        &self.json
    }

    /// How many leading bytes of the last [`PromptBody::ids_json`]'s array are those of
    /// the array before it: a caller keeping its own copy of the array rewrites only
    /// what follows them.
    pub fn unchanged(&self) -> usize {
        self.unchanged
    }

    /// The array the last [`PromptBody::ids_json`] wrote.
    pub fn json(&self) -> &[u8] {
        &self.json
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

    fn array(body: &mut PromptBody, ids: &[u32]) -> String {
        let mut json = body.ids_json(&Prompt::from_tokens(ids)).to_vec();
        json.push(b']');
        String::from_utf8(json).unwrap()
    }

    fn expected(ids: &[u32]) -> String {
        serde_json::to_string(ids).unwrap()
    }

    #[test]
    fn writes_the_ids_as_json() {
        let mut body = PromptBody::default();
        assert_eq!(array(&mut body, &[]), "[]");
        let ids = [0, 7, 10, 99, 100, 200_012, u32::MAX];
        assert_eq!(array(&mut body, &ids), expected(&ids));
    }

    #[test]
    fn a_grown_prompt_equals_a_fresh_write() {
        let mut body = PromptBody::default();
        let mut ids: Vec<u32> = (0..1000).map(|i| i * 37 % 5000).collect();
        assert_eq!(array(&mut body, &ids), expected(&ids));
        // Grown past several marks, then exactly to a mark boundary.
        ids.extend((0..300).map(|i| i * 11));
        assert_eq!(array(&mut body, &ids), expected(&ids));
        ids.truncate(1280);
        assert_eq!(array(&mut body, &ids), expected(&ids));
        ids.push(5);
        assert_eq!(array(&mut body, &ids), expected(&ids));
    }

    #[test]
    fn a_changed_prefix_is_rewritten() {
        let mut body = PromptBody::default();
        let mut ids: Vec<u32> = (0..700).collect();
        array(&mut body, &ids);
        ids[300] = 123_456;
        assert_eq!(array(&mut body, &ids), expected(&ids));
        ids[0] = 9;
        ids.truncate(10);
        assert_eq!(array(&mut body, &ids), expected(&ids));
    }

    #[test]
    fn unchanged_counts_the_bytes_kept_from_the_last_array() {
        let mut body = PromptBody::default();
        let ids: Vec<u32> = (0..1000).collect();
        let first = array(&mut body, &ids);
        assert_eq!(body.unchanged(), 0);
        let mut grown = ids.clone();
        grown.extend([1, 2, 3]);
        let second = array(&mut body, &grown);
        let kept = body.unchanged();
        // The kept bytes are the old array's, up to the last mark inside the shared ids.
        assert_eq!(kept, body.marks[1000 / MARK]);
        assert_eq!(first[..kept], second[..kept]);
        let mut changed = grown.clone();
        changed[5] = 77;
        array(&mut body, &changed);
        assert_eq!(body.unchanged(), 1);
    }

    #[test]
    fn a_prompt_sharing_chunks_keeps_the_prefix() {
        let mut body = PromptBody::default();
        let first = Prompt::from_tokens(&(0..1000).collect::<Vec<u32>>());
        let mut tokens = first.tokens.clone();
        tokens.extend_from_slice(&[1, 2, 3]);
        let second = Prompt { tokens };
        body.ids_json(&first);
        let marks = body.marks.clone();
        let json = body.ids_json(&second).to_vec();
        // Only the ids after the last full mark were rewritten.
        assert_eq!(&body.marks[..marks.len() - 1], &marks[..marks.len() - 1]);
        let mut ids: Vec<u32> = (0..1000).collect();
        ids.extend([1, 2, 3]);
        assert_eq!(String::from_utf8(json).unwrap() + "]", expected(&ids));
    }
}
