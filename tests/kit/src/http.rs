//! A scripted HTTP/1.1 server on 127.0.0.1, hand-written on a tokio `TcpListener` so each test
//! controls the bytes exactly. Each accepted connection serves one request and plays the next
//! script in line ([`Server::start`]); a connection past the last script gets `599`.
//!
//! Every wait is bounded by [`PATIENCE`]: a broken property fails, it never hangs.

use parking_lot::Mutex;
use serde_json::Value;
use std::{collections::VecDeque, net::SocketAddr, sync::Arc, time::Duration};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};

/// Bound on every wait of the server's helpers.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// What the server does on one connection, in order, after reading the request.
#[derive(Debug, Clone)]
pub enum Step {
    /// A complete response with `Content-Length` and `Connection: close`.
    Respond {
        /// The status code (any number; the reason phrase is always `X`).
        status: u16,
        /// Extra headers, written after `content-type: application/json`, `content-length`
        /// and `connection: close` (a repeated name is sent twice, not replaced).
        headers: Vec<(&'static str, String)>,
        /// The body, sent as is; `content-length` is its length in bytes.
        body: String,
    },
    /// `200` headers of a chunked `text/event-stream` body.
    SseHead,
    /// One HTTP chunk with these bytes.
    Chunk(String),
    /// The terminating zero-length chunk.
    EndChunks,
    /// Sends nothing for this long (the connection stays open), then goes on with the script.
    Pause(Duration),
    /// Reads until the client closes the connection, then reports it.
    AwaitClose,
}

/// A complete `200` response with this JSON body.
pub fn ok_json(body: Value) -> Step {
    Step::Respond {
        status: 200,
        headers: vec![],
        body: body.to_string(),
    }
}

/// A complete response with this status and body (sent as is, labelled `application/json`).
pub fn status(status: u16, body: &str) -> Step {
    Step::Respond {
        status,
        headers: vec![],
        body: body.into(),
    }
}

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The request line and headers, lower-cased.
    pub head: String,
    /// The JSON body (`Null` when there is none or it is not JSON).
    pub body: Value,
}

/// A running scripted server: the address to point a client at, and what it has seen.
///
/// It serves until the test's runtime shuts down; dropping the `Server` does not stop it.
pub struct Server {
    /// Where it listens.
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    closed: mpsc::UnboundedReceiver<()>,
}

impl Server {
    /// Binds a free port on 127.0.0.1 and serves connections in the background: the n-th
    /// accepted connection reads one request (recorded in [`requests`](Self::requests)), then
    /// plays `scripts[n]`, then closes. Connections past the last script get a `599`.
    ///
    /// Must be called inside a tokio runtime (it spawns the accept loop).
    ///
    /// # Panics
    /// If no port can be bound on 127.0.0.1.
    ///
    /// # Cancel safety
    /// Dropping the future before it resolves frees the port; nothing is served.
    pub async fn start(scripts: Vec<Vec<Step>>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (closed_tx, closed) = mpsc::unbounded_channel();
        let scripts = Arc::new(Mutex::new(VecDeque::from(scripts)));
        {
            let requests = requests.clone();
            tokio::spawn(async move {
                while let Ok((socket, _)) = listener.accept().await {
                    let script = scripts
                        .lock()
                        .pop_front()
                        .unwrap_or_else(|| vec![status(599, "no script left")]);
                    tokio::spawn(serve(socket, script, requests.clone(), closed_tx.clone()));
                }
            });
        }
        Server {
            addr,
            requests,
            closed,
        }
    }

    /// The requests seen so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().clone()
    }

    /// The JSON bodies of the requests seen so far, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests
            .lock()
            .iter()
            .map(|r| r.body.clone())
            .collect()
    }

    /// `http://ADDR{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Waits until the server saw a client close a connection it was holding open (a
    /// [`Step::AwaitClose`]); each close is reported once, to one call.
    ///
    /// # Panics
    /// If no client closes within [`PATIENCE`].
    ///
    /// # Cancel safety
    /// Cancel safe: a close seen meanwhile is kept for the next call.
    pub async fn client_closed(&mut self) {
        tokio::time::timeout(PATIENCE, self.closed.recv())
            .await
            .expect("the client never closed the connection")
            .expect("server gone");
    }
}

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null);
    Some(Recorded { head, body })
}

async fn serve(
    mut socket: TcpStream,
    script: Vec<Step>,
    requests: Arc<Mutex<Vec<Recorded>>>,
    closed: mpsc::UnboundedSender<()>,
) {
    let Some(request) = read_request(&mut socket).await else {
        return;
    };
    requests.lock().push(request);
    for step in script {
        let bytes = match step {
            Step::Respond {
                status,
                headers,
                body,
            } => {
                let mut head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: {}\r\nconnection: close\r\n",
                    body.len()
                );
                for (name, value) in headers {
                    head.push_str(&format!("{name}: {value}\r\n"));
                }
                format!("{head}\r\n{body}")
            }
            Step::SseHead => "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                              transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
                .to_owned(),
            Step::Chunk(data) => format!("{:x}\r\n{data}\r\n", data.len()),
            Step::EndChunks => "0\r\n\r\n".to_owned(),
            Step::Pause(d) => {
                tokio::time::sleep(d).await;
                continue;
            }
            Step::AwaitClose => {
                let mut sink = [0u8; 1024];
                loop {
                    match socket.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                let _ = closed.send(());
                return;
            }
        };
        if socket.write_all(bytes.as_bytes()).await.is_err() {
            return;
        }
    }
    // Dropping the socket closes the connection (mid-body if the script stopped there).
}

/// One SSE event in one chunk: `data: {json}` and the blank line that ends the event.
pub fn sse(data: Value) -> Step {
    Step::Chunk(format!("data: {data}\n\n"))
}

/// The OpenAI stream's end marker, `data: [DONE]`, in one chunk.
pub fn done() -> Step {
    Step::Chunk("data: [DONE]\n\n".into())
}
