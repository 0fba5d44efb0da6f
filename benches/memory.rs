//! Long-term memory (issue 33): the cost of recall per model call, and the bytes of an NPC's
//! memory after a game week. One NPC restored from a record holding `n` memories (a game week of
//! observations and facts from 50 players, 2,000 at the default `memory.max_memories`; 200 for the
//! comparison), a null journal. Each measured iteration is what a model call's recall does —
//! BM25 search over the FTS5 index, ranking, one hop of links, the profile, quoting into the
//! budget — through `AgentHandle::recall` (the same code as a turn's, without the `memory_recalled`
//! append). The index is built before the timing (a restart builds it at the first recall).
//! Besides criterion's estimate, each size prints p50/p99 of 2,000 single calls and the bytes.
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use warden::{
    memory::{Memory, MemoryKind},
    protocols::{memory::DAY_SECS, npc::SpeakerKind},
    AgentHandle, AgentRecord, AgentSpec, EventKind, NullJournal, ScriptStep, ScriptedProvider,
    Supervisor, WardenConfig,
};

const WORDS: [&str; 40] = [
    "sword", "river", "gold", "mayor", "bridge", "iron", "horse", "tavern", "storm", "king",
    "dragon", "wolf", "harvest", "market", "ale", "shield", "debt", "letter", "tower", "ship",
    "winter", "bread", "well", "forest", "ring", "map", "key", "guard", "temple", "coin", "anvil",
    "boots", "road", "north", "fire", "night", "song", "wedding", "thief", "price",
];

/// A deterministic sentence of 8–14 words (an xorshift over the memory's index).
fn sentence(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let n = 8 + next() % 7;
    (0..n)
        .map(|_| WORDS[(next() % WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A record with `n` memories spread over a game week: 9 observations to 1 fact, linked to the
/// memory before them.
fn record(n: u64) -> AgentRecord {
    let mut rec = AgentRecord::new("smith".into());
    for id in 0..n {
        let at = id as f64 * 7.0 * DAY_SECS / n as f64;
        let speaker = format!("p{}", id % 50);
        let kind = if id % 10 == 9 {
            MemoryKind::Fact {
                subject: speaker.clone(),
                predicate: "owes".into(),
                object: format!("{} coins", id % 97),
                confidence: 0.9,
                claim: id % 20 == 19,
                asserted_by: vec![speaker.clone()],
                sources: vec![id - 1],
                contradicted_by: None,
            }
        } else {
            MemoryKind::Observation {
                speaker: speaker.clone(),
                speaker_kind: SpeakerKind::Player,
                source: "whisper".into(),
                room: Some("forge".into()),
            }
        };
        let memory = Memory {
            id,
            kind,
            text: sentence(id),
            importance: (id % 10 + 1) as u8,
            trust: 0.9,
            at,
            accessed: at,
            links: if id > 0 { vec![id - 1] } else { Vec::new() },
        };
        rec.apply(&EventKind::MemoryStored {
            memory: Box::new(memory),
            evicted: Vec::new(),
            observed: None,
        });
    }
    rec
}

fn npc(n: u64) -> (Supervisor, AgentHandle) {
    let mut config = WardenConfig::default();
    config.memory.long_term = true;
    config.memory.max_memories = 2000;
    let team = Supervisor::builder(config, Arc::new(NullJournal::default()))
        .current_arbiter()
        .build();
    let provider = Arc::new(ScriptedProvider::new([]).with_fallback(|_| ScriptStep::reply("ok")));
    let npc = team
        .spawn(AgentSpec::assistant("smith", provider).restored_from(record(n)))
        .expect("spawn");
    (team, npc)
}

fn recall(c: &mut Criterion) {
    let sys = actix_rt::System::new();
    let mut group = c.benchmark_group("memory_recall");
    group.measurement_time(Duration::from_secs(5));
    for n in [200u64, 2000] {
        let (_team, npc) = sys.block_on(async { npc(n) });
        // Builds the index (a restart's first recall).
        let _ = npc.recall("p7", Some("warm up"));
        let question = |i: u64| {
            format!(
                "do you remember the {} and the {}?",
                WORDS[(i % 40) as usize],
                WORDS[(i * 7 % 40) as usize]
            )
        };
        let mut samples: Vec<Duration> = (0..2000u64)
            .map(|i| {
                let q = question(i);
                let t = Instant::now();
                let text = npc.recall(&format!("p{}", i % 50), Some(&q));
                let spent = t.elapsed();
                assert!(text.is_some());
                spent
            })
            .collect();
        samples.sort();
        let store = npc.record();
        let store = store.memory().expect("memories");
        let json = serde_json::to_vec(store).expect("json").len();
        println!(
            "memory_recall/{n}: p50 {:.1} µs, p99 {:.1} µs per recall; store {} memories, {} B accounted ({:.0} B/memory), {} B as JSON",
            samples[samples.len() / 2].as_secs_f64() * 1e6,
            samples[samples.len() * 99 / 100].as_secs_f64() * 1e6,
            store.memories.len(),
            store.bytes,
            store.bytes as f64 / store.memories.len() as f64,
            json
        );
        let mut i = 0u64;
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| {
                i += 1;
                npc.recall(&format!("p{}", i % 50), Some(&question(i)))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, recall);
criterion_main!(benches);
