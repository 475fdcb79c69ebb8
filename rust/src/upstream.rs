//! The upstream engine's stream decoder: server-sent events from vLLM, SGLang or llama.cpp
//! server in, sampled token ids out, without I/O.
//!
//! [`http::ResponseReader`] takes the raw bytes of each socket read of an HTTP/1.1
//! response (head, chunked or length-delimited body) and hands the body to an
//! [`SseDecoder`], which keeps the incomplete tail, splits the complete lines, parses
//! every `data:` event into a typed, borrowing struct of the dialect (only the fields we
//! read: ids, finish, usage, error, timings, the engine's cached prompt ids; the rest is skipped, never built) and
//! extracts the ids and finish signal, so one read costs one call however many events it
//! holds. Semantics match the dialects' documented shapes: `[DONE]` ends the stream, an
//! `error` object in an event is the server's failure, events after the finishing one are
//! read (so the connection can be reused) but add no ids.

pub mod body;
pub mod http;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The wire dialect whose event shapes the decoder reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// vLLM `/v1/completions` with `return_token_ids`: `choices[0].token_ids` are deltas.
    Vllm,
    /// SGLang `/generate`: `output_ids` cumulative, or deltas with incremental streaming.
    Sglang,
    /// llama.cpp server `/completion` with `return_tokens`: `tokens`, `stop`, `timings`.
    LlamaCpp,
}

impl Dialect {
    pub fn from_name(name: &str) -> Option<Dialect> {
        match name {
            "vllm" => Some(Dialect::Vllm),
            "sglang" => Some(Dialect::Sglang),
            "llamacpp" => Some(Dialect::LlamaCpp),
            _ => None,
        }
    }
}

/// Why a stream cannot go on: the server said so (`Upstream`), or we cannot read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// An `error` object in the stream: the engine's `upstream_error`; another replica
    /// may not fail the same way.
    Upstream(String),
    /// SGLang aborted the request (`finish_reason.type == "abort"`): `upstream_error`,
    /// but the request itself is at fault, so it is not retried elsewhere.
    Aborted(String),
    /// An event we cannot parse: the engine's `upstream_protocol`.
    Protocol(String),
}

/// What the complete events of one read said.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    /// The new sampled ids, in order (none after the finishing event).
    pub ids: Vec<u32>,
    /// A finishing event has been seen (in this read or before).
    pub done: bool,
    /// `data: [DONE]` was seen: the stream is over, nothing after it is read.
    pub ended: bool,
    /// The first failure in this read; `ids` holds what came before it.
    pub error: Option<StreamError>,
}

/// The longest event line a decoder holds by default: more than any event of the
/// dialects (llama.cpp server's last one repeats the prompt's text), far less than what
/// a broken or hostile replica could send without a newline.
pub const DEFAULT_MAX_LINE: usize = 16 << 20;

/// Sans-I/O decoder state for one streamed response.
#[derive(Debug)]
pub struct SseDecoder {
    dialect: Dialect,
    /// The incomplete last line of the reads so far, never more than `max_line` bytes.
    pending: Vec<u8>,
    max_line: usize,
    done: bool,
    ended: bool,
    /// SGLang: ids already emitted, to turn cumulative `output_ids` into deltas.
    emitted: usize,
    /// llama.cpp server: the finishing event's `timings`, as JSON.
    timings: Option<String>,
    /// The prompt ids the engine says it served from its own KV cache: vLLM's usage
    /// chunk (`prompt_tokens_details.cached_tokens`), SGLang's `meta_info.cached_tokens`,
    /// llama.cpp server's `timings.cache_n`.
    cached_tokens: Option<u64>,
}

/// vLLM's completion chunk: what we read of it.
#[derive(Deserialize)]
struct VllmEvent<'a> {
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    choices: Option<Vec<VllmChoice>>,
    #[serde(default)]
    usage: Option<VllmUsage>,
}

