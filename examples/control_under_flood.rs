//! How fast operator controls answer while ordinary work floods the server: starts a real
//! `warden serve` (the built binary next to this example, or `WARDEN_BIN`) on a fresh journal in a
//! temporary directory, with the default team or `--config FILE`, and measures, side by side in one
//! run, the round trips of `POST /api/halt` and of `POST /api/agents/{key}/resume` (every agent the
//! halt stopped), first without load, then while `--flood` connections send
//! `POST /api/agents/{key}/events` to `--agent` as fast as they are answered, then without load
//! again (the two quiet phases bracket the flood: a drift of the machine shows as a difference
//! between them). Prints p50/p99/max per phase, the flood's rate and answers, and the ratio flood /
//! quiet of the halt's and the resume's p99. A control that gets no answer within `--timeout-s`
//! counts as unanswered (the run then exits 1).
//!
//! ```sh
//! cargo build --release --bin warden --example control_under_flood
//! target/release/examples/control_under_flood                  # 32 flooders, 100 probes a phase
//! target/release/examples/control_under_flood --flood 64 --probes 200 --json
//! ```
//! Bounded: `--probes` rounds (halt, then resume of each stopped agent) a phase, `--every-ms` apart
//! (default 100 probes, 50 ms: about 20 s in all), then everything is stopped.
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

const TOKEN: &str = "control-under-flood";

struct Options {
    flood: usize,
    probes: usize,
    every: Duration,
    timeout: Duration,
    agent: String,
    config: Option<PathBuf>,
    bin: PathBuf,
    json: bool,
}

const USAGE: &str = "control_under_flood [--flood N] [--probes N] [--every-ms MS] [--timeout-s S] \
                     [--agent KEY] [--config TEAM.toml] [--bin WARDEN] [--json]";

fn options() -> Result<Options, String> {
    let mut options = Options {
        flood: 32,
        probes: 100,
        every: Duration::from_millis(50),
        timeout: Duration::from_secs(10),
        agent: "concierge".into(),
        config: None,
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
        json: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--json" {
            options.json = true;
            continue;
        }
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = args
            .next()
            .ok_or(format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--flood" => options.flood = (number()? as usize).clamp(1, 1024),
            "--probes" => options.probes = (number()? as usize).clamp(1, 10_000),
            "--every-ms" => options.every = Duration::from_millis(number()?),
            "--timeout-s" => options.timeout = Duration::from_secs(number()?.max(1)),
            "--agent" => options.agent = value,
            "--config" => options.config = Some(PathBuf::from(value)),
            "--bin" => options.bin = PathBuf::from(value),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    Ok(options)
}

/// The server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Round trips of one control in one phase, in milliseconds, and how many got no answer.
#[derive(Default)]
struct Probe {
    ms: Vec<f64>,
    unanswered: usize,
    refused: usize,
}

impl Probe {
    fn percentile(&self, p: f64) -> f64 {
        let mut sorted = self.ms.clone();
        sorted.sort_by(|a, b| a.total_cmp(b));
        if sorted.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
        sorted[rank.min(sorted.len() - 1)]
    }

    fn max(&self) -> f64 {
        self.ms.iter().copied().fold(f64::NAN, f64::max)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "n": self.ms.len(),
            "p50_ms": self.percentile(50.0),
            "p99_ms": self.percentile(99.0),
            "max_ms": self.max(),
            "unanswered": self.unanswered,
            "refused": self.refused,
        })
    }

    fn line(&self, what: &str) -> String {
        format!(
            "  {what:<28} n {:>4}  p50 {:>8.2}  p99 {:>8.2}  max {:>8.2} ms  unanswered {}  refused {}",
            self.ms.len(),
            self.percentile(50.0),
            self.percentile(99.0),
            self.max(),
            self.unanswered,
            self.refused
        )
    }
}

/// One phase's probes.
#[derive(Default)]
struct Phase {
    halt: Probe,
    resume: Probe,
    /// The server's own mean time for `POST /api/halt` in this phase (handler entered → every
    /// acknowledgement in, from `warden_api_halt_duration_seconds{scope="all"}`), in ms: what the
    /// round trip spends inside warden's halt rather than reaching it and answering.
    server_halt_mean_ms: f64,
}

