//! The world: 50 rooms on a 10 × 5 grid, the players in them and where the NPCs stand. Owned by
//! the world thread alone (no lock); players are reached through bounded channels whose sends
//! never wait (a full one drops the line and counts it).

use crate::protocol::{Command, Dir, HELP};
use std::collections::HashMap;
use tokio::sync::mpsc::Sender;
use warden::protocols::{
    npc::{Speaker, SpeakerKind, WorldEvent, WorldEventKind},
    AgentKey,
};

pub const ROOMS: usize = 50;
const WIDTH: usize = 10;

/// NPC number `i`'s key.
pub fn npc_key(i: usize) -> String {
    format!("npc{i:03}")
}

/// The room NPC number `i` stands in (spread evenly over the rooms).
pub fn npc_room(i: usize) -> usize {
    i % ROOMS
}

pub fn room_name(room: usize) -> String {
    format!("room-{room:02}")
}

/// The room `dir` leads to from `room`, if there is an exit that way into the first `zone` rooms
/// (the ones players may enter).
pub fn exit(room: usize, dir: Dir, zone: usize) -> Option<usize> {
    let (x, y) = (room % WIDTH, room / WIDTH);
    let rows = ROOMS / WIDTH;
    let to = match dir {
        Dir::North if y > 0 => room - WIDTH,
        Dir::South if y + 1 < rows => room + WIDTH,
        Dir::West if x > 0 => room - 1,
        Dir::East if x + 1 < WIDTH => room + 1,
        _ => return None,
    };
    (to < zone).then_some(to)
}

pub type PlayerId = u64;

struct Player {
    name: String,
    room: usize,
    out: Sender<String>,
}

#[derive(Default)]
struct Room {
    players: Vec<PlayerId>,
    npcs: Vec<AgentKey>,
}

/// What the world counted.
#[derive(Debug, Default, Clone, Copy)]
pub struct WorldCounts {
    pub commands: u64,
    /// Lines to players dropped because their connection's queue was full.
    pub lines_dropped: u64,
    pub lines_sent: u64,
}

pub struct World {
    rooms: Vec<Room>,
    players: HashMap<PlayerId, Player>,
    npc_rooms: HashMap<AgentKey, usize>,
    /// Players join and move in rooms `0..zone` only; the NPCs elsewhere hear nothing.
    zone: usize,
    pub counts: WorldCounts,
}

impl World {
    /// The world with `npcs` NPCs placed, players kept to the first `zone` rooms (1 to
    /// [`ROOMS`]).
    pub fn new(npcs: usize, zone: usize) -> Self {
        let mut rooms: Vec<Room> = (0..ROOMS).map(|_| Room::default()).collect();
        let mut npc_rooms = HashMap::new();
        for i in 0..npcs {
            let key = AgentKey::from(npc_key(i));
            rooms[npc_room(i)].npcs.push(key.clone());
            npc_rooms.insert(key, npc_room(i));
        }
        World {
            rooms,
            players: HashMap::new(),
            npc_rooms,
            zone: zone.clamp(1, ROOMS),
            counts: WorldCounts::default(),
        }
    }

    pub fn join(&mut self, id: PlayerId, out: Sender<String>) {
        let room = (id as usize) % self.zone;
        let name = format!("p{id}");
        self.tell_player(&out, format!("Welcome, {name}. {HELP}"));
        self.players.insert(id, Player { name, room, out });
        self.rooms[room].players.push(id);
        self.look(id);
    }

    pub fn leave(&mut self, id: PlayerId) {
        if let Some(player) = self.players.remove(&id) {
            self.rooms[player.room].players.retain(|p| *p != id);
        }
    }