/// vLLM's `usage` (the last chunk, with `stream_options.include_usage`); the details
/// only with `--enable-prompt-tokens-details`.
#[derive(Deserialize)]
struct VllmUsage {
    #[serde(default)]
    prompt_tokens_details: Option<VllmPromptDetails>,
}

#[derive(Deserialize)]
struct VllmPromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct VllmChoice {
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    finish_reason: Option<IgnoredAny>,
}

/// SGLang's `/generate` chunk.
#[derive(Deserialize)]
struct SglangEvent<'a> {
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    output_ids: Option<Vec<u32>>,
    #[serde(borrow, default)]
    meta_info: Option<SglangMeta<'a>>,
}

#[derive(Deserialize)]
struct SglangMeta<'a> {
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    cached_tokens: Option<u64>,
    /// An object (`{"type": "stop" | "length" | "abort", ...}`) once finished; read
    /// further only then, once per stream.
    #[serde(borrow, default)]
    finish_reason: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SglangFinish<'a> {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(borrow, default)]
    message: Option<&'a RawValue>,
}

/// llama.cpp server's `/completion` chunk.
#[derive(Deserialize)]
struct LlamaCppEvent<'a> {
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
    #[serde(default)]
    tokens: Option<Vec<u32>>,
    #[serde(borrow, default)]
    stop: Option<&'a RawValue>,
    #[serde(borrow, default)]
    timings: Option<&'a RawValue>,
}

/// What we read of llama.cpp server's `timings`.
#[derive(Deserialize)]
struct LlamaCppTimings {
    #[serde(default)]
    cache_n: Option<u64>,
}

impl SseDecoder {
    pub fn new(dialect: Dialect) -> Self {
        SseDecoder {
            dialect,
            pending: Vec::new(),
            max_line: DEFAULT_MAX_LINE,
            done: false,
            ended: false,
            emitted: 0,
            timings: None,
            cached_tokens: None,
        }
    }

    /// A line longer than `max_line` bytes fails the stream (a protocol error) instead
    /// of growing the buffer that waits for its newline.
    pub fn with_max_line(mut self, max_line: usize) -> Self {
        self.max_line = max_line;
        self
    }

