//! [`CappedLines`]: a reader over an MCP child's stdout that never lets one JSON-RPC line grow past a
//! cap. A line over the cap is cut, the rest of it is skipped as it arrives (no allocation of its
//! size), and an error response for the request id found at the start of the line is put in its
//! place, so the call it answered fails at once with a clear message instead of timing out.

use std::{
    pin::Pin,
    task::{Context, Poll},
};
use tokio::io::{AsyncRead, ReadBuf};

/// How many bytes at the start of a line are kept to find its `"id"`.
const HEAD: usize = 512;

/// A reader that cuts lines longer than `cap` bytes (see the module docs).
#[derive(Debug)]
pub(crate) struct CappedLines<R> {
    inner: R,
    cap: usize,
    /// Bytes of the current line passed on so far.
    line: usize,
    /// The first bytes of the current line.
    head: Vec<u8>,
    /// Skipping the rest of an over-size line until its newline.
    skipping: bool,
    /// Bytes to hand out before reading more (the error line standing in for a cut line).
    pending: Vec<u8>,
    scratch: Vec<u8>,
}

impl<R> CappedLines<R> {
    pub(crate) fn new(inner: R, cap: usize) -> Self {
        CappedLines {
            inner,
            cap: cap.max(HEAD),
            line: 0,
            head: Vec::with_capacity(HEAD),
            skipping: false,
            pending: Vec::new(),
            scratch: vec![0; 64 * 1024],
        }
    }

    /// The line standing in for a cut one: ends the partial line, then an error response for its
    /// id (or nothing if none was found: the call then times out).
    fn stand_in(&self) -> Vec<u8> {
        let mut out = b"\n".to_vec();
        if let Some(id) = find_id(&self.head) {
            let message = format!(
                "the server's message was over {} bytes (max_result_bytes) and was dropped",
                self.cap
            );
            let line = serde_json::json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {"code": -32099, "message": message},
            });
            out.extend_from_slice(line.to_string().as_bytes());
            out.push(b'\n');
        }
        out
    }

    /// Passes `data` on into `buf` (which has room for all of it), cutting over-size lines.
    fn filter(&mut self, data: &[u8], buf: &mut ReadBuf<'_>) {
        let mut rest = data;
        while !rest.is_empty() {
            if self.skipping {
                match rest.iter().position(|&b| b == b'\n') {
                    Some(at) => {
                        self.skipping = false;
                        self.line = 0;
                        self.head.clear();
                        rest = &rest[at + 1..];
                    }
                    None => return,
                }
                continue;
            }
            let end = rest.iter().position(|&b| b == b'\n');
            let chunk_len = end.map_or(rest.len(), |at| at + 1);
            let room = self.cap - self.line;
            if chunk_len > room {
                // This line goes over the cap: pass on what fits, then the stand-in.
                let (fits, _) = rest.split_at(room.min(rest.len()));
                self.keep_head(fits);
                buf.put_slice(fits);
                self.pending = self.stand_in();
                self.skipping = true;
                rest = &rest[fits.len()..];
                continue;
            }
            let (chunk, after) = rest.split_at(chunk_len);
            self.keep_head(chunk);
            buf.put_slice(chunk);
            if end.is_some() {
                self.line = 0;
                self.head.clear();
            } else {
                self.line += chunk.len();
            }
            rest = after;
        }
    }

    fn keep_head(&mut self, chunk: &[u8]) {
        let take = HEAD.saturating_sub(self.head.len()).min(chunk.len());
        self.head.extend_from_slice(&chunk[..take]);
    }
}

/// The JSON-RPC id at the start of a message (`"id":7` or `"id":"x"`), if it comes early.
fn find_id(head: &[u8]) -> Option<serde_json::Value> {
    let text = String::from_utf8_lossy(head);
    let at = text.find("\"id\"")?;
    let after = text[at + 4..].trim_start().strip_prefix(':')?.trim_start();
    if let Some(s) = after.strip_prefix('"') {
        let end = s.find('"')?;
        return Some(serde_json::Value::String(s[..end].to_owned()));
    }
    let digits: String = after
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse::<i64>().ok().map(serde_json::Value::from)
}

impl<R: AsyncRead + Unpin> AsyncRead for CappedLines<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.drain(..n);
                return Poll::Ready(Ok(()));
            }
            let want = buf.remaining().min(this.scratch.len());
            if want == 0 {
                return Poll::Ready(Ok(()));
            }
            let mut scratch = std::mem::take(&mut this.scratch);
            let mut read = ReadBuf::new(&mut scratch[..want]);
            let polled = Pin::new(&mut this.inner).poll_read(cx, &mut read);
            let filled = read.filled().len();
            let pending = polled.is_pending();
            let result = match polled {
                Poll::Pending => None,
                Poll::Ready(Err(e)) => Some(Err(e)),
                Poll::Ready(Ok(())) if filled == 0 => Some(Ok(())), // EOF
                Poll::Ready(Ok(())) => {
                    let before = buf.filled().len();
                    this.filter(&scratch[..filled], buf);
                    let passed = buf.filled().len() > before;
                    if passed || !this.pending.is_empty() {
                        Some(Ok(()))
                    } else {
                        None // all skipped: read again
                    }
                }
            };
            this.scratch = scratch;
            match result {
                Some(Ok(())) if !this.pending.is_empty() && buf.remaining() > 0 => continue,
                Some(r) => return Poll::Ready(r),
                None if pending => return Poll::Pending,
                None => continue,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn run(input: Vec<u8>, cap: usize) -> String {
        let mut out = String::new();
        CappedLines::new(&input[..], cap)
            .read_to_string(&mut out)
            .await
            .expect("read");
        out
    }

    #[tokio::test]
    async fn short_lines_pass_unchanged() {
        let text = "{\"id\":1}\n{\"id\":2}\n".repeat(100);
        assert_eq!(run(text.clone().into_bytes(), 600).await, text);
    }

    #[tokio::test]
    async fn an_over_size_line_becomes_an_error_for_its_id() {
        let big = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":42,\"result\":\"{}\"}}\n{{\"id\":43}}\n",
            "x".repeat(5_000_000)
        );
        let out = run(big.into_bytes(), 1000).await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{}", out.len());
        assert_eq!(lines[0].len(), 1000);
        let error: serde_json::Value = serde_json::from_str(lines[1]).expect("json");
        assert_eq!(error["id"], 42);
        assert!(error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("over 1000 bytes")));
        assert_eq!(lines[2], "{\"id\":43}");
    }

    #[test]
    fn ids_are_found_as_numbers_or_strings() {
        assert_eq!(
            find_id(br#"{"jsonrpc":"2.0","id": "a-1","#),
            Some("a-1".into())
        );
        assert_eq!(find_id(br#"{"id":7,"#), Some(7.into()));
        assert_eq!(find_id(br#"{"result":"#), None);
    }
}
