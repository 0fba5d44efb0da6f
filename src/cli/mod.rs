//! What the `warden` binary runs besides the server: the admin API client ([`client`]: `status`,
//! `halt`, `send`, `events`, …), `warden run` ([`run`]) and `warden demo` ([`demo`]), and the status
//! table all three print ([`table`]), and the team file `warden init` writes ([`init`]).

pub mod client;
pub mod demo;
pub mod init;
pub mod run;
pub mod table;