    /// The bytes held for an incomplete line.
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }

    /// The llama.cpp server's `timings` of the finishing event, as JSON text.
    pub fn timings(&self) -> Option<&str> {
        self.timings.as_deref()
    }

    /// The prompt ids the engine said it had cached (see the field), once it said so.
    pub fn cached_tokens(&self) -> Option<u64> {
        self.cached_tokens
    }

    /// A finishing event has been seen.
    pub fn done(&self) -> bool {
        self.done
    }

    /// `data: [DONE]` has been seen.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Decode every complete line of `data` (with what an earlier read left incomplete).
    pub fn feed(&mut self, data: &[u8]) -> Decoded {
        let mut out = Decoded::default();
        self.feed_into(data, &mut out);
        out.done = self.done;
        out.ended = self.ended;
        out
    }

    /// [`SseDecoder::feed`] adding to `out` (ids, the first error); `out.done` and
    /// `out.ended` are left to the caller. Nothing is read after an error or `[DONE]`.
    pub fn feed_into(&mut self, data: &[u8], out: &mut Decoded) {
        if self.ended || out.error.is_some() {
            return;
        }
        let mut rest = data;
        if !self.pending.is_empty() {
            let Some(at) = memchr::memchr(b'\n', rest) else {
                self.hold(rest, out);
                return;
            };
            let mut line = std::mem::take(&mut self.pending);
            if !self.fits(line.len() + at, out) {
                return;
            }
            line.extend_from_slice(&rest[..at]);
            rest = &rest[at + 1..];
            if !self.line(&line, out) {
                return;
            }
        }
        while let Some(at) = memchr::memchr(b'\n', rest) {
            let line = &rest[..at];
            rest = &rest[at + 1..];
            if !self.fits(line.len(), out) || !self.line(line, out) {
                return;
            }
        }
        self.hold(rest, out);
    }

    /// Keep the start of a line until its newline comes, within `max_line`.
    fn hold(&mut self, part: &[u8], out: &mut Decoded) {
        if self.fits(self.pending.len() + part.len(), out) {
            self.pending.extend_from_slice(part);
        }
    }

    /// A line of `len` bytes is within `max_line`; else the stream fails, and what was
    /// held for it is freed.
    fn fits(&mut self, len: usize, out: &mut Decoded) -> bool {
        if len <= self.max_line {
            return true;
        }
        self.pending = Vec::new();
        out.error = Some(StreamError::Protocol(format!(
            "an event line longer than {} bytes",
            self.max_line
        )));
        false
    }

    /// The end of the body: a last line without its newline still counts.
    pub fn finish(&mut self) -> Decoded {
        let mut out = Decoded::default();
        self.finish_into(&mut out);
        out.done = self.done;
        out.ended = self.ended;
        out
    }

    /// [`SseDecoder::finish`] adding to `out`.
    pub fn finish_into(&mut self, out: &mut Decoded) {
        let tail = std::mem::take(&mut self.pending);
        if !self.ended && out.error.is_none() && !tail.is_empty() {
            self.line(&tail, out);
        }
    }

    /// One line; false when nothing after it may be read (an error or `[DONE]`).
    fn line(&mut self, line: &[u8], out: &mut Decoded) -> bool {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return true; // comments, `event:`, `id:` and blank separators
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.ended = true;
            return false;
        }
        let result = match self.dialect {
            Dialect::Vllm => self.vllm(data, out),
            Dialect::Sglang => self.sglang(data, out),
            Dialect::LlamaCpp => self.llamacpp(data, out),
        };
        match result {
            Ok(()) => true,
            Err(error) => {
                out.error = Some(error);
                false
            }
        }
    }

    fn vllm(&mut self, data: &[u8], out: &mut Decoded) -> Result<(), StreamError> {
        let event: VllmEvent = parse(data)?;
        upstream_error(event.error)?;
        // The usage chunk comes after the finishing one: read before that check.
        let usage = event.usage.is_some();
        if let Some(cached) = event
            .usage
            .and_then(|usage| usage.prompt_tokens_details)
            .and_then(|details| details.cached_tokens)
        {
            self.cached_tokens = Some(cached);
        }
        if self.done {
            return Ok(());
        }
        let Some(choice) = event.choices.into_iter().flatten().next() else {
            // vLLM sends a usage-only chunk last when asked; nothing to emit.
            if usage {
                return Ok(());
            }
            return Err(StreamError::Protocol("vLLM chunk without choices".into()));
        };
        out.ids.extend(choice.token_ids.unwrap_or_default());
        self.done = choice.finish_reason.is_some();
        Ok(())
    }

    fn sglang(&mut self, data: &[u8], out: &mut Decoded) -> Result<(), StreamError> {
        let event: SglangEvent = parse(data)?;
        upstream_error(event.error)?;
        if self.done {
            return Ok(());
        }
        let Some(meta) = event.meta_info else {
            return Err(StreamError::Protocol("SGLang chunk without meta_info".into()));
        };
        let ids = event
            .output_ids
            .ok_or_else(|| StreamError::Protocol("expected a list of token ids in `output_ids`".into()))?;
        let cumulative = meta.completion_tokens == Some(ids.len() as u64) && ids.len() >= self.emitted;
        let new = if cumulative {
            &ids[self.emitted..]
        } else {
            &ids[..]
        };
        self.emitted += new.len();
        out.ids.extend_from_slice(new);
        if let Some(reason) = meta.finish_reason {
            if let Ok(finish) = serde_json::from_str::<SglangFinish>(reason.get()) {
                if finish.kind.as_deref() == Some("abort") {
                    let message = finish.message.map_or("None".into(), raw_text);
                    return Err(StreamError::Aborted(format!("SGLang aborted: {message}")));
                }
            }
            self.done = true;
            self.cached_tokens = meta.cached_tokens;
        }
        Ok(())
    }

    fn llamacpp(&mut self, data: &[u8], out: &mut Decoded) -> Result<(), StreamError> {
        let event: LlamaCppEvent = parse(data)?;
        upstream_error(event.error)?;
        if self.done {
            return Ok(());
        }
        out.ids.extend(event.tokens.unwrap_or_default());
        self.done = event.stop.is_some_and(truthy);
        if self.done {
            if let Some(timings) = event.timings.filter(|t| t.get().starts_with('{')) {
                self.timings = Some(timings.get().to_owned());
                self.cached_tokens = serde_json::from_str::<LlamaCppTimings>(timings.get())
                    .ok()
                    .and_then(|t| t.cache_n);
            }
        }
        Ok(())
    }
}

