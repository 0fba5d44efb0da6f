//! Stdio servers never outlive warden: each child runs in its own process group, gets `SIGKILL`
//! when warden dies ([`set_parent_death_signal`], Linux), the whole group is killed when warden
//! ends it ([`kill_group`]), and the groups of a run are recorded in a small file
//! ([`GroupRecord`]) so that the next start ends those a `SIGKILL`ed warden left behind
//! (grandchildren keep running after their parent dies; the death signal reaches only the child).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// Sets `SIGKILL` as the parent-death signal of the child `cmd` spawns (Linux): if warden dies,
/// even by `SIGKILL`, the child is killed. The signal follows the thread that spawned the child;
/// the hub spawns from its runtime's threads, which live as long as the runtime.
#[cfg(target_os = "linux")]
pub(crate) fn set_parent_death_signal(cmd: &mut tokio::process::Command) {
    // SAFETY: `getpid` before the fork; in the child (between fork and exec) only `prctl`,
    // `getppid` and `raise`, which are async-signal-safe system calls that touch no memory of
    // the parent (no allocation, no lock).
    let parent = unsafe { libc::getpid() };
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Warden died between the fork and the prctl: the signal will never come.
            if libc::getppid() != parent {
                libc::raise(libc::SIGKILL);
            }
            Ok(())
        });
    }
}

/// No parent-death signal outside Linux (the next start still ends the recorded groups where
/// `/proc` exists, i.e. nowhere else: see [`GroupRecord`]).
#[cfg(not(target_os = "linux"))]
pub(crate) fn set_parent_death_signal(_cmd: &mut tokio::process::Command) {}

/// Kills the process group `child` leads (it was spawned with `process_group(0)`), so what it
/// started dies with it; the child itself too. Nothing once the child has been reaped (its id, and
/// so its group's, may belong to someone else by then).
pub(crate) fn kill_group(child: &mut tokio::process::Child) {
    #[cfg(unix)]
    if let Some(pid) = child.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
        // SAFETY: a plain system call; the group is the child's own (not yet reaped: its id is
        // still held).
        unsafe {
            libc::killpg(pid, libc::SIGKILL);
        }
    }
    let _ = child.start_kill();
}

/// One recorded group: its leader's id (= the group's id) and start time, as `/proc` shows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Group {
    pgid: i32,
    /// The leader's start time (clock ticks since boot, field 22 of `/proc/PID/stat`).
    started: u64,
}

/// The process groups of the stdio servers of one warden, written to a file next to its journal
/// (`JOURNAL.mcp-groups`): one line `boot BOOT_ID`, then one line `PGID START_TIME SERVER` a
/// server. Rewritten (write and rename) whenever a server is spawned; emptied when the hub shuts
/// down.
#[derive(Debug)]
pub(crate) struct GroupRecord {
    path: PathBuf,
    groups: parking_lot::Mutex<BTreeMap<String, Group>>,
}

impl GroupRecord {
    /// Ends the groups a previous run recorded at `path` that are still running (and are still the
    /// same processes: same boot, same leader start time, or a group whose leader is gone but whose
    /// members are left), then starts an empty record there. Returns the groups ended, as
    /// `(server, pgid)`.
    pub(crate) fn take_over(path: &Path) -> (Self, Vec<(String, i32)>) {
        let ended = match std::fs::read_to_string(path) {
            Ok(text) => end_left_over(&text),
            Err(_) => Vec::new(),
        };
        let record = GroupRecord {
            path: path.to_owned(),
            groups: parking_lot::Mutex::new(BTreeMap::new()),
        };
        record.write();
        (record, ended)
    }

    /// Notes that `server` now runs as the group `pgid` (a spawn or a restart).
    pub(crate) fn spawned(&self, server: &str, pgid: u32) {
        let Ok(pgid) = i32::try_from(pgid) else {
            return;
        };
        let Some(started) = start_time(pgid) else {
            return;
        };
        self.groups
            .lock()
            .insert(server.to_owned(), Group { pgid, started });
        self.write();
    }

    /// Forgets every group (the hub ended them).
    pub(crate) fn clear(&self) {
        self.groups.lock().clear();
        self.write();
    }

