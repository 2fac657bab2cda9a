//! HTTP/1.1 as envd's clients speak it on its socket: request heads, bodies by length or chunks,
//! answers, and the relay of one request and its answer to Node's envd.

use crate::sys;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;

/// The longest request head read here: Node's own limit (`--max-http-header-size`, 16 KiB). A
/// longer one goes to envd's parser, whose 431 the client gets.
const MAX_HEAD: usize = 16 * 1024;
/// The longest answer head taken from Node's envd.
const MAX_ANSWER_HEAD: usize = 1024 * 1024;

/// A socket and the bytes read from it but not used yet.
pub struct Conn {
    pub stream: UnixStream,
    pub buf: Vec<u8>,
    /// Another socket whose peer going away ends a wait for this one (the client of a request
    /// handed to Node's envd: Node must see it go, as it would have directly).
    pub watch: Option<RawFd>,
}

impl Conn {
    pub fn new(stream: UnixStream) -> Self {
        Conn {
            stream,
            buf: Vec::new(),
            watch: None,
        }
    }
    /// Reads more; false at the end of the stream.
    fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        if let Some(watched) = self.watch {
            loop {
                let mut fds = [
                    sys::PollFd {
                        fd: self.stream.as_raw_fd(),
                        events: sys::POLLIN,
                        revents: 0,
                    },
                    // Only a peer that closed both ways (POLLHUP, POLLERR: always reported); one
                    // that shut its writing side after its request still wants the answer.
                    sys::PollFd {
                        fd: watched,
                        events: 0,
                        revents: 0,
                    },
                ];
                if sys::poll(&mut fds, -1) < 0 {
                    continue;
                }
                if fds[1].revents & (sys::POLLHUP | sys::POLLERR) != 0 {
                    return Err(io::ErrorKind::ConnectionAborted.into());
                }
                if fds[0].revents != 0 {
                    break;
                }
            }
        }
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
    /// The bytes up to and with the next "\r\n\r\n"; None at a clean end before any byte.
    pub fn head(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.head_within(MAX_HEAD)
    }
    /// An answer's head (from Node's envd, which keeps its own limits).
    pub fn answer_head(&mut self) -> io::Result<Option<Vec<u8>>> {
        self.head_within(MAX_ANSWER_HEAD)
    }
    fn head_within(&mut self, limit: usize) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                if at + 4 > limit {
                    return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
                }
                return Ok(Some(self.buf.drain(..at + 4).collect()));
            }
            if self.buf.len() > limit {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "head too large"));
            }
            if !self.fill()? {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
    /// Exactly `n` bytes.
    pub fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill()? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(self.buf.drain(..n).collect())
    }
    /// One line with its CRLF.
    fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(at) = find(&self.buf, b"\r\n") {
                return Ok(self.buf.drain(..at + 2).collect());
            }
            if self.buf.len() > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            if !self.fill()? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
    /// A chunked body, whole: (its bytes, its framing as it came). None past `limit`.
    pub fn chunked(&mut self, limit: usize) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut body = Vec::new();
        let mut raw = Vec::new();
        loop {
            let line = self.line()?;
            raw.extend_from_slice(&line);
            let size = chunk_size(&line)?;
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    let t = self.line()?;
                    raw.extend_from_slice(&t);
                    if t == b"\r\n" {
                        return Ok(Some((body, raw)));
                    }
                }
            }
            if body.len() + size > limit {
                // Too large to hold: what was read goes back in front of the rest.
                let mut back = raw;
                back.append(&mut self.buf);
                self.buf = back;
                return Ok(None);
            }
            let data = self.take(size + 2)?;
            body.extend_from_slice(&data[..size]);
            raw.extend_from_slice(&data);
        }
    }
    /// Copies a body framed as `framing` to `to`, as it comes.
    pub fn relay_body(&mut self, framing: Framing, to: &mut dyn Write) -> io::Result<()> {
        match framing {
            Framing::None => Ok(()),
            Framing::Length(mut n) => {
                while n > 0 {
                    if self.buf.is_empty() && !self.fill()? {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    let take = self.buf.len().min(n as usize);
                    to.write_all(&self.buf[..take])?;
                    self.buf.drain(..take);
                    n -= take as u64;
                }
                Ok(())
            }
            Framing::Chunked => loop {
                let line = self.line()?;
                to.write_all(&line)?;
                let size = chunk_size(&line)?;
                if size == 0 {
                    loop {
                        let t = self.line()?;
                        to.write_all(&t)?;
                        if t == b"\r\n" {
                            return Ok(());
                        }
                    }
                }
                self.relay_body(Framing::Length(size as u64 + 2), to)?;
            },
            Framing::UntilEnd => {
                to.write_all(&self.buf)?;
                self.buf.clear();
                while self.fill()? {
                    to.write_all(&self.buf)?;
                    self.buf.clear();
                }
                Ok(())
            }
        }
    }
}