    /// Runs a player's command: lines to players now, world events for the NPCs into `events`.
    /// Returns `false` when the player quits.
    pub fn command(
        &mut self,
        id: PlayerId,
        command: Command,
        events: &mut Vec<(AgentKey, WorldEvent)>,
    ) -> bool {
        let Some(player) = self.players.get(&id) else {
            return true;
        };
        self.counts.commands += 1;
        let (name, room) = (player.name.clone(), player.room);
        match command {
            Command::Look => self.look(id),
            Command::Say(text) => {
                self.show_room(room, Some(id), &format!("{name} says: {text}"));
                self.tell(id, format!("You say: {text}"));
                self.hear_npcs(
                    room,
                    player_event(&name, WorldEventKind::Say, room, text, Some(vec![])),
                    events,
                );
            }
            Command::Emote(text) => {
                self.show_room(room, None, &format!("{name} {text}"));
                self.hear_npcs(
                    room,
                    player_event(&name, WorldEventKind::Emote, room, text, Some(vec![])),
                    events,
                );
            }
            Command::Address { npc, text } => {
                if !self.npc_here(&npc, room) {
                    self.tell(id, format!("There is no {npc} here."));
                    return true;
                }
                self.show_room(room, Some(id), &format!("{name} says to {npc}: {text}"));
                self.tell(id, format!("You say to {npc}: {text}"));
                let event = player_event(&name, WorldEventKind::Say, room, text, Some(vec![npc]));
                self.hear_npcs(room, event, events);
            }
            Command::Whisper { npc, text } => {
                if !self.npc_here(&npc, room) {
                    self.tell(id, format!("There is no {npc} here."));
                    return true;
                }
                self.tell(id, format!("You whisper to {npc}: {text}"));
                let event = player_event(&name, WorldEventKind::Whisper, room, text, None);
                events.push((AgentKey::from(npc), event));
            }
            Command::Go(dir) => match exit(room, dir, self.zone) {
                Some(to) => {
                    self.show_room(room, Some(id), &format!("{name} leaves {}.", dir.name()));
                    self.rooms[room].players.retain(|p| *p != id);
                    self.rooms[to].players.push(id);
                    if let Some(player) = self.players.get_mut(&id) {
                        player.room = to;
                    }
                    self.show_room(to, Some(id), &format!("{name} arrives."));
                    self.look(id);
                }
                None => self.tell(id, "You can't go that way.".into()),
            },
            Command::Help => self.tell(id, HELP.into()),
            Command::Quit => {
                self.tell(id, "Bye.".into());
                self.leave(id);
                return false;
            }
            Command::Nothing => {}
            Command::Invalid(why) => self.tell(id, why.into()),
        }
        true
    }

    /// An NPC's line: shown to the players in its room; handed to the other NPCs there as an NPC's
    /// words (its `@mentions` resolved by the server, so an NPC can address another one).
    pub fn npc_says(
        &mut self,
        npc: &AgentKey,
        line: &str,
        events: &mut Vec<(AgentKey, WorldEvent)>,
    ) {
        let Some(&room) = self.npc_rooms.get(npc) else {
            return;
        };
        self.show_room(room, None, &format!("{npc} says: {line}"));
        let mentions: Vec<String> = line
            .split_whitespace()
            .filter_map(|w| w.strip_prefix('@'))
            .map(|w| {
                w.trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
                    .to_owned()
            })
            .filter(|w| self.npc_here(w, room))
            .collect();
        let mut event = WorldEvent {
            speaker: Speaker {
                id: npc.to_string(),
                kind: SpeakerKind::Npc,
            },
            kind: WorldEventKind::Say,
            room: Some(room_name(room)),
            text: line.into(),
            mentions: Some(mentions),
            oob: Default::default(),
        };
        event.oob.assistant_message = true;
        for other in &self.rooms[room].npcs {
            if other != npc {
                events.push((other.clone(), event.clone()));
            }
        }
    }

    fn npc_here(&self, npc: &str, room: usize) -> bool {
        self.npc_rooms.get(npc) == Some(&room)
    }

    fn look(&mut self, id: PlayerId) {
        let Some(player) = self.players.get(&id) else {
            return;
        };
        let room = &self.rooms[player.room];
        let exits: Vec<&str> = Dir::ALL
            .iter()
            .filter(|d| exit(player.room, **d, self.zone).is_some())
            .map(|d| d.name())
            .collect();
        let npcs: Vec<&str> = room.npcs.iter().map(AgentKey::as_str).collect();
        let others: Vec<&str> = room
            .players
            .iter()
            .filter(|p| **p != id)
            .filter_map(|p| self.players.get(p).map(|p| p.name.as_str()))
            .collect();
        let text = format!(
            "You are in {}. Exits: {}. NPCs here: {}. Players here: {}.",
            room_name(player.room),
            exits.join(" "),
            npcs.join(" "),
            if others.is_empty() {
                "nobody".into()
            } else {
                others.join(" ")
            },
        );
        self.tell(id, text);
    }

    fn tell(&mut self, id: PlayerId, line: String) {
        if let Some(player) = self.players.get(&id) {
            let out = player.out.clone();
            self.tell_player(&out, line);
        }
    }

    fn tell_player(&mut self, out: &Sender<String>, line: String) {
        match out.try_send(line) {
            Ok(()) => self.counts.lines_sent += 1,
            Err(_) => self.counts.lines_dropped += 1,
        }
    }

    fn show_room(&mut self, room: usize, except: Option<PlayerId>, line: &str) {
        let ids: Vec<PlayerId> = self.rooms[room]
            .players
            .iter()
            .copied()
            .filter(|p| Some(*p) != except)
            .collect();
        for id in ids {
            self.tell(id, line.to_owned());
        }
    }

    fn hear_npcs(&self, room: usize, event: WorldEvent, events: &mut Vec<(AgentKey, WorldEvent)>) {
        for npc in &self.rooms[room].npcs {
            events.push((npc.clone(), event.clone()));
        }
    }
}

fn player_event(
    name: &str,
    kind: WorldEventKind,
    room: usize,
    text: String,
    mentions: Option<Vec<String>>,
) -> WorldEvent {
    let mut event = WorldEvent::player(name, kind, text).in_room(room_name(room));
    event.mentions = mentions;
    event
}
