//! The network side: a tokio TCP server on a runtime of its own. Each connection's lines go to
//! the world thread through a bounded channel with `try_send` (a full channel drops the line and
//! counts it: the tick never waits for the network, the network never waits for the tick); the
//! world's lines come back through the connection's own bounded queue.
//!
//! What one player can make the server do is bounded: a line is read into at most [`MAX_LINE`]
//! bytes (the rest of a longer line is read and thrown away, never buffered), bytes that are not
//! UTF-8 are read as Latin-1 (an old MUD client's `café` stays `café`; the connection stays
//! open), and a connection's lines are read at most `line_rate` a second (a burst of twice that):
//! a faster client waits in its own socket — TCP holds its flood back, at no cost to the world
//! or to anyone else.

use crate::{tick::Input, world::PlayerId};
use std::sync::{
    atomic::{AtomicU64, Ordering},
    mpsc::{Sender, SyncSender, TrySendError},
    Arc,
};
use tokio::{
    io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
    time::{Duration, Instant},
};

/// A connection's queue of lines to write.
const OUT_QUEUE: usize = 256;
/// Longest line read, in bytes (longer ones are cut while they are read).
pub const MAX_LINE: usize = 512;
/// Lines a second a connection is read at, by default (`--line-rate`; 0: no limit).
pub const LINE_RATE: u32 = 10;

#[derive(Debug, Default)]
pub struct NetStats {
    pub connections: AtomicU64,
    pub lines_in: AtomicU64,
    /// Lines dropped because the world's input channel was full.
    pub lines_dropped: AtomicU64,
    /// Lines longer than [`MAX_LINE`] (cut).
    pub lines_cut: AtomicU64,
    /// Lines that were not UTF-8 (read as Latin-1).
    pub lines_latin1: AtomicU64,
    /// Lines that waited for the connection's rate limit.
    pub lines_throttled: AtomicU64,
}

/// Accepts connections until the listener fails (the runtime's end stops it). Each connection's
/// lines are read at most `line_rate` a second (0: no limit).
pub async fn serve(
    listener: TcpListener,
    control: Sender<Input>,
    inputs: SyncSender<Input>,
    stats: Arc<NetStats>,
    line_rate: u32,
) {
    let mut next: PlayerId = 0;
    while let Ok((socket, _)) = listener.accept().await {
        next += 1;
        stats.connections.fetch_add(1, Ordering::Relaxed);
        let _ = socket.set_nodelay(true);
        tokio::spawn(connection(
            socket,
            next,
            control.clone(),
            inputs.clone(),
            stats.clone(),
            line_rate,
        ));
    }
}

/// A token bucket: `rate` lines a second, `2 × rate` at once.
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(rate: u32) -> Self {
        let rate = f64::from(rate);
        Bucket {
            rate,
            burst: 2.0 * rate,
            tokens: 2.0 * rate,
            at: Instant::now(),
        }
    }

    /// Takes one line's token: `None` at once, or how long to wait for it.
    fn take(&mut self) -> Option<Duration> {
        let now = Instant::now();
        self.tokens = (self.tokens + (now - self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
        self.tokens -= 1.0;
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / self.rate))
    }
}

/// One line read from `reader`: at most [`MAX_LINE`] bytes of it are kept in `buf` (cleared
/// first), the rest of the line is read and dropped. `Ok(None)` at the end of the stream;
/// otherwise whether the line was cut. A last line without its newline counts.
///
/// # Errors
/// The socket's.
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let (mut any, mut cut) = (false, false);
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(any.then_some(cut));
        }
        any = true;
        let (part, used, done) = match available.iter().position(|b| *b == b'\n') {
            Some(at) => (&available[..at], at + 1, true),
            None => (available, available.len(), false),
        };
        let room = MAX_LINE.saturating_sub(buf.len());
        cut |= part.len() > room;
        buf.extend_from_slice(&part[..part.len().min(room)]);
        reader.consume(used);
        if done {
            return Ok(Some(cut));
        }
    }
}

