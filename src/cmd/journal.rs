//! `warden journal DB tail | show | export`: read-only views of a journal file.

use crate::JournalAction;
use std::{path::Path, process::ExitCode};

pub(crate) fn journal(db: &Path, action: JournalAction) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    super::finish(match action {
        JournalAction::Tail { lines, json } => warden::journal::tail(db, lines, json, &mut stdout),
        JournalAction::Show { agent, json } => warden::journal::show(db, &agent, json, &mut stdout),
        JournalAction::Export { json: _ } => warden::journal::export_json(db, &mut stdout),
    })
}
