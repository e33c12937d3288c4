//! A minimal HTTP/1.1 client for the job API (no client crate needed): one request per
//! connection, the whole answer read back.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// An HTTP answer.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
}

/// Sends `POST path` with `body` (and `Content-Length`), extra `headers`, and reads the answer
/// (a server may answer before the end, e.g. 413 or 401: write errors are ignored).
pub fn post(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
    let mut s = open(addr);
    write_head(&mut s, path, headers, Some(body.len()));
    let _ = s.write_all(body);
    read_answer(s)
}

/// As [`post`], the body sent with chunked transfer encoding in `chunk`-byte pieces (no
/// declared length); a server may answer before the end, so write errors are ignored.
pub fn post_chunked(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    chunk: usize,
) -> Answer {
    let mut s = open(addr);
    write_head(&mut s, path, headers, None);
    for piece in body.chunks(chunk) {
        if write!(s, "{:x}\r\n", piece.len()).is_err()
            || s.write_all(piece).is_err()
            || s.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let _ = s.write_all(b"0\r\n\r\n");
    read_answer(s)
}

/// Sends the head and body of `POST path` and returns the open connection (to close early).
pub fn post_open(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> TcpStream {
    let mut s = open(addr);
    write_head(&mut s, path, headers, Some(body.len()));
    s.write_all(body).unwrap();
    s
}

/// Sends the head of `POST path` declaring `declared` bytes, then only `part` of them, and
/// reads the answer (a client that stalls).
pub fn post_partial(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    declared: usize,
    part: &[u8],
) -> Answer {
    read_answer(post_started(addr, path, headers, declared, part))
}

/// As [`post_partial`], the connection left open: the rest is sent with [`finish`].
pub fn post_started(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    declared: usize,
    part: &[u8],
) -> TcpStream {
    let mut s = open(addr);
    write_head(&mut s, path, headers, Some(declared));
    s.write_all(part).unwrap();
    s
}

/// Sends the rest of a started body and reads the answer.
pub fn finish(mut s: TcpStream, rest: &[u8]) -> Answer {
    s.write_all(rest).unwrap();
    read_answer(s)
}

/// `GET path` with extra `headers`.
pub fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut s = open(addr);
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    read_answer(s)
}

fn open(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

fn write_head(s: &mut TcpStream, path: &str, headers: &[(&str, &str)], len: Option<usize>) {
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    match len {
        Some(n) => head.push_str(&format!("Content-Length: {n}\r\n\r\n")),
        None => head.push_str("Transfer-Encoding: chunked\r\n\r\n"),
    }
    s.write_all(head.as_bytes()).unwrap();
}

fn read_answer(mut s: TcpStream) -> Answer {
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Answer {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
    out
}
