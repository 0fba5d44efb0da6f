//! The network side: a tokio TCP server on a runtime of its own. Each connection's lines go to
//! the world thread through a bounded channel with `try_send` (a full channel drops the line and
//! counts it: the tick never waits for the network, the network never waits for the tick); the
//! world's lines come back through the connection's own bounded queue.

use crate::{tick::Input, world::PlayerId};
use std::sync::{
    atomic::{AtomicU64, Ordering},
    mpsc::{Sender, SyncSender, TrySendError},
    Arc,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::{TcpListener, TcpStream},
};

/// A connection's queue of lines to write.
const OUT_QUEUE: usize = 256;
/// Longest line read (longer ones are cut).
const MAX_LINE: usize = 512;

#[derive(Debug, Default)]
pub struct NetStats {
    pub connections: AtomicU64,
    pub lines_in: AtomicU64,
    /// Lines dropped because the world's input channel was full.
    pub lines_dropped: AtomicU64,
}

/// Accepts connections until the listener fails (the runtime's end stops it).
pub async fn serve(
    listener: TcpListener,
    control: Sender<Input>,
    inputs: SyncSender<Input>,
    stats: Arc<NetStats>,
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
        ));
    }
}

async fn connection(
    socket: TcpStream,
    id: PlayerId,
    control: Sender<Input>,
    inputs: SyncSender<Input>,
    stats: Arc<NetStats>,
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
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(mut line)) = lines.next_line().await {
        if line.len() > MAX_LINE {
            let mut cut = MAX_LINE;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        stats.lines_in.fetch_add(1, Ordering::Relaxed);
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
