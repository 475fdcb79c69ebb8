//! One HTTP/1.1 response read from the raw bytes of each socket read, without I/O: the
//! head (status, body framing, whether the connection can be reused), then the body,
//! chunked, length-delimited or up to the close, handed to the dialect's [`SseDecoder`]
//! (a streamed 2xx answer) or collected (an error status, or a request that is not a
//! stream: its body is read by the caller once complete).
//!
//! The upstream engine's client (`hotloop.engines.http1`) calls [`ResponseReader::feed`]
//! once per read from its asyncio protocol, so a read costs one call whatever it holds:
//! part of a chunk, several chunks, the end of the head and the first events.

use super::{Decoded, Dialect, SseDecoder, StreamError};

/// The most head bytes we wait for before calling the response malformed.
const MAX_HEAD: usize = 64 * 1024;
/// The most of a collected body we keep (error messages, model lists); the rest is read
/// and dropped, so the connection stays usable.
const MAX_BODY: usize = 1 << 20;
/// The longest chunk-size or trailer line.
const MAX_LINE: usize = 4096;

/// How the body's end is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `Content-Length`: this many bytes are left.
    Length(u64),
    /// Neither length nor chunked: the body ends when the server closes.
    Close,
    /// `Transfer-Encoding: chunked`, at this point of a chunk.
    Chunked(Chunk),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line.
    Size,
    /// Inside a chunk's data, this many bytes left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines after the last chunk, up to the empty one.
    Trailer,
}

/// Where body bytes go.
#[derive(Debug)]
enum Sink {
    Stream(SseDecoder),
    Collect(Vec<u8>),
}

impl Sink {
    fn take(&mut self, data: &[u8], out: &mut Decoded) {
        match self {
            Sink::Stream(sse) => sse.feed_into(data, out),
            Sink::Collect(body) => {
                let room = MAX_BODY.saturating_sub(body.len());
                body.extend_from_slice(&data[..data.len().min(room)]);
            }
        }
    }
}

/// What one read changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// The stream's new ids, its finish state and the first failure (also a framing one).
    pub decoded: Decoded,
    /// The head was completed by this read: the status is known.
    pub head: bool,
    /// The body's end was reached by this read.
    pub complete: bool,
}

/// Sans-I/O state of one response on a connection.
#[derive(Debug)]
pub struct ResponseReader {
    stream: Option<Dialect>,
    max_line: usize,
    head: Vec<u8>,
    status: Option<u16>,
    keep_alive: bool,
    framing: Framing,
    sink: Sink,
    line: Vec<u8>,
    complete: bool,
    failed: bool,
}

impl ResponseReader {
    /// A reader for the answer to a request; `stream`: the request asked for this
    /// dialect's event stream (its 2xx body is decoded, any other body collected).
    pub fn new(stream: Option<Dialect>) -> Self {
        ResponseReader {
            stream,
            max_line: super::DEFAULT_MAX_LINE,
            head: Vec::new(),
            status: None,
            keep_alive: false,
            framing: Framing::Close,
            sink: Sink::Collect(Vec::new()),
            line: Vec::new(),
            complete: false,
            failed: false,
        }
    }

    /// The longest event line of the stream (`SseDecoder::with_max_line`).
    pub fn with_max_line(mut self, max_line: usize) -> Self {
        self.max_line = max_line;
        self
    }

    /// The status code, once the head is read.
    pub fn status(&self) -> Option<u16> {
        self.status
    }

    /// The body has been read to its end.
    pub fn complete(&self) -> bool {
        self.complete
    }

    /// Once complete: the connection may carry the next request.
    pub fn reusable(&self) -> bool {
        self.complete && self.keep_alive && !self.failed
    }

    /// A collected body (empty for a stream).
    pub fn body(&self) -> &[u8] {
        match &self.sink {
            Sink::Collect(body) => body,
            Sink::Stream(_) => &[],
        }
    }

    /// The stream's decoder, once a 2xx head was read for a stream.
    pub fn events(&self) -> Option<&SseDecoder> {
        match &self.sink {
            Sink::Stream(sse) => Some(sse),
            Sink::Collect(_) => None,
        }
    }

