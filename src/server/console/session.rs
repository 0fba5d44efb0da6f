//! Console sessions: a bounded server-side map from a random session id to the role it was opened
//! with and its CSRF token, each ending a fixed time after its login.
//!
//! * Ids and CSRF tokens are 256 random bits from the operating system (`OsRng`), in hex.
//! * A session lasts `api.session_ttl_seconds` from its login (not sliding): after that its cookie
//!   opens nothing, and the page sends the operator back to the login.
//! * At most [`MAX_SESSIONS`] are kept per token class (admin, read): a login beyond that first
//!   drops the expired ones, then the one of its own class closest to its end. The classes never
//!   evict each other: a thousand read-token logins cannot end the admin's session, nor keep the
//!   admin from opening one.
//! * Tokens (the CSRF token) are compared in constant time.

use super::super::api::{token_matches, Access};
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// The most sessions kept at once per token class (admin and read each).
pub const MAX_SESSIONS: usize = 1024;

/// One logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    /// What it may do: the token it logged in with.
    pub access: Access,
    /// The token a mutating request must echo in `X-CSRF-Token` (or a form's `csrf` field).
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether `given` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, given: &str) -> bool {
        token_matches(&self.csrf, given)
    }

    /// Seconds left before it ends (rounded down).
    pub fn remaining(&self) -> Duration {
        self.expires.saturating_duration_since(Instant::now())
    }
}

/// The open sessions. See the module docs.
#[derive(Debug)]
pub struct Sessions {
    ttl: Duration,
    map: Mutex<HashMap<String, Session>>,
}

/// 256 random bits, in hex.
fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Sessions {
    /// No session yet; each will last `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Sessions {
            ttl,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// How long a session lasts.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Opens a session with `access`: its id (the cookie's value) and the session.
    pub fn open(&self, access: Access) -> (String, Session) {
        let id = random_token();
        let session = Session {
            access,
            csrf: random_token(),
            expires: Instant::now() + self.ttl,
        };
        let mut map = self.map.lock();
        let of_class =
            |map: &HashMap<String, Session>| map.values().filter(|s| s.access == access).count();
        if of_class(&map) >= MAX_SESSIONS {
            let now = Instant::now();
            map.retain(|_, s| s.expires > now);
        }
        if of_class(&map) >= MAX_SESSIONS {
            let soonest = map
                .iter()
                .filter(|(_, s)| s.access == access)
                .min_by_key(|(_, s)| s.expires)
                .map(|(k, _)| k.clone());
            if let Some(key) = soonest {
                map.remove(&key);
            }
        }
        map.insert(id.clone(), session.clone());
        (id, session)
    }

    /// The live session with this id (an expired one is removed and `None`).
    pub fn get(&self, id: &str) -> Option<Session> {
        let mut map = self.map.lock();
        let session = map.get(id)?;
        if session.expires <= Instant::now() {
            map.remove(id);
            return None;
        }
        Some(session.clone())
    }

    /// Ends the session with this id (logout); nothing if there is none.
    pub fn close(&self, id: &str) {
        self.map.lock().remove(id);
    }

    /// The live session with id `id` among `ids` whose CSRF token is `given` (constant time per
    /// comparison): how a request that carries several session cookies (one tossed in by
    /// another site on this host) is told apart by the token only the page holds.
    pub fn by_csrf<'a>(&self, ids: &[&'a str], given: &str) -> Option<(&'a str, Session)> {
        let mut found = None;
        for id in ids {
            if let Some(session) = self.get(id) {
                if session.csrf_matches(given) && found.is_none() {
                    found = Some((*id, session));
                }
            }
        }
        found
    }

    /// Sessions kept now (expired ones included until they are next looked at).
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Whether no session is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_random_expire_and_stay_bounded() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let (a, sa) = sessions.open(Access::Admin);
        let (b, _) = sessions.open(Access::Read);
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(sa.csrf_matches(&sessions.get(&a).unwrap().csrf));
        assert!(!sa.csrf_matches("nope"));
        assert_eq!(sessions.get(&b).unwrap().access, Access::Read);
        sessions.close(&a);
        assert!(sessions.get(&a).is_none());
        for _ in 0..MAX_SESSIONS + 10 {
            sessions.open(Access::Read);
        }
        assert_eq!(sessions.len(), MAX_SESSIONS);

        let short = Sessions::new(Duration::from_millis(1));
        let (c, _) = short.open(Access::Admin);
        std::thread::sleep(Duration::from_millis(5));
        assert!(short.get(&c).is_none());
        assert!(short.is_empty());
    }

    #[test]
    fn read_logins_never_evict_the_admin_nor_keep_the_admin_out() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let (admin, _) = sessions.open(Access::Admin);
        for _ in 0..MAX_SESSIONS * 2 {
            sessions.open(Access::Read);
        }
        assert!(
            sessions.get(&admin).is_some(),
            "the admin's session survives"
        );
        let (again, _) = sessions.open(Access::Admin);
        assert!(sessions.get(&again).is_some());
        assert_eq!(sessions.len(), MAX_SESSIONS + 2);
    }

    #[test]
    fn the_csrf_token_tells_apart_the_sessions_of_several_cookies() {
        let sessions = Sessions::new(Duration::from_secs(60));
        let (admin, admin_session) = sessions.open(Access::Admin);
        let (read, read_session) = sessions.open(Access::Read);
        let ids = ["tossed", read.as_str(), admin.as_str()];
        let (id, found) = sessions.by_csrf(&ids, &admin_session.csrf).unwrap();
        assert_eq!((id, found.access), (admin.as_str(), Access::Admin));
        let (id, _) = sessions.by_csrf(&ids, &read_session.csrf).unwrap();
        assert_eq!(id, read.as_str());
        assert!(sessions.by_csrf(&ids, "00").is_none());
        assert!(sessions.by_csrf(&ids, "").is_none());
    }
}