/// A line's text: UTF-8 when it is (in a `cut` line, a character the cut split is left out),
/// else Latin-1 (every byte its own character); a trailing `\r` dropped, and control characters
/// other than a tab shown as `\u{fffd}` (a player's text goes to other players' terminals).
/// `true` when it was read as Latin-1.
fn decode(bytes: &[u8], cut: bool) -> (String, bool) {
    let bytes = bytes.strip_suffix(b"\r").unwrap_or(bytes);
    let (text, latin1) = match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), false),
        // The cut fell inside a character: the whole characters before it.
        Err(e) if cut && e.error_len().is_none() => (
            String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned(),
            false,
        ),
        Err(_) => (bytes.iter().map(|&b| char::from(b)).collect(), true),
    };
    let clean = |c: char| {
        if c.is_control() && c != '\t' {
            '\u{fffd}'
        } else {
            c
        }
    };
    (text.chars().map(clean).collect(), latin1)
}

async fn connection(
    socket: TcpStream,
    id: PlayerId,
    control: Sender<Input>,
    inputs: SyncSender<Input>,
    stats: Arc<NetStats>,
    line_rate: u32,
) {
    let (read, mut write) = socket.into_split();
    let (out, mut lines_out) = tokio::sync::mpsc::channel::<String>(OUT_QUEUE);
    if control.send(Input::Join { id, out }).is_err() {
        return;
    }
    // The world's welcome first: the join is read before any of the player's lines is sent (the
    // two go through different channels).
    let Some(mut welcome) = lines_out.recv().await else {
        return;
    };
    welcome.push('\n');
    if write.write_all(welcome.as_bytes()).await.is_err() {
        return;
    }
    let writer = tokio::spawn(async move {
        while let Some(mut line) = lines_out.recv().await {
            line.push('\n');
            if write.write_all(line.as_bytes()).await.is_err() {
                break;
            }
        }
    });
    let mut reader = BufReader::new(read);
    let mut buf = Vec::with_capacity(MAX_LINE);
    let mut bucket = (line_rate > 0).then(|| Bucket::new(line_rate));
    loop {
        // The rate limit before the read: a flooding client's lines wait in its socket.
        if let Some(wait) = bucket.as_mut().and_then(Bucket::take) {
            stats.lines_throttled.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(wait).await;
        }
        let cut = match read_line(&mut reader, &mut buf).await {
            Ok(Some(cut)) => cut,
            Ok(None) | Err(_) => break,
        };
        let (line, latin1) = decode(&buf, cut);
        stats.lines_in.fetch_add(1, Ordering::Relaxed);
        stats.lines_cut.fetch_add(u64::from(cut), Ordering::Relaxed);
        stats
            .lines_latin1
            .fetch_add(u64::from(latin1), Ordering::Relaxed);
        let quit = matches!(line.trim(), "quit" | "exit");
        match inputs.try_send(Input::Line { id, line }) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                stats.lines_dropped.fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => break,
        }
        if quit {
            break;
        }
    }
    // After the player's lines, in the same channel; on the unbounded one if that is full (a
    // leave is never lost).
    if let Err(TrySendError::Full(leave)) = inputs.try_send(Input::Leave { id }) {
        let _ = control.send(leave);
    }
    // The world drops the connection's queue when the player leaves: the writer then ends.
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_decoded_as_utf8_or_latin1() {
        assert_eq!(
            decode(b"say caf\xc3\xa9\r", false),
            ("say café".into(), false)
        );
        assert_eq!(decode(b"say caf\xe9", false), ("say café".into(), true));
        // A cut inside a character leaves the character out.
        assert_eq!(decode(b"say caf\xc3", true), ("say caf".into(), false));
        assert_eq!(
            decode(b"say \x1b[2Jhi", false),
            ("say \u{fffd}[2Jhi".into(), false)
        );
    }

    #[tokio::test]
    async fn a_long_line_is_cut_while_it_is_read() {
        let mut long = vec![b'x'; 3 * MAX_LINE];
        long.extend_from_slice(b"\nlook\nlast");
        let mut reader = BufReader::with_capacity(64, &long[..]);
        let mut buf = Vec::new();
        assert_eq!(
            read_line(&mut reader, &mut buf).await.ok(),
            Some(Some(true))
        );
        assert_eq!(buf.len(), MAX_LINE);
        assert!(buf.capacity() < 2 * MAX_LINE, "{}", buf.capacity());
        assert_eq!(
            read_line(&mut reader, &mut buf).await.ok(),
            Some(Some(false))
        );
        assert_eq!(buf, b"look");
        assert_eq!(
            read_line(&mut reader, &mut buf).await.ok(),
            Some(Some(false))
        );
        assert_eq!(buf, b"last");
        assert_eq!(read_line(&mut reader, &mut buf).await.ok(), Some(None));
    }
}