/// One event's typed fields; a malformed event, or one whose fields have the wrong
/// types (ids that are not non-negative 32-bit integers), is a protocol error.
fn parse<'a, T: Deserialize<'a>>(data: &'a [u8]) -> Result<T, StreamError> {
    let shown = || String::from_utf8_lossy(&data[..data.len().min(200)]).into_owned();
    // serde would also read a struct from an array, field by field.
    if data.first() != Some(&b'{') {
        return Err(StreamError::Protocol(format!(
            "stream event is not an object: {}",
            shown()
        )));
    }
    serde_json::from_slice(data).map_err(|e| {
        let shown = shown();
        let what = if e.is_data() {
            "unexpected stream event"
        } else {
            "malformed stream event"
        };
        StreamError::Protocol(format!("{what} ({e}): {shown}"))
    })
}

/// The server's `error` field, when set, as the failure it reports.
fn upstream_error(error: Option<&RawValue>) -> Result<(), StreamError> {
    let Some(error) = error else {
        return Ok(());
    };
    let message = match serde_json::from_str::<Value>(error.get()) {
        Ok(Value::Object(fields)) => match fields.get("message") {
            Some(Value::String(text)) => text.clone(),
            Some(other) => other.to_string(),
            None => error.get().to_owned(),
        },
        _ => raw_text(error),
    };
    Err(StreamError::Upstream(format!(
        "upstream reported an error: {message}"
    )))
}

/// A JSON string's text, or any other value's JSON.
fn raw_text(value: &RawValue) -> String {
    match serde_json::from_str::<String>(value.get()) {
        Ok(text) => text,
        Err(_) => value.get().to_owned(),
    }
}

