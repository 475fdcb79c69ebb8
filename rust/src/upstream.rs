//! The upstream engine's stream decoder: server-sent events from vLLM, SGLang or llama.cpp
//! server in, sampled token ids out, without I/O.
//!
//! The Python engine hands [`SseDecoder::feed`] the bytes of each socket read; the decoder
//! keeps the incomplete tail, splits the complete lines, parses every `data:` event's JSON
//! and extracts the dialect's ids and finish signal, so one read costs one call however
//! many events it holds. Semantics match the dialects' documented shapes: `[DONE]` ends the
//! stream, an `error` object in an event is the server's failure, events after the
//! finishing one are read (so the connection can be reused) but add no ids.

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

/// Sans-I/O decoder state for one streamed response.
#[derive(Debug)]
pub struct SseDecoder {
    dialect: Dialect,
    pending: Vec<u8>,
    done: bool,
    ended: bool,
    /// SGLang: ids already emitted, to turn cumulative `output_ids` into deltas.
    emitted: usize,
    /// llama.cpp server: the finishing event's `timings`, as JSON.
    timings: Option<String>,
}

impl SseDecoder {
    pub fn new(dialect: Dialect) -> Self {
        SseDecoder {
            dialect,
            pending: Vec::new(),
            done: false,
            ended: false,
            emitted: 0,
            timings: None,
        }
    }

    /// The llama.cpp server's `timings` of the finishing event, as JSON text.
    pub fn timings(&self) -> Option<&str> {
        self.timings.as_deref()
    }

    /// Decode every complete line of `data` (with what an earlier read left incomplete).
    pub fn feed(&mut self, data: &[u8]) -> Decoded {
        let mut out = Decoded::default();
        if self.ended {
            out.ended = true;
            out.done = self.done;
            return out;
        }
        self.pending.extend_from_slice(data);
        let buffer = std::mem::take(&mut self.pending);
        let mut start = 0;
        while let Some(at) = memchr(b'\n', &buffer[start..]) {
            let line = &buffer[start..start + at];
            start += at + 1;
            if !self.line(line, &mut out) {
                break;
            }
        }
        if !self.ended && out.error.is_none() {
            self.pending = buffer[start..].to_vec();
        }
        out.done = self.done;
        out.ended = self.ended;
        out
    }

    /// The end of the body: a last line without its newline still counts.
    pub fn finish(&mut self) -> Decoded {
        let mut out = Decoded::default();
        let tail = std::mem::take(&mut self.pending);
        if !self.ended && !tail.is_empty() {
            self.line(&tail, &mut out);
        }
        out.done = self.done;
        out.ended = self.ended;
        out
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
        match self.event(data, out) {
            Ok(()) => true,
            Err(error) => {
                out.error = Some(error);
                false
            }
        }
    }