fn chunk_size(line: &[u8]) -> io::Result<usize> {
    let text = std::str::from_utf8(line).unwrap_or("");
    let hex = text.trim_end().split(';').next().unwrap_or("").trim();
    usize::from_str_radix(hex, 16)
        .ok()
        .filter(|n| *n < (1 << 40))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad chunk size"))
}

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Framing {
    None,
    Length(u64),
    Chunked,
    UntilEnd,
}

/// A parsed head: its first line's parts and its fields (names lower-cased).
pub struct Head {
    pub raw: Vec<u8>,
    pub first: [String; 3],
    pub fields: Vec<(String, String)>,
}

impl Head {
    pub fn parse(raw: Vec<u8>) -> Option<Head> {
        // Field values may hold any byte (Latin-1 from some clients): read leniently here, and
        // sent on to envd as they came (`raw`), which judges them.
        let text = String::from_utf8_lossy(&raw).into_owned();
        let mut lines = text.split("\r\n");
        let mut first = lines.next()?.splitn(3, ' ');
        let first = [
            first.next()?.to_string(),
            first.next()?.to_string(),
            first.next().unwrap_or("").to_string(),
        ];
        let mut fields = Vec::new();
        for line in lines {
            if line.is_empty() {
                continue;
            }
            let (name, value) = line.split_once(':')?;
            fields.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
        }
        Some(Head { raw, first, fields })
    }
    /// Whether this is a request line HTTP/1.x allows (a method token, a target without spaces
    /// or control bytes, a version) with well-formed field names: anything else is for envd's own
    /// parser to refuse.
    pub fn valid_request(&self) -> bool {
        let raw_line = self.raw.split(|b| *b == b'\r').next().unwrap_or(&[]);
        let parts: Vec<&[u8]> = raw_line.split(|b| *b == b' ').collect();
        let token = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
        parts.len() == 3
            && !parts[0].is_empty()
            && parts[0].iter().all(token)
            && !parts[1].is_empty()
            && parts[1].iter().all(|b| *b > 0x20 && *b != 0x7f)
            && (parts[2] == b"HTTP/1.1" || parts[2] == b"HTTP/1.0")
            && self
                .fields
                .iter()
                .all(|(name, _)| !name.is_empty() && name.bytes().all(|b| token(&b)))
    }
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
    pub fn has_chunked(&self) -> bool {
        self.has_token("transfer-encoding", "chunked")
    }
    fn has_token(&self, name: &str, token: &str) -> bool {
        self.fields
            .iter()
            .filter(|(n, _)| n == name)
            .any(|(_, v)| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    }
    /// A request's body framing; None when it cannot be told (left to Node).
    pub fn request_framing(&self) -> Option<Framing> {
        if self.field("transfer-encoding").is_some() {
            return self
                .has_token("transfer-encoding", "chunked")
                .then_some(Framing::Chunked);
        }
        let lengths: Vec<&str> = self
            .fields
            .iter()
            .filter(|(n, _)| n == "content-length")
            .map(|(_, v)| v.as_str())
            .collect();
        match lengths.as_slice() {
            [] => Some(Framing::None),
            [one] => one.parse::<u64>().ok().map(Framing::Length),
            _ => None,
        }
    }
    /// Whether the client keeps the connection after this request.
    pub fn keep_alive(&self) -> bool {
        if self.has_token("connection", "close") {
            return false;
        }
        self.first[2] == "HTTP/1.1" || self.has_token("connection", "keep-alive")
    }
    pub fn status(&self) -> u16 {
        self.first[1].parse().unwrap_or(0)
    }
    /// An answer's body framing, for a request of `method`.
    pub fn answer_framing(&self, method: &str) -> Framing {
        let status = self.status();
        if method == "HEAD" || status < 200 || status == 204 || status == 304 {
            return Framing::None;
        }
        if self.has_token("transfer-encoding", "chunked") {
            return Framing::Chunked;
        }
        match self.field("content-length").and_then(|v| v.parse().ok()) {
            Some(n) => Framing::Length(n),
            None => Framing::UntilEnd,
        }
    }
}

thread_local! {
    /// Whether the request being answered on this thread came from a browser (an `origin`):
    /// its answer then lets any origin read it, as envd's do (runtime/server/server.ts).
    static FROM_BROWSER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes whether the request now answered on this thread has an `origin`.
pub fn set_browser(yes: bool) {
    FROM_BROWSER.with(|b| b.set(yes));
}

fn cors() -> &'static str {
    if FROM_BROWSER.with(|b| b.get()) {
        "access-control-allow-origin: *\r\naccess-control-expose-headers: *\r\n"
    } else {
        ""
    }
}

pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A whole answer with a body.
pub fn answer(
    to: &mut dyn Write,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep: bool,
) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {}\r\ncontent-length: {}\r\n{}{}\r\n",
        status,
        reason(status),
        content_type,
        body.len(),
        cors(),
        if keep { "" } else { "connection: close\r\n" }
    );
    let mut all = head.into_bytes();
    all.extend_from_slice(body);
    to.write_all(&all)
}