/// `warden_api_halt_duration_seconds{scope="all"}`'s sum (seconds) and count, from `/metrics`.
async fn server_halt_totals(client: &reqwest::Client, base: &str) -> (f64, f64) {
    let text = match client
        .get(format!("{base}/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
    {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    let value = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (
        value("warden_api_halt_duration_seconds_sum{scope=\"all\"}"),
        value("warden_api_halt_duration_seconds_count{scope=\"all\"}"),
    )
}

/// Sends one control, timing it until the whole answer is read.
async fn timed(client: &reqwest::Client, url: String, timeout: Duration, into: &mut Probe) {
    let sent = Instant::now();
    let answer = tokio::time::timeout(timeout, async {
        let response = client.post(url).bearer_auth(TOKEN).send().await?;
        let status = response.status();
        response.bytes().await.map(|_| status)
    })
    .await;
    match answer {
        Ok(Ok(status)) if status.is_success() => {
            into.ms.push(sent.elapsed().as_secs_f64() * 1000.0)
        }
        Ok(Ok(_)) => into.refused += 1,
        Ok(Err(_)) | Err(_) => into.unanswered += 1,
    }
}

/// `--probes` rounds: `POST /api/halt`, then `POST /api/agents/{key}/resume` for every agent it
/// stopped (lifting the fleet halt agent by agent, so the next round halts running agents again).
async fn probe(base: &str, options: &Options) -> Phase {
    // One client, as an operator's tool would use: its connection is kept alive between probes.
    let client = reqwest::Client::new();
    let mut phase = Phase::default();
    let (sum_before, count_before) = server_halt_totals(&client, base).await;
    for _ in 0..options.probes {
        tokio::time::sleep(options.every).await;
        let sent = Instant::now();
        let answer = tokio::time::timeout(options.timeout, async {
            let response = client
                .post(format!("{base}/api/halt"))
                .bearer_auth(TOKEN)
                .send()
                .await?;
            let status = response.status();
            response
                .json::<serde_json::Value>()
                .await
                .map(|v| (status, v))
        })
        .await;
        let stopped: Vec<String> = match answer {
            Ok(Ok((status, body))) if status.is_success() => {
                phase.halt.ms.push(sent.elapsed().as_secs_f64() * 1000.0);
                body["halted"]
                    .as_array()
                    .map(|acks| {
                        acks.iter()
                            .filter(|a| a["state"] == "STOPPED")
                            .filter_map(|a| a["agent"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default()
            }
            Ok(Ok(_)) => {
                phase.halt.refused += 1;
                Vec::new()
            }
            Ok(Err(_)) | Err(_) => {
                phase.halt.unanswered += 1;
                Vec::new()
            }
        };
        for agent in stopped {
            let url = format!("{base}/api/agents/{agent}/resume");
            timed(&client, url, options.timeout, &mut phase.resume).await;
        }
    }
    let (sum_after, count_after) = server_halt_totals(&client, base).await;
    phase.server_halt_mean_ms = (sum_after - sum_before) / (count_after - count_before) * 1000.0;
    phase
}

/// What the flood did.
#[derive(Default)]
struct Flood {
    accepted: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    /// Refusals by status (409 stopped or locked out, 429 lane full, …).
    statuses: std::sync::Mutex<std::collections::BTreeMap<u16, u64>>,
}

impl Flood {
    fn refused_by_status(&self) -> String {
        let statuses = self.statuses.lock().map(|s| s.clone()).unwrap_or_default();
        let parts: Vec<String> = statuses.iter().map(|(s, n)| format!("{n} × {s}")).collect();
        parts.join(", ")
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = match options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let dir =
        std::env::temp_dir().join(format!("warden-control-under-flood-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let mut command = Command::new(&options.bin);
    command.args(["serve", "--db"]).arg(dir.join("warden.db"));
    if let Some(config) = &options.config {
        command.arg("--config").arg(config);
    }
    let _server = Server(
        command
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

    let quiet_before = probe(&base, &options).await;

    let stop = Arc::new(AtomicBool::new(false));
    let flood = Arc::new(Flood::default());
    let mut tasks = Vec::new();
    for i in 0..options.flood {
        let (client, url, stop, flood) = (
            reqwest::Client::new(),
            format!("{base}/api/agents/{}/events", options.agent),
            stop.clone(),
            flood.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let sent = client
                    .post(&url)
                    .bearer_auth(TOKEN)
                    .json(&serde_json::json!({ "content": format!("flood {i} {n}") }))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status().as_u16() == 202 => {
                        flood.accepted.fetch_add(1, Ordering::Relaxed)
                    }
                    Ok(r) => {
                        if let Ok(mut statuses) = flood.statuses.lock() {
                            *statuses.entry(r.status().as_u16()).or_default() += 1;
                        }
                        flood.refused.fetch_add(1, Ordering::Relaxed)
                    }
                    Err(_) => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        flood.failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
            }
        }));
    }
    // Let the load build up.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let flood_started = Instant::now();
    let before = flood.accepted.load(Ordering::Relaxed) + flood.refused.load(Ordering::Relaxed);
    let flooded = probe(&base, &options).await;
    let flood_seconds = flood_started.elapsed().as_secs_f64();
    let answered =
        flood.accepted.load(Ordering::Relaxed) + flood.refused.load(Ordering::Relaxed) - before;
    stop.store(true, Ordering::Relaxed);
    for task in &tasks {
        task.abort();
    }
    // Let the server drain what the flood queued before the second quiet phase.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let quiet_after = probe(&base, &options).await;

    let quiet_p99 = |pick: fn(&Phase) -> &Probe| {
        pick(&quiet_before)
            .percentile(99.0)
            .max(pick(&quiet_after).percentile(99.0))
    };
    let halt_ratio = flooded.halt.percentile(99.0) / quiet_p99(|p| &p.halt);
    let resume_ratio = flooded.resume.percentile(99.0) / quiet_p99(|p| &p.resume);
    let rate = answered as f64 / flood_seconds;
    let unanswered = [&quiet_before, &flooded, &quiet_after]
        .iter()
        .map(|p| p.halt.unanswered + p.resume.unanswered)
        .sum::<usize>();
    if options.json {
        let phase = |p: &Phase| {
            serde_json::json!({
                "halt": p.halt.json(),
                "resume": p.resume.json(),
                "server_halt_mean_ms": p.server_halt_mean_ms,
            })
        };
        let report = serde_json::json!({
            "flood_connections": options.flood,
            "probes": options.probes,
            "agent": options.agent,
            "quiet_before": phase(&quiet_before),
            "flooded": phase(&flooded),
            "quiet_after": phase(&quiet_after),
            "flood_requests_per_s": rate,
            "flood_accepted": flood.accepted.load(Ordering::Relaxed),
            "flood_refused": flood.refused.load(Ordering::Relaxed),
            "flood_failed": flood.failed.load(Ordering::Relaxed),
            "flood_refused_by_status": flood.refused_by_status(),
            "halt_p99_ratio": halt_ratio,
            "resume_p99_ratio": resume_ratio,
        });
        println!("{report}");
    } else {
        println!(
            "controls under a flood: {} connections on {}, {} probes a phase",
            options.flood, options.agent, options.probes
        );
        for (name, phase) in [
            ("quiet (before)", &quiet_before),
            ("flooded", &flooded),
            ("quiet (after)", &quiet_after),
        ] {
            println!("{name}:");
            println!("{}", phase.halt.line("POST /api/halt"));
            println!("{}", phase.resume.line("POST /api/agents/K/resume"));
            println!(
                "  {:<28} mean {:>8.2} ms (warden_api_halt_duration_seconds)",
                "halt inside the server", phase.server_halt_mean_ms
            );
        }
        println!(
            "flood: {rate:.0} answers/s during the probes; {} accepted (202), {} refused ({}), {} failed",
            flood.accepted.load(Ordering::Relaxed),
            flood.refused.load(Ordering::Relaxed),
            flood.refused_by_status(),
            flood.failed.load(Ordering::Relaxed)
        );
        println!(
            "p99 flooded / quiet (the worse quiet phase): halt {halt_ratio:.2}x, resume {resume_ratio:.2}x"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    if unanswered > 0 {
        eprintln!(
            "{unanswered} controls got no answer within {:?}",
            options.timeout
        );
        std::process::exit(1);
    }
    Ok(())
}