    fn event(&mut self, data: &[u8], out: &mut Decoded) -> Result<(), StreamError> {
        let shown = || String::from_utf8_lossy(&data[..data.len().min(200)]).into_owned();
        let event: Value = serde_json::from_slice(data)
            .map_err(|_| StreamError::Protocol(format!("malformed stream event: {}", shown())))?;
        let Value::Object(event) = event else {
            return Err(StreamError::Protocol(format!(
                "stream event is not an object: {}",
                shown()
            )));
        };
        if let Some(error) = event.get("error").filter(|e| !e.is_null()) {
            let message = match error {
                Value::Object(fields) => match fields.get("message") {
                    Some(Value::String(text)) => text.clone(),
                    Some(other) => other.to_string(),
                    None => error.to_string(),
                },
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            return Err(StreamError::Upstream(format!(
                "upstream reported an error: {message}"
            )));
        }
        if self.done {
            return Ok(());
        }
        let value = Value::Object(event);
        match self.dialect {
            Dialect::Vllm => self.vllm(&value, out),
            Dialect::Sglang => self.sglang(&value, out),
            Dialect::LlamaCpp => self.llamacpp(&value, out),
        }
    }

    fn vllm(&mut self, event: &Value, out: &mut Decoded) -> Result<(), StreamError> {
        let Some(choice) = event
            .get("choices")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
        else {
            // vLLM sends a usage-only chunk last when asked; nothing to emit.
            if event.get("usage").is_some() {
                return Ok(());
            }
            return Err(StreamError::Protocol("vLLM chunk without choices".into()));
        };
        match choice.get("token_ids") {
            None | Some(Value::Null) => {}
            Some(ids) => ids_into(ids, "choices[0].token_ids", &mut out.ids)?,
        }
        self.done = choice.get("finish_reason").is_some_and(|f| !f.is_null());
        Ok(())
    }

    fn sglang(&mut self, event: &Value, out: &mut Decoded) -> Result<(), StreamError> {
        let Some(meta) = event.get("meta_info").and_then(Value::as_object) else {
            return Err(StreamError::Protocol("SGLang chunk without meta_info".into()));
        };
        let mut ids = Vec::new();
        ids_into(
            event.get("output_ids").unwrap_or(&Value::Null),
            "output_ids",
            &mut ids,
        )?;
        let total = meta.get("completion_tokens").and_then(Value::as_u64);
        let cumulative = total == Some(ids.len() as u64) && ids.len() >= self.emitted;
        let new = if cumulative {
            &ids[self.emitted..]
        } else {
            &ids[..]
        };
        self.emitted += new.len();
        out.ids.extend_from_slice(new);
        let finish = meta.get("finish_reason").filter(|f| !f.is_null());
        if let Some(Value::Object(reason)) = finish {
            if reason.get("type").and_then(Value::as_str) == Some("abort") {
                let message = reason.get("message").map_or("None".into(), |m| match m {
                    Value::String(text) => text.clone(),
                    other => other.to_string(),
                });
                return Err(StreamError::Aborted(format!("SGLang aborted: {message}")));
            }
        }
        self.done = finish.is_some();
        Ok(())
    }

    fn llamacpp(&mut self, event: &Value, out: &mut Decoded) -> Result<(), StreamError> {
        if let Some(ids) = event.get("tokens") {
            ids_into(ids, "tokens", &mut out.ids)?;
        }
        self.done = match event.get("stop") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Bool(true)) => true,
        };
        if self.done {
            if let Some(timings @ Value::Object(_)) = event.get("timings") {
                self.timings = Some(timings.to_string());
            }
        }
        Ok(())
    }
}

/// Append the token ids in `value` (a JSON array of non-negative 32-bit integers).
fn ids_into(value: &Value, place: &str, out: &mut Vec<u32>) -> Result<(), StreamError> {
    let wrong = || StreamError::Protocol(format!("expected a list of token ids in `{place}`"));
    let ids = value.as_array().ok_or_else(wrong)?;
    out.reserve(ids.len());
    for id in ids {
        let id = id
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .ok_or_else(wrong)?;
        out.push(id);
    }
    Ok(())
}

fn memchr(byte: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == byte)
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
            ("data: {nope\n", "malformed stream event: {nope"),
            ("data: [1]\n", "stream event is not an object: [1]"),
            (
                "data: {\"choices\":[{\"token_ids\":[\"a\"]}]}\n",
                "expected a list of token ids in `choices[0].token_ids`",
            ),
            (
                "data: {\"choices\":[{\"token_ids\":[-1]}]}\n",
                "expected a list of token ids in `choices[0].token_ids`",
            ),
        ] {
            let out = SseDecoder::new(Dialect::Vllm).feed(data.as_bytes());
            assert_eq!(out.error, Some(StreamError::Protocol(message.into())), "{data}");
        }
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
    fn llamacpp_tokens_stop_and_timings() {
        let mut decoder = SseDecoder::new(Dialect::LlamaCpp);
        let read = "data: {\"tokens\":[5],\"stop\":false}\n\n\
                    data: {\"tokens\":[],\"stop\":true,\"timings\":{\"predicted_n\":1}}\n\n";
        let out = decoder.feed(read.as_bytes());
        assert_eq!((out.ids, out.done), (vec![5], true));
        assert_eq!(decoder.timings(), Some("{\"predicted_n\":1}"));
    }
}