    /// The bytes of one socket read.
    pub fn feed(&mut self, data: &[u8]) -> Progress {
        let mut progress = Progress::default();
        if self.failed {
            return progress;
        }
        if self.status.is_none() {
            match self.read_head(data) {
                Ok(Some(rest)) => {
                    progress.head = true;
                    self.read_body(&rest, &mut progress);
                }
                Ok(None) => {}
                Err(error) => progress.decoded.error = Some(error),
            }
        } else {
            self.read_body(data, &mut progress);
        }
        self.settle(&mut progress);
        progress
    }

    /// The server closed the connection: the end of a body framed by the close (with a
    /// last event line that had no newline); any other body is then incomplete, which
    /// the caller sees as `complete` staying false.
    pub fn eof(&mut self) -> Progress {
        let mut progress = Progress::default();
        if !self.failed && self.status.is_some() && self.framing == Framing::Close {
            self.end(&mut progress);
            self.settle(&mut progress);
        }
        progress
    }

    /// Accumulate the head; once whole, parse it and return the body bytes after it.
    fn read_head(&mut self, data: &[u8]) -> Result<Option<Vec<u8>>, StreamError> {
        let from = self.head.len().saturating_sub(3);
        self.head.extend_from_slice(data);
        let Some(at) = memchr::memmem::find(&self.head[from..], b"\r\n\r\n") else {
            if self.head.len() > MAX_HEAD {
                return Err(StreamError::Protocol(format!(
                    "response head longer than {MAX_HEAD} bytes"
                )));
            }
            return Ok(None);
        };
        let rest = self.head.split_off(from + at + 4);
        let head = std::mem::take(&mut self.head);
        if self.parse_head(&head)? {
            return Ok(Some(rest));
        }
        // An interim 1xx answer: the real head follows.
        self.read_head(&rest)
    }

    /// The status line and the headers that frame the body; false for an interim 1xx.
    fn parse_head(&mut self, head: &[u8]) -> Result<bool, StreamError> {
        let malformed = || {
            let shown = String::from_utf8_lossy(&head[..head.len().min(200)]).into_owned();
            StreamError::Protocol(format!("malformed response head: {shown}"))
        };
        let mut lines = head
            .split(|&b| b == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
        let status_line = lines.next().ok_or_else(malformed)?;
        let mut parts = status_line.splitn(3, |&b| b == b' ');
        let version = parts.next().ok_or_else(malformed)?;
        let code = parts.next().ok_or_else(malformed)?;
        if !version.starts_with(b"HTTP/1.") || code.len() != 3 {
            return Err(malformed());
        }
        let status: u16 = std::str::from_utf8(code)
            .ok()
            .and_then(|c| c.parse().ok())
            .ok_or_else(malformed)?;
        if (100..200).contains(&status) && status != 101 {
            return Ok(false);
        }
        let mut keep_alive = version == b"HTTP/1.1";
        let mut chunked = false;
        let mut length = None;
        for line in lines.filter(|line| !line.is_empty()) {
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                return Err(malformed());
            };
            let name = line[..colon].trim_ascii();
            let value = line[colon + 1..].trim_ascii();
            if name.eq_ignore_ascii_case(b"transfer-encoding") {
                chunked = value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            } else if name.eq_ignore_ascii_case(b"content-length") {
                let parsed = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                length = Some(parsed.ok_or_else(malformed)?);
            } else if name.eq_ignore_ascii_case(b"connection") {
                for token in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        keep_alive = true;
                    }
                }
            }
        }
        self.framing = if status == 204 || status == 304 {
            Framing::Length(0)
        } else if chunked {
            Framing::Chunked(Chunk::Size)
        } else if let Some(length) = length {
            Framing::Length(length)
        } else {
            keep_alive = false;
            Framing::Close
        };
        self.keep_alive = keep_alive;
        self.status = Some(status);
        if let Some(dialect) = self.stream.filter(|_| (200..300).contains(&status)) {
            self.sink = Sink::Stream(SseDecoder::new(dialect).with_max_line(self.max_line));
        }
        Ok(true)
    }

    fn read_body(&mut self, mut data: &[u8], progress: &mut Progress) {
        let out = &mut progress.decoded;
        while !data.is_empty() && out.error.is_none() {
            match &mut self.framing {
                _ if self.complete => {
                    // Bytes after the end of the body: the connection cannot be trusted.
                    self.keep_alive = false;
                    return;
                }
                Framing::Close => {
                    self.sink.take(data, out);
                    return;
                }
                Framing::Length(left) => {
                    let n = data.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    self.sink.take(&data[..n], out);
                    *left -= n as u64;
                    data = &data[n..];
                    if *left == 0 {
                        self.end(progress);
                        return self.read_body(data, progress);
                    }
                }
                Framing::Chunked(Chunk::Data(left)) => {
                    let n = data.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    self.sink.take(&data[..n], out);
                    *left -= n as u64;
                    data = &data[n..];
                    if *left == 0 {
                        self.framing = Framing::Chunked(Chunk::DataEnd);
                    }
                }
                Framing::Chunked(at) => {
                    let at = *at;
                    if !fill_line(&mut self.line, &mut data) {
                        if self.line.len() > MAX_LINE {
                            out.error = Some(chunk_error("line too long"));
                        }
                        continue;
                    }
                    let step = chunk_step(at, self.line.strip_suffix(b"\r").unwrap_or(&self.line));
                    self.line.clear();
                    match step {
                        Ok(Some(next)) => self.framing = Framing::Chunked(next),
                        Ok(None) => {
                            self.end(progress);
                            return self.read_body(data, progress);
                        }
                        Err(error) => out.error = Some(error),
                    }
                }
            }
        }
    }

    /// The body's end: a stream's last line without a newline still counts.
    fn end(&mut self, progress: &mut Progress) {
        if let Sink::Stream(sse) = &mut self.sink {
            sse.finish_into(&mut progress.decoded);
        }
        self.complete = true;
        progress.complete = true;
    }

    /// Copy the stream's state into the progress; a failure stops all further reading.
    fn settle(&mut self, progress: &mut Progress) {
        if let Sink::Stream(sse) = &self.sink {
            progress.decoded.done = sse.done();
            progress.decoded.ended = sse.ended();
        }
        if progress.decoded.error.is_some() {
            self.failed = true;
        }
    }
}

