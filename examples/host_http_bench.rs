//! The HTTP host path's figures (issue 37 §2): world events per second and the latency per event
//! through `POST /api/world/batch` against one `POST /api/agents/{key}/world` per event, in the
//! same run, on the same `warden serve` (started here on a temporary journal, the scripted model),
//! one keep-alive client, one request at a time.
//!
//! ```sh
//! cargo build --release --bin warden --example host_http_bench
//! target/release/examples/host_http_bench [--npcs 100] [--events 20000] [--batch 100]
//! ```
//!
//! It runs the `warden` binary next to its own directory (`target/<profile>/warden`). Two kinds of
//! line: room talk (`say`, an IGNORE: perceived and journaled, nothing queued) and whispers (a
//! TRIGGER: queued, acknowledged once durable, answered by the scripted model). The per-event
//! latency of a batch is its request's latency divided by the events in it; p99 is over requests.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const TOKEN: &str = "bench-host-token";

struct Args {
    npcs: usize,
    events: usize,
    batch: usize,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        npcs: 100,
        events: 20_000,
        batch: 100,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let n: usize = value
            .parse()
            .map_err(|_| format!("{flag}: {value:?} is not a number"))?;
        match flag.as_str() {
            "--npcs" => args.npcs = n.max(1),
            "--events" => args.events = n.max(1),
            "--batch" => args.batch = n.max(1),
            _ => return Err(format!("unknown flag {flag} (--npcs, --events, --batch)")),
        }
    }
    Ok(args)
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
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn event(npc: usize, kind: &str, i: usize) -> serde_json::Value {
    serde_json::json!({
        "npc": format!("npc{npc}"),
        "speaker": {"id": "p1", "kind": "player"},
        "kind": kind,
        "room": "tavern",
        "text": format!("line {i}"),
    })
}

/// Sends `events` events of `kind` one request each; returns (events/s, p50 and p99 µs per event).
async fn one_by_one(
    client: &reqwest::Client,
    base: &str,
    args: &Args,
    kind: &str,
) -> Result<(f64, f64, f64), String> {
    let mut lat = Vec::with_capacity(args.events);
    let started = Instant::now();
    for i in 0..args.events {
        let mut body = event(i % args.npcs, kind, i);
        let npc = body["npc"].as_str().unwrap_or_default().to_owned();
        if let Some(map) = body.as_object_mut() {
            map.remove("npc");
        }
        let t = Instant::now();
        let resp = client
            .post(format!("{base}/api/agents/{npc}/world"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        resp.bytes().await.map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
        if !status.is_success() {
            return Err(format!("POST /api/agents/{npc}/world: {status}"));
        }
    }
    let rate = args.events as f64 / started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok((rate, percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

/// Sends `events` events of `kind` in batches; returns (events/s, p50 and p99 µs per event).
async fn batched(
    client: &reqwest::Client,
    base: &str,
    args: &Args,
    kind: &str,
) -> Result<(f64, f64, f64), String> {
    let mut lat = Vec::new();
    let started = Instant::now();
    let mut sent = 0;
    while sent < args.events {
        let n = args.batch.min(args.events - sent);
        let events: Vec<_> = (sent..sent + n)
            .map(|i| event(i % args.npcs, kind, i))
            .collect();
        let t = Instant::now();
        let resp = client
            .post(format!("{base}/api/world/batch"))
            .bearer_auth(TOKEN)
            .json(&serde_json::json!({ "events": events }))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        resp.bytes().await.map_err(|e| e.to_string())?;
        lat.push(t.elapsed().as_secs_f64() * 1e6 / n as f64);
        if !status.is_success() {
            return Err(format!("POST /api/world/batch: {status}"));
        }
        sent += n;
    }
    let rate = args.events as f64 / started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    Ok((rate, percentile(&lat, 50.0), percentile(&lat, 99.0)))
}

async fn run(args: Args) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let warden: PathBuf = exe
        .parent()
        .and_then(|examples| examples.parent())
        .map(|profile| profile.join("warden"))
        .ok_or("cannot find target/<profile>/warden")?;
    let dir = std::env::temp_dir().join(format!("warden-host-http-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut team = format!(
        "[api]\nhost_tokens = [\"{TOKEN}\"]\nmax_batch_events = {}\nmax_body_bytes = 16777216\n\n\
         [providers.scripted]\nkind = \"scripted\"\nreplies = [\"aye\"]\n",
        args.batch
    );
    for i in 0..args.npcs {
        team.push_str(&format!(
            "\n[[agents]]\nkey = \"npc{i}\"\nprovider = \"scripted\"\n"
        ));
    }
    std::fs::write(dir.join("team.toml"), team).map_err(|e| e.to_string())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let _server = Server(
        Command::new(&warden)
            .args(["serve", "--config"])
            .arg(dir.join("team.toml"))
            .arg("--db")
            .arg(dir.join("warden.db"))
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("WARDEN_ADMIN_TOKEN", "bench-admin-token")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", warden.display()))?,
    );
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(r) = client.get(format!("{base}/healthz")).send().await {
            if r.status().is_success() {
                break;
            }
        }
        if Instant::now() > deadline {
            return Err("warden serve did not come up".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "{} NPCs, {} events per run, batches of {}, one keep-alive client",
        args.npcs, args.events, args.batch
    );
    println!(
        "{:<34} {:>12} {:>14} {:>14}",
        "path", "events/s", "p50 µs/event", "p99 µs/event"
    );
    for kind in ["say", "whisper"] {
        // Side by side, twice, so neither order nor warm-up favours one.
        for round in 0..2 {
            let (rate, p50, p99) = one_by_one(&client, &base, &args, kind).await?;
            println!(
                "{:<34} {rate:>12.0} {p50:>14.1} {p99:>14.1}",
                format!("{kind}: one request per event ({round})")
            );
            let (rate, p50, p99) = batched(&client, &base, &args, kind).await?;
            println!(
                "{:<34} {rate:>12.0} {p50:>14.1} {p99:>14.1}",
                format!("{kind}: /api/world/batch ({round})")
            );
        }
    }
    drop(_server);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("{err}");
            std::process::exit(1);
        }
    };
    if let Err(err) = runtime.block_on(run(args)) {
        eprintln!("{err}");
        std::process::exit(1);
    }
}
