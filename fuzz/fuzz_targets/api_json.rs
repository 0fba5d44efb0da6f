//! What the HTTP API reads from a request: the JSON bodies (`POST /api/agents/{key}/events`,
//! `POST /api/interventions/{id}`, `POST /api/agents/{key}/world` — a world event, then classified
//! as an NPC would), the query strings (`?agent=`, `?limit=`, `?wait=`) and the operator's answer.
//!
//! Input: the first byte picks the parser, the rest is the body or query string.
#![no_main]

use libfuzzer_sys::fuzz_target;
use warden::server::api::{AnswerBody, EventsQuery, PostEventQuery, RecentQuery};
use warden_protocols::{npc::WorldEvent, Answer, UserEvent};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    match which % 5 {
        0 => {
            if let Ok(event) = serde_json::from_slice::<UserEvent>(rest) {
                let again = serde_json::to_vec(&event).expect("a parsed event serialises");
                let back: UserEvent = serde_json::from_slice(&again).expect("and parses back");
                assert_eq!(back.content, event.content);
            }
        }
        1 => {
            if let Ok(body) = serde_json::from_slice::<AnswerBody>(rest) {
                let _ = Answer::parse(&body.answer);
            }
        }
        2 => {
            let Ok(query) = std::str::from_utf8(rest) else {
                return;
            };
            let _ = serde_urlencoded::from_str::<EventsQuery>(query);
            let _ = serde_urlencoded::from_str::<RecentQuery>(query);
            if let Ok(q) = serde_urlencoded::from_str::<PostEventQuery>(query) {
                if let Some(wait) = q.wait {
                    let _ = warden::fuzzing::post_event_wait(&wait);
                }
            }
        }
        4 => {
            if let Ok(event) = serde_json::from_slice::<WorldEvent>(rest) {
                // The classification reads the player's text (the `@key` heuristic): no panic,
                // whatever it is, and the trust stays in 0..=1.
                for me in ["innkeeper", "é", ""] {
                    let seen = warden::npc::classify(me, &event, &Default::default(), true);
                    assert!((0.0..=1.0).contains(&seen.trust));
                }
                let mut buffer = warden::npc::ContextBuffer::new(4, 16);
                buffer.push(&event);
                assert!(buffer.tokens() <= 16);
            }
        }
        _ => {
            let text = String::from_utf8_lossy(rest);
            let _ = warden::fuzzing::post_event_wait(&text);
            let _ = Answer::parse(&text);
        }
    }
});