/// Append `data` up to the next newline to `line`; true when the line is whole (its
/// newline consumed, not kept).
fn fill_line(line: &mut Vec<u8>, data: &mut &[u8]) -> bool {
    match memchr::memchr(b'\n', data) {
        Some(at) => {
            line.extend_from_slice(&data[..at]);
            *data = &data[at + 1..];
            true
        }
        None => {
            line.extend_from_slice(data);
            *data = &[];
            false
        }
    }
}

/// Where a whole line (chunk size, the end of a chunk's data, a trailer) leads: the
/// next state, or None at the body's end.
fn chunk_step(at: Chunk, line: &[u8]) -> Result<Option<Chunk>, StreamError> {
    match at {
        Chunk::Size => match chunk_size(line) {
            Some(0) => Ok(Some(Chunk::Trailer)),
            Some(size) => Ok(Some(Chunk::Data(size))),
            None => Err(chunk_error("bad chunk size")),
        },
        Chunk::DataEnd if line.is_empty() => Ok(Some(Chunk::Size)),
        Chunk::DataEnd => Err(chunk_error("data longer than its size")),
        Chunk::Trailer if line.is_empty() => Ok(None),
        Chunk::Trailer | Chunk::Data(_) => Ok(Some(at)),
    }
}

/// A chunk-size line's size (hex, extensions after `;` ignored).
fn chunk_size(line: &[u8]) -> Option<u64> {
    let digits = line.split(|&b| b == b';').next()?.trim_ascii();
    if digits.is_empty() || digits.len() > 15 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
}