pub const JSON: &str = "application/json; charset=utf-8";

pub fn json(to: &mut dyn Write, status: u16, body: &str, keep: bool) -> io::Result<()> {
    answer(to, status, JSON, body.as_bytes(), keep)
}

/// An error in the contract's shape: `{"error": message, "type": type}`.
pub fn error(
    to: &mut dyn Write,
    status: u16,
    kind: &str,
    message: &str,
    keep: bool,
) -> io::Result<()> {
    let body = format!(
        "{{\"error\":{},\"type\":{}}}",
        crate::json::quoted(message),
        crate::json::quoted(kind)
    );
    json(to, status, &body, keep)
}

/// A streamed answer: its head, then chunks.
pub struct Chunked<'a> {
    pub to: &'a mut UnixStream,
}

impl<'a> Chunked<'a> {
    pub fn start(
        to: &'a mut UnixStream,
        content_type: &str,
        extra: &str,
        keep: bool,
    ) -> io::Result<Self> {
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: {}\r\n{}{}transfer-encoding: chunked\r\n{}\r\n",
            content_type,
            extra,
            cors(),
            if keep { "" } else { "connection: close\r\n" }
        );
        to.write_all(head.as_bytes())?;
        Ok(Chunked { to })
    }
    pub fn send(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let mut all = format!("{:x}\r\n", data.len()).into_bytes();
        all.extend_from_slice(data);
        all.extend_from_slice(b"\r\n");
        self.to.write_all(&all)
    }
    pub fn end(self) -> io::Result<()> {
        self.to.write_all(b"0\r\n\r\n")
    }
}

/// Splits a target into its decoded path segments (empty ones dropped, as envd's router does)
/// and its query; None for a path that does not decode.
pub fn segments(target: &str) -> Option<(Vec<String>, String)> {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let mut out = Vec::new();
    for raw in path.split('/').filter(|s| !s.is_empty()) {
        out.push(percent_decode(raw)?);
    }
    Some((out, query.to_string()))
}

pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// One query parameter, decoded (`+` as a space, as URLSearchParams reads it).
pub fn query_param(query: &str, name: &str) -> Option<Option<String>> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(&k.replace('+', " "))?;
        if k == name {
            return Some(Some(percent_decode(&v.replace('+', " "))?));
        }
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn heads_and_paths() {
        let h = Head::parse(
            b"POST /exec HTTP/1.1\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\n".to_vec(),
        )
        .unwrap();
        assert_eq!(h.first[0], "POST");
        assert_eq!(h.request_framing(), Some(Framing::Length(5)));
        assert!(h.keep_alive());
        let h = Head::parse(
            b"GET / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\nx-m: caf\xe9\r\n\r\n"
                .to_vec(),
        )
        .unwrap();
        assert_eq!(h.field("x-m"), Some("caf\u{fffd}"));
        assert_eq!(h.request_framing(), None);
        assert_eq!(
            segments("//process//p%31/stdin?x=1"),
            Some((
                vec!["process".into(), "p1".into(), "stdin".into()],
                "x=1".into()
            ))
        );
        assert_eq!(segments("/a%zz"), None);
        assert_eq!(
            query_param("after=3&wait=10", "wait"),
            Some(Some("10".into()))
        );
        assert_eq!(query_param("after=3", "wait"), Some(None));
    }
}
