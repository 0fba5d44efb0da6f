//! Binding and serving the API ([`bind`], [`listen_on`], [`serve`]).

use crate::server::api::*;
use std::net::SocketAddr;

/// Why `serve` would not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// No admin token is configured and the address is not loopback: the API would be open to
    /// the network.
    #[error("refusing to listen on non-loopback address {0} without an admin token (set WARDEN_ADMIN_TOKEN)")]
    NoTokenOnPublicAddress(std::net::SocketAddr),
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot listen on {0}: {1}")]
    Bind(std::net::SocketAddr, std::io::Error),
    /// Another I/O error: reading the bound socket's address, starting the HTTP server, or the
    /// server failing while it runs.
    #[error("listen: {0}")]
    Io(#[from] std::io::Error),
}

/// Refuses a non-loopback address when no admin token is configured.
///
/// # Errors
///
/// [`ServeError::NoTokenOnPublicAddress`] for a non-loopback `addr` without an admin token.
pub fn check_listen(addr: std::net::SocketAddr, config: &ApiConfig) -> Result<(), ServeError> {
    if config.admin_token.is_none() && !addr.ip().is_loopback() {
        return Err(ServeError::NoTokenOnPublicAddress(addr));
    }
    Ok(())
}

/// HTTP workers: one per core, at least two and at most eight (`WARDEN_API_WORKERS` overrides). A
/// worker serves every connection it accepts — event streams, event ingest, halts — so with one
/// worker a halt waited behind every stream and every flood request on it; with several, the kernel
/// spreads the connections and schedules the workers' threads, so a halt lands on a worker that is
/// not the only one carrying the load.
pub fn api_workers() -> usize {
    std::env::var("WARDEN_API_WORKERS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 8)
        })
}

/// Binds the API to `addr` (port 0 picks a free one) and returns the server, to be awaited or
/// spawned, and the addresses it listens on. Must run inside an actix `System`.
///
/// # Errors
///
/// [`ServeError::NoTokenOnPublicAddress`] (see [`check_listen`]), [`ServeError::Bind`] when the
/// address cannot be bound, [`ServeError::Io`] when the server cannot start on it.
pub fn bind(
    state: ApiState,
    addr: SocketAddr,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    check_listen(addr, &state.config)?;
    let listener = std::net::TcpListener::bind(addr).map_err(|e| ServeError::Bind(addr, e))?;
    http_server(state, listener, true)
}

/// Serves the API on a socket already bound (`warden serve` binds before it opens the journal, so
/// a port in use fails before the journal is touched). Must run inside an actix `System`.
///
/// The server does not act on SIGTERM or SIGINT: the caller stops it (with its
/// [`actix_web::dev::Server::handle`]). actix's own handling stops the whole actix `System` after a
/// signal, and with it the supervisor's arbiters — every agent's actor dropped before the team was
/// shut down, which read as a crash of each (`warden serve` stops the server, then the team).
///
/// # Errors
///
/// [`ServeError::NoTokenOnPublicAddress`] (see [`check_listen`]) and [`ServeError::Io`] when the
/// socket's address cannot be read or the server cannot start on it.
pub fn listen_on(
    state: ApiState,
    listener: std::net::TcpListener,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    http_server(state, listener, false)
}

/// The API's server on `listener`; `signals`: actix stops it (and the `System`) on SIGTERM/SIGINT.
pub(crate) fn http_server(
    state: ApiState,
    listener: std::net::TcpListener,
    signals: bool,
) -> Result<(actix_web::dev::Server, Vec<SocketAddr>), ServeError> {
    let addr = listener.local_addr()?;
    check_listen(addr, &state.config)?;
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().configure(configure(state.clone()))
    })
    .workers(api_workers());
    let server = if signals {
        server
    } else {
        server.disable_signals()
    };
    let server = server.listen(listener)?;
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}

/// Serves the API on `addr` until the server stops (must run inside an actix `System`).
///
/// # Errors
///
/// Those of [`bind`], and [`ServeError::Io`] if the server fails while it runs.
///
/// # Cancel safety
///
/// Dropping the future stops serving: the listener closes and the workers are shut down without
/// grace (requests in flight and open event streams are cut). The team is not touched: a halt
/// already applied stays applied.
pub async fn serve(state: ApiState, addr: SocketAddr) -> Result<(), ServeError> {
    let (server, _) = bind(state, addr)?;
    server.await?;
    Ok(())
}