fn chunk_error(what: &str) -> StreamError {
    StreamError::Protocol(format!("malformed chunked body: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                        transfer-encoding: chunked\r\n\r\n";

    fn chunk(data: &str) -> String {
        format!("{:x}\r\n{data}\r\n", data.len())
    }

    fn event(ids: &[u32], finish: bool) -> String {
        let finish = if finish { "\"stop\"" } else { "null" };
        format!("data: {{\"choices\":[{{\"token_ids\":{ids:?},\"finish_reason\":{finish}}}]}}\n\n")
    }

    fn whole_stream() -> String {
        HEAD.to_string()
            + &chunk(&event(&[1], false))
            + &chunk(&(event(&[2, 3], false) + &event(&[4], true)))
            + &chunk("data: [DONE]\n\n")
            + "0\r\n\r\n"
    }

    #[test]
    fn a_chunked_stream_in_one_read() {
        let mut reader = ResponseReader::new(Some(Dialect::Vllm));
        let progress = reader.feed(whole_stream().as_bytes());
        assert!(progress.head && progress.complete);
        assert_eq!(progress.decoded.ids, vec![1, 2, 3, 4]);
        assert!(progress.decoded.done && progress.decoded.ended);
        assert_eq!(reader.status(), Some(200));
        assert!(reader.reusable());
    }

    #[test]
    fn every_split_of_the_stream_decodes_the_same() {
        let stream = whole_stream();
        let bytes = stream.as_bytes();
        for cut in 1..bytes.len() {
            for second in [cut, (cut + 7).min(bytes.len())] {
                let mut reader = ResponseReader::new(Some(Dialect::Vllm));
                let mut ids = Vec::new();
                let mut complete = false;
                for part in [&bytes[..cut], &bytes[cut..second], &bytes[second..]] {
                    let progress = reader.feed(part);
                    assert!(progress.decoded.error.is_none(), "cut at {cut}");
                    ids.extend(progress.decoded.ids);
                    complete |= progress.complete;
                }
                assert_eq!(ids, vec![1, 2, 3, 4], "cut at {cut}/{second}");
                assert!(complete && reader.reusable(), "cut at {cut}/{second}");
            }
        }
    }

    #[test]
    fn a_length_delimited_error_body_is_collected() {
        let body = "{\"error\":{\"message\":\"bad\"}}";
        let head = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let mut reader = ResponseReader::new(Some(Dialect::Vllm));
        assert!(reader.feed(head.as_bytes()).head);
        assert!(!reader.complete());
        let progress = reader.feed(body.as_bytes());
        assert!(progress.complete && progress.decoded.ids.is_empty());
        assert_eq!(reader.body(), body.as_bytes());
        assert!(reader.reusable());
    }

    #[test]
    fn a_body_up_to_the_close_ends_at_eof_with_its_last_line() {
        let mut reader = ResponseReader::new(Some(Dialect::Vllm));
        let read = "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n".to_string()
            + &event(&[5], false)
            + "data: {\"choices\":[{\"token_ids\":[6],\"finish_reason\":\"length\"}]}";
        let progress = reader.feed(read.as_bytes());
        assert_eq!((progress.decoded.ids, progress.complete), (vec![5], false));
        let progress = reader.eof();
        assert_eq!(progress.decoded.ids, vec![6]);
        assert!(progress.complete && progress.decoded.done && !reader.reusable());
    }

    #[test]
    fn a_cut_chunked_body_stays_incomplete_at_eof() {
        let mut reader = ResponseReader::new(Some(Dialect::Vllm));
        let read = HEAD.to_string() + &chunk(&event(&[1], false));
        assert_eq!(reader.feed(read.as_bytes()).decoded.ids, vec![1]);
        assert_eq!(reader.eof(), Progress::default());
        assert!(!reader.complete());
    }

    #[test]
    fn interim_answers_are_skipped_and_http_1_0_closes() {
        let mut reader = ResponseReader::new(None);
        let read = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let progress = reader.feed(read.as_bytes());
        assert!(progress.head && progress.complete);
        assert_eq!((reader.status(), reader.body()), (Some(200), &b"ok"[..]));
        assert!(!reader.reusable());
    }

    #[test]
    fn malformed_heads_and_chunks_are_protocol_errors() {
        for read in [
            "HTTP/2 200\r\n\r\n".to_string(),
            "HTTP/1.1 2x0 OK\r\n\r\n".into(),
            "HTTP/1.1 200 OK\r\nno colon\r\n\r\n".into(),
            HEAD.to_string() + "zz\r\n",
            HEAD.to_string() + "2\r\nabc\r\n",
        ] {
            let mut reader = ResponseReader::new(Some(Dialect::Vllm));
            let progress = reader.feed(read.as_bytes());
            assert!(
                matches!(progress.decoded.error, Some(StreamError::Protocol(_))),
                "{read:?}: {progress:?}"
            );
            assert_eq!(reader.feed(b"0\r\n\r\n"), Progress::default());
            assert!(!reader.reusable());
        }
    }

    #[test]
    fn bytes_after_the_body_make_the_connection_unusable() {
        let mut reader = ResponseReader::new(None);
        reader.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nxy");
        assert!(reader.complete() && !reader.reusable());
    }
}
