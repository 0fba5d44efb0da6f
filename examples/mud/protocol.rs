//! The MUD's line protocol: one command a line, as a person types it into `nc`.
//!
//! `look`, `say TEXT`, `whisper NPC TEXT`, `emote TEXT`, `go DIR` (`north`, `south`, `east`,
//! `west` or their first letters), `@NPC TEXT` (said aloud, addressed to the NPC), `help`, `quit`.

/// A compass direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    North,
    South,
    East,
    West,
}

impl Dir {
    pub const ALL: [Dir; 4] = [Dir::North, Dir::South, Dir::East, Dir::West];

    pub fn parse(word: &str) -> Option<Dir> {
        match word {
            "n" | "north" => Some(Dir::North),
            "s" | "south" => Some(Dir::South),
            "e" | "east" => Some(Dir::East),
            "w" | "west" => Some(Dir::West),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dir::North => "north",
            Dir::South => "south",
            Dir::East => "east",
            Dir::West => "west",
        }
    }
}

/// One command of a player's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Look,
    Say(String),
    Whisper {
        npc: String,
        text: String,
    },
    Emote(String),
    Go(Dir),
    Address {
        npc: String,
        text: String,
    },
    Help,
    Quit,
    /// An empty line: nothing to do.
    Nothing,
    /// Anything else, with what was wrong.
    Invalid(&'static str),
}

/// Parses one line (trimmed; case-insensitive verbs).
pub fn parse(line: &str) -> Command {
    let line = line.trim();
    if line.is_empty() {
        return Command::Nothing;
    }
    if let Some(rest) = line.strip_prefix('@') {
        return match split_word(rest) {
            (npc, text) if !npc.is_empty() && !text.is_empty() => Command::Address {
                npc: npc.to_ascii_lowercase(),
                text: text.into(),
            },
            _ => Command::Invalid("usage: @NPC TEXT"),
        };
    }
    let (verb, rest) = split_word(line);
    match verb.to_ascii_lowercase().as_str() {
        "look" | "l" => Command::Look,
        "say" if !rest.is_empty() => Command::Say(rest.into()),
        "say" => Command::Invalid("usage: say TEXT"),
        "emote" | "me" if !rest.is_empty() => Command::Emote(rest.into()),
        "emote" | "me" => Command::Invalid("usage: emote TEXT"),
        "whisper" => match split_word(rest) {
            (npc, text) if !npc.is_empty() && !text.is_empty() => Command::Whisper {
                npc: npc.to_ascii_lowercase(),
                text: text.into(),
            },
            _ => Command::Invalid("usage: whisper NPC TEXT"),
        },
        "go" => Dir::parse(&rest.to_ascii_lowercase()).map_or(
            Command::Invalid("usage: go north|south|east|west"),
            Command::Go,
        ),
        word if Dir::parse(word).is_some() && rest.is_empty() => {
            Dir::parse(word).map_or(Command::Nothing, Command::Go)
        }
        "help" | "?" => Command::Help,
        "quit" | "exit" => Command::Quit,
        _ => Command::Invalid("unknown command (try: help)"),
    }
}

pub const HELP: &str =
    "commands: look | say TEXT | whisper NPC TEXT | emote TEXT | go DIR | @NPC TEXT | quit";

fn split_word(s: &str) -> (&str, &str) {
    let s = s.trim();
    match s.split_once(char::is_whitespace) {
        Some((word, rest)) => (word, rest.trim()),
        None => (s, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse() {
        assert_eq!(parse(" look "), Command::Look);
        assert_eq!(parse("say hello there"), Command::Say("hello there".into()));
        assert_eq!(
            parse("whisper NPC007 a secret"),
            Command::Whisper {
                npc: "npc007".into(),
                text: "a secret".into()
            }
        );
        assert_eq!(
            parse("@npc001 how much?"),
            Command::Address {
                npc: "npc001".into(),
                text: "how much?".into()
            }
        );
        assert_eq!(parse("go n"), Command::Go(Dir::North));
        assert_eq!(parse("west"), Command::Go(Dir::West));
        assert!(matches!(parse("go up"), Command::Invalid(_)));
        assert!(matches!(parse("@npc001"), Command::Invalid(_)));
        assert_eq!(parse(""), Command::Nothing);
    }
}