/// JavaScript truthiness, as llama.cpp's `stop` is read: false, 0, "", [] and {} are
/// false (null never gets here: serde maps it to `None`).
fn truthy(value: &RawValue) -> bool {
    match value.get() {
        "false" => return false,
        "true" => return true,
        _ => {}
    }
    match serde_json::from_str::<Value>(value.get()) {
        Ok(Value::Bool(b)) => b,
        Ok(Value::Number(n)) => n.as_f64() != Some(0.0),
        Ok(Value::String(s)) => !s.is_empty(),
        Ok(Value::Array(a)) => !a.is_empty(),
        Ok(Value::Object(o)) => !o.is_empty(),
        Ok(Value::Null) | Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vllm_event(ids: &[u32], finish: Option<&str>) -> String {
        let finish = finish.map_or("null".to_string(), |f| format!("\"{f}\""));
        format!(
            "data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"text\":\"\",\"token_ids\":{ids:?},\
             \"finish_reason\":{finish}}}]}}\n\n"
        )
    }

    #[test]
    fn a_line_past_the_bound_fails_the_stream_and_frees_its_buffer() {
        let mut decoder = SseDecoder::new(Dialect::Vllm).with_max_line(128);
        let first = vllm_event(&[1], None);
        let out = decoder.feed(first.as_bytes());
        assert_eq!(out.ids, vec![1]);
        let mut held = 0;
        let mut failure = None;
        for _ in 0..100 {
            let out = decoder.feed(b"data: xxxxxxxxxxxxxxxx");
            held = held.max(decoder.buffered());
            if out.error.is_some() {
                failure = out.error;
                break;
            }
        }
        assert!(held <= 128, "{held}");
        assert_eq!(decoder.buffered(), 0);
        assert_eq!(
            failure,
            Some(StreamError::Protocol(
                "an event line longer than 128 bytes".into()
            ))
        );
        // A whole line over the bound in one read fails the same way.
        let long = format!("data: {}\n", "x".repeat(200));
        let out = SseDecoder::new(Dialect::Vllm)
            .with_max_line(128)
            .feed(long.as_bytes());
        assert!(matches!(out.error, Some(StreamError::Protocol(_))));
    }

    #[test]
    fn every_complete_event_of_one_read_in_one_call() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let read = vllm_event(&[1, 2], None) + &vllm_event(&[3], None);
        let out = decoder.feed(read.as_bytes());
        assert_eq!(out.ids, vec![1, 2, 3]);
        assert!(!out.done && !out.ended && out.error.is_none());
    }

    #[test]
    fn an_event_split_across_reads_is_decoded_once_whole() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let event = vllm_event(&[7, 8], Some("stop")) + "data: [DONE]\n\n";
        let (head, tail) = event.as_bytes().split_at(20);
        assert_eq!(decoder.feed(head), Decoded::default());
        let out = decoder.feed(tail);
        assert_eq!(out.ids, vec![7, 8]);
        assert!(out.done && out.ended);
    }

    #[test]
    fn crlf_lines_comments_and_a_last_line_without_newline() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let read = ": keep-alive\r\nevent: x\r\ndata: {\"choices\":[{\"token_ids\":[4]}]}\r\n\r\n";
        assert_eq!(decoder.feed(read.as_bytes()).ids, vec![4]);
        decoder.feed(b"data: {\"choices\":[{\"token_ids\":[5],\"finish_reason\":\"length\"}]}");
        let out = decoder.finish();
        assert_eq!(out.ids, vec![5]);
        assert!(out.done && !out.ended);
    }

    #[test]
    fn nothing_after_done_is_read_and_no_ids_after_the_finish() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let read = vllm_event(&[1], Some("stop")) + &vllm_event(&[2], None) + "data: [DONE]\n\n";
        let out = decoder.feed(read.as_bytes());
        assert_eq!(out.ids, vec![1]);
        assert!(out.done && out.ended);
        assert_eq!(
            decoder.feed(vllm_event(&[3], None).as_bytes()).ids,
            Vec::<u32>::new()
        );
    }

    #[test]
    fn usage_only_chunk_is_empty_and_missing_choices_is_a_protocol_error() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let out = decoder.feed(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n");
        assert_eq!(out, Decoded::default());
        let out = decoder.feed(b"data: {\"choices\":[]}\n\n");
        assert_eq!(
            out.error,
            Some(StreamError::Protocol("vLLM chunk without choices".into()))
        );
    }

    #[test]
    fn ids_before_an_error_in_the_same_read_are_kept() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let read = vllm_event(&[9], None) + "data: {\"error\":{\"message\":\"oom\"}}\n\n";
        let out = decoder.feed(read.as_bytes());
        assert_eq!(out.ids, vec![9]);
        assert_eq!(
            out.error,
            Some(StreamError::Upstream("upstream reported an error: oom".into()))
        );
    }

    #[test]
    fn malformed_and_non_object_events_and_bad_ids_are_protocol_errors() {
        for (data, message) in [
            ("data: {nope\n", "malformed stream event"),
            ("data: [1]\n", "stream event is not an object"),
            (
                "data: {\"choices\":[{\"token_ids\":[\"a\"]}]}\n",
                "unexpected stream event",
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[-1]}]}\n",
                "unexpected stream event",
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[4294967296]}]}\n",
                "unexpected stream event",
            ),
        ] {
            let out = SseDecoder::new(Dialect::Vllm).feed(data.as_bytes());
            let Some(StreamError::Protocol(text)) = out.error else {
                panic!("{data}: {:?}", out.error);
            };
            assert!(text.starts_with(message), "{data}: {text}");
            assert!(text.ends_with(data[6..].trim_end()), "{data}: {text}");
        }
    }

    #[test]
    fn unread_fields_of_any_shape_are_skipped_and_usage_may_be_null() {
        let mut decoder = SseDecoder::new(Dialect::Vllm);
        let read = "data: {\"id\":\"c\",\"choices\":[{\"text\":\"\\u00e9\",\"logprobs\":{\"a\":[1,{}]},\
                    \"token_ids\":[1],\"prompt_token_ids\":[5,6],\"finish_reason\":null}],\"usage\":null}\n";
        let out = decoder.feed(read.as_bytes());
        assert_eq!(out.ids, vec![1]);
        assert!(out.error.is_none() && !out.done);
    }

    #[test]
    fn sglang_cumulative_and_incremental_ids_become_deltas() {
        let event = |ids: &[u32], total: usize, finish: &str| {
            format!(
                "data: {{\"output_ids\":{ids:?},\"meta_info\":{{\"completion_tokens\":{total},\
                 \"finish_reason\":{finish}}}}}\n"
            )
        };
        let mut cumulative = SseDecoder::new(Dialect::Sglang);
        let read = event(&[1], 1, "null") + &event(&[1, 2], 2, "null");
        assert_eq!(cumulative.feed(read.as_bytes()).ids, vec![1, 2]);
        let out = cumulative.feed(event(&[1, 2, 3], 3, "{\"type\":\"stop\"}").as_bytes());
        assert_eq!((out.ids, out.done), (vec![3], true));
        let mut incremental = SseDecoder::new(Dialect::Sglang);
        let read = event(&[1], 1, "null") + &event(&[2], 2, "null") + &event(&[3], 3, "null");
        assert_eq!(incremental.feed(read.as_bytes()).ids, vec![1, 2, 3]);
        let abort = event(&[], 3, "{\"type\":\"abort\",\"message\":\"gone\"}");
        assert_eq!(
            incremental.feed(abort.as_bytes()).error,
            Some(StreamError::Aborted("SGLang aborted: gone".into()))
        );
    }

    #[test]
    fn each_dialect_reports_the_engines_cached_prompt_ids() {
        let mut vllm = SseDecoder::new(Dialect::Vllm);
        let read = vllm_event(&[1], Some("stop"))
            + "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":70,\
               \"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\ndata: [DONE]\n\n";
        assert_eq!(vllm.cached_tokens(), None);
        let out = vllm.feed(read.as_bytes());
        assert_eq!((out.ids, out.ended), (vec![1], true));
        assert_eq!(vllm.cached_tokens(), Some(64));
        // vLLM without `--enable-prompt-tokens-details`: usage without the details.
        let mut plain = SseDecoder::new(Dialect::Vllm);
        plain.feed(b"data: {\"choices\":[],\"usage\":{\"prompt_tokens_details\":null}}\n\n");
        assert_eq!(plain.cached_tokens(), None);
        let mut sglang = SseDecoder::new(Dialect::Sglang);
        sglang.feed(
            b"data: {\"output_ids\":[4],\"meta_info\":{\"completion_tokens\":1,\
              \"cached_tokens\":32,\"finish_reason\":{\"type\":\"stop\"}}}\n",
        );
        assert_eq!(sglang.cached_tokens(), Some(32));
        let mut llamacpp = SseDecoder::new(Dialect::LlamaCpp);
        llamacpp.feed(b"data: {\"tokens\":[],\"stop\":true,\"timings\":{\"cache_n\":12}}\n\n");
        assert_eq!(llamacpp.cached_tokens(), Some(12));
    }

    #[test]
    fn llamacpp_tokens_stop_and_timings() {
        let mut decoder = SseDecoder::new(Dialect::LlamaCpp);
        let read = "data: {\"tokens\":[5],\"stop\":false}\n\n\
                    data: {\"tokens\":[],\"stop\":true,\"timings\":{\"predicted_n\":1}}\n\n";
        let out = decoder.feed(read.as_bytes());
        assert_eq!((out.ids, out.done), (vec![5], true));
        assert_eq!(decoder.timings(), Some("{\"predicted_n\":1}"));
    }
}
