//! How fast `POST /api/halt` answers while the event stream is busy: starts a real `warden serve`
//! (the built binary next to this example, or `WARDEN_BIN`) on a fresh journal in a temporary
//! directory, opens `--subscribers` `GET /api/events` streams that read everything, floods
//! `POST /api/agents/{key}/events` from `--flood` connections, and every `--every-ms` sends
//! `POST /api/halt` (then resumes the agents so the flood keeps producing events), `--halts` times.
//! Prints the halt latency p50/p99/max as seen by the client, and what the flood and the streams did.
//!
//! ```sh
//! cargo build --release --bin warden --example halt_under_sse
//! target/release/examples/halt_under_sse                       # 50 subscribers, 32 flooders
//! target/release/examples/halt_under_sse --subscribers 0        # the baseline
//! ```
//! Bounded: `--halts` probes (default 100, 150 ms apart: about 15 s), then everything is stopped.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

const TOKEN: &str = "halt-under-sse";
const AGENTS: [&str; 3] = ["concierge", "researcher", "scribe"];

struct Options {
    subscribers: usize,
    flood: usize,
    halts: usize,
    every: Duration,
    bin: PathBuf,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        subscribers: 50,
        flood: 32,
        halts: 100,
        every: Duration::from_millis(150),
        bin: match std::env::var_os("WARDEN_BIN") {
            Some(bin) => PathBuf::from(bin),
            None => {
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let dir = exe
                    .parent()
                    .and_then(|examples| examples.parent())
                    .ok_or("cannot find the target directory")?;
                dir.join("warden")
            }
        },
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--subscribers" => options.subscribers = number()? as usize,
            "--flood" => options.flood = number()? as usize,
            "--halts" => options.halts = (number()? as usize).clamp(1, 10_000),
            "--every-ms" => options.every = Duration::from_millis(number()?.max(1)),
            "--bin" => options.bin = PathBuf::from(value),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(options)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = options()?;
    let dir = std::env::temp_dir().join(format!("warden-halt-under-sse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = Server(
        Command::new(&options.bin)
            .args(["serve", "--db"])
            .arg(dir.join("warden.db"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("WARDEN_ADMIN_TOKEN", TOKEN)
            .env_remove("WARDEN_READ_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", options.bin.display()))?,
    );
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await {
            if r.status().is_success() {
                break;
            }
        }
        if Instant::now() > deadline {
            return Err("warden serve did not come up".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let stream_bytes = Arc::new(AtomicU64::new(0));
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..options.subscribers {
        let (client, base, stop, bytes) = (
            reqwest::Client::new(),
            base.clone(),
            stop.clone(),
            stream_bytes.clone(),
        );
        tasks.push(tokio::spawn(async move {
            use futures::StreamExt;
            let Ok(response) = client
                .get(format!("{base}/api/events"))
                .bearer_auth(TOKEN)
                .send()
                .await
            else {
                return;
            };
            let mut body = response.bytes_stream();
            while let Some(Ok(chunk)) = body.next().await {
                bytes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }));
    }
    for i in 0..options.flood {
        let (client, base, stop, accepted, refused) = (
            reqwest::Client::new(),
            base.clone(),
            stop.clone(),
            accepted.clone(),
            refused.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let agent = AGENTS[(i + n) % AGENTS.len()];
                n += 1;
                let sent = client
                    .post(format!("{base}/api/agents/{agent}/events"))
                    .bearer_auth(TOKEN)
                    .json(&serde_json::json!({ "content": format!("flood {i} {n}") }))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status().as_u16() == 202 => accepted.fetch_add(1, Ordering::Relaxed),
                    Ok(_) => refused.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        0
                    }
                };
            }
        }));
    }
    // Let the load build up.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let started = Instant::now();
    let halter = reqwest::Client::new();
    let mut halts = Vec::with_capacity(options.halts);
    let mut failed = 0;
    for _ in 0..options.halts {
        tokio::time::sleep(options.every).await;
        let sent = Instant::now();
        let answer = halter
            .post(format!("{base}/api/halt"))
            .bearer_auth(TOKEN)
            .send()
            .await;
        let ok = match answer {
            Ok(r) => r.status().is_success() && r.bytes().await.is_ok(),
            Err(_) => false,
        };
        let took = sent.elapsed().as_secs_f64() * 1000.0;
        if ok {
            halts.push(took);
        } else {
            failed += 1;
        }
        for agent in AGENTS {
            let _ = halter
                .post(format!("{base}/api/agents/{agent}/resume"))
                .bearer_auth(TOKEN)
                .send()
                .await;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for task in &tasks {
        task.abort();
    }
    halts.sort_by(|a, b| a.total_cmp(b));
    println!(
        "halt under SSE: {} subscribers, {} flood connections, {} halts ({} failed) over {:.1} s",
        options.subscribers,
        options.flood,
        halts.len(),
        failed,
        elapsed
    );
    println!(
        "POST /api/halt ms: p50 {:.2}  p99 {:.2}  max {:.2}",
        percentile(&halts, 50.0),
        percentile(&halts, 99.0),
        halts.last().copied().unwrap_or(f64::NAN)
    );
    println!(
        "flood: {} accepted (202), {} refused; streams read {:.1} MB",
        accepted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
        stream_bytes.load(Ordering::Relaxed) as f64 / 1e6
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