    fn write(&self) {
        let mut text = match boot_id() {
            Some(boot) => format!("boot {boot}\n"),
            None => String::new(),
        };
        for (server, group) in self.groups.lock().iter() {
            text.push_str(&format!("{} {} {server}\n", group.pgid, group.started));
        }
        let tmp = self.path.with_extension("mcp-groups.tmp");
        let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            tracing::warn!(
                path = %self.path.display(),
                "cannot record the MCP servers' process groups ({e}): a server left running by a \
                 killed warden would not be ended at the next start"
            );
        }
    }
}

/// Kills the groups of a record that still run as recorded; returns them.
fn end_left_over(text: &str) -> Vec<(String, i32)> {
    let mut lines = text.lines();
    let same_boot = match (
        lines.next().and_then(|l| l.strip_prefix("boot ")),
        boot_id(),
    ) {
        (Some(recorded), Some(now)) => recorded.trim() == now,
        _ => false,
    };
    if !same_boot {
        return Vec::new(); // a reboot ended them all; the ids mean nothing now
    }
    let mut ended = Vec::new();
    for line in lines {
        let mut parts = line.splitn(3, ' ');
        let (Some(pgid), Some(started), Some(server)) = (
            parts.next().and_then(|p| p.parse::<i32>().ok()),
            parts.next().and_then(|s| s.parse::<u64>().ok()),
            parts.next(),
        ) else {
            continue;
        };
        // SAFETY: a plain system call.
        #[cfg(unix)]
        let own = unsafe { libc::getpgrp() };
        #[cfg(not(unix))]
        let own = 0;
        if pgid <= 1 || pgid == own || !still_ours(pgid, started) {
            continue;
        }
        #[cfg(unix)]
        // SAFETY: a plain system call on a group checked to be the one recorded.
        let killed = unsafe { libc::killpg(pgid, libc::SIGKILL) } == 0;
        #[cfg(not(unix))]
        let killed = false;
        if killed {
            ended.push((server.to_owned(), pgid));
        }
    }
    ended
}

/// Whether the group `pgid` is still the one recorded and has a process left to end: its leader
/// (running, or a zombie nobody reaped) has the recorded start time, or the leader is gone but
/// members of its group are left (an id stays taken while a group of that id has members, so it
/// cannot be someone else's).
fn still_ours(pgid: i32, started: u64) -> bool {
    match stat(pgid) {
        Some(leader) if leader.started == started && leader.pgrp == pgid => {
            !leader.zombie || members_left(pgid)
        }
        Some(_) => false,
        None => members_left(pgid),
    }
}

/// The fields of `/proc/PID/stat` used here.
struct Stat {
    pgrp: i32,
    started: u64,
    zombie: bool,
}

fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid pgrp …`: comm may hold spaces and parentheses; it ends at the last ')'.
    let after = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    Some(Stat {
        zombie: matches!(fields.first(), Some(&"Z") | Some(&"X")),
        pgrp: fields.get(2)?.parse().ok()?,
        // Field 22 of the whole line; the fields after `comm` start at field 3.
        started: fields.get(19)?.parse().ok()?,
    })
}

fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|s| s.started)
}

fn members_left(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .any(|pid| stat(pid).is_some_and(|s| s.pgrp == pgid && !s.zombie))
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn a_group_is_ours_only_with_its_recorded_start_time() {
        if boot_id().is_none() {
            return; // no /proc here
        }
        let mut child = std::process::Command::new("sleep");
        child.arg("30");
        std::os::unix::process::CommandExt::process_group(&mut child, 0);
        let Ok(mut child) = child.spawn() else {
            return; // no `sleep` here
        };
        let pgid = i32::try_from(child.id()).expect("pid");
        let started = start_time(pgid).expect("its stat");
        assert!(still_ours(pgid, started));
        assert!(
            !still_ours(pgid, started + 1),
            "another process with the same id"
        );
        let record = format!(
            "boot {}\n{pgid} {started} s\n",
            boot_id().unwrap_or_default()
        );
        assert_eq!(end_left_over(&record), [("s".to_owned(), pgid)]);
        let status = child.wait().expect("reaped");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(!still_ours(pgid, started), "gone");
    }

    #[test]
    fn a_record_from_another_boot_ends_nothing() {
        assert!(end_left_over("boot not-this-boot\n1234 5 x\n").is_empty());
        assert!(end_left_over("").is_empty());
    }
}
