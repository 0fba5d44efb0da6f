//! `/mcp` over streamable HTTP (`warden serve`): sessions, each an rmcp service over an in-memory
//! transport; `POST` carries JSON-RPC in (and the answers out), `GET` an SSE stream, `DELETE` ends a
//! session. rmcp 3.11 has its own streamable-HTTP server (`StreamableHttpService`, feature
//! `transport-streamable-http-server`), a tower `Service` over `http` requests; actix-web does not
//! host a tower service without a bridge, and the API's token, `Origin` and session-cap rules would
//! have to be rebuilt around it. Not attempted (issue 35): this layer stays, apart from the tools.

use super::*;

pub(super) type Waiters = Arc<Mutex<HashMap<RequestId, oneshot::Sender<ServerJsonRpcMessage>>>>;

/// The in-memory transport between one HTTP session and its rmcp service: messages in from POSTs,
/// responses out to the POST waiting for each (by request id). Messages the service starts itself
/// (none for these tools) have no one to go to and are dropped.
pub(super) struct SessionTransport {
    inbox: mpsc::Receiver<ClientJsonRpcMessage>,
    waiters: Waiters,
}

impl Transport<RoleServer> for SessionTransport {
    type Error = std::convert::Infallible;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let id = match &item {
            JsonRpcMessage::Response(r) => Some(r.id.clone()),
            JsonRpcMessage::Error(e) => e.id.clone(),
            JsonRpcMessage::Request(_) | JsonRpcMessage::Notification(_) => None,
        };
        match id.and_then(|id| self.waiters.lock().remove(&id)) {
            // The POST may be gone (its client disconnected): nothing to do then.
            Some(waiter) => drop(waiter.send(item)),
            None => tracing::debug!("MCP session: a server message with no POST to answer dropped"),
        }
        std::future::ready(Ok(()))
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<ClientJsonRpcMessage>> + Send {
        self.inbox.recv()
    }

    fn close(&mut self) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send {
        self.inbox.close();
        std::future::ready(Ok(()))
    }
}

/// One HTTP session: its access, the way into its service, the POSTs waiting for answers.
pub(super) struct Session {
    access: McpAccess,
    inbox: mpsc::Sender<ClientJsonRpcMessage>,
    waiters: Waiters,
    last_used: Mutex<Instant>,
    pub(super) in_flight: AtomicUsize,
}

/// The open HTTP sessions of `/mcp`, shared by the server's workers.
#[derive(Default)]
pub struct McpSessions {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

impl std::fmt::Debug for McpSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSessions")
            .field("open", &self.sessions.lock().len())
            .finish()
    }
}

impl McpSessions {
    /// How many sessions are open.
    pub fn len(&self) -> usize {
        self.sessions.lock().len()
    }

    /// Whether no session is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ends the sessions idle for [`SESSION_IDLE`] with no request in flight.
    pub(super) fn sweep(&self, now: Instant) {
        self.sessions.lock().retain(|_, s| {
            s.in_flight.load(Ordering::Acquire) > 0
                || now.duration_since(*s.last_used.lock()) < SESSION_IDLE
        });
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<Session>> {
        let session = self.sessions.lock().get(id).cloned()?;
        let now = Instant::now();
        let idle = now.duration_since(*session.last_used.lock()) >= SESSION_IDLE
            && session.in_flight.load(Ordering::Acquire) == 0;
        if idle {
            self.sessions.lock().remove(id);
            return None;
        }
        *session.last_used.lock() = now;
        Some(session)
    }

    /// Opens a session whose service serves `handler`: its id, or `None` when [`MAX_SESSIONS`]
    /// read sessions are open and none is idle (for a read `handler`). An admin session is always
    /// opened: past [`MAX_SESSIONS`] admin sessions, the one used least recently is ended.
    pub(super) fn open(&self, handler: WardenMcp) -> Option<(String, Arc<Session>)> {
        self.sweep(Instant::now());
        let mut sessions = self.sessions.lock();
        let class = handler.access;
        let of_class = sessions.values().filter(|s| s.access == class).count();
        if of_class >= MAX_SESSIONS {
            if class == McpAccess::Read {
                return None;
            }
            // Idle ones first, then the least recently used.
            let busy_then_used = |s: &Arc<Session>| {
                let busy = s.in_flight.load(Ordering::Acquire) > 0;
                (busy, *s.last_used.lock())
            };
            let oldest = sessions
                .iter()
                .filter(|(_, s)| s.access == McpAccess::Admin)
                .min_by_key(|(_, s)| busy_then_used(s))
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                tracing::info!(
                    "MCP: an admin initialize past {MAX_SESSIONS} admin sessions ends the one \
                     used least recently"
                );
                sessions.remove(&id);
            }
        }
        let (to_service, inbox) = mpsc::channel(64);
        let waiters = Waiters::default();
        let transport = SessionTransport {
            inbox,
            waiters: waiters.clone(),
        };
        let session = Arc::new(Session {
            access: handler.access,
            inbox: to_service,
            waiters,
            last_used: Mutex::new(Instant::now()),
            in_flight: AtomicUsize::new(0),
        });
        let id = format!("{:032x}", rand::random::<u128>());
        sessions.insert(id.clone(), session.clone());
        drop(sessions);
        // The service ends when every sender of its inbox is gone: the session was ended (DELETE,
        // idle) and no POST holds it any more.
        tokio::spawn(async move {
            match handler.serve(transport).await {
                Ok(service) => {
                    let _ = service.waiting().await;
                }
                Err(err) => tracing::debug!("MCP session ended before its handshake: {err}"),
            }
        });
        Some((id, session))
    }

    pub(super) fn close(&self, id: &str) -> bool {
        self.sessions.lock().remove(id).is_some()
    }
}

/// Counts a POST in flight on a session; on drop (answered, or the client went away) it is
/// counted out, and a request still waiting is withdrawn and cancelled in the service.
pub(super) struct InFlight {
    session: Arc<Session>,
    waiting: Option<RequestId>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(id) = self.waiting.take() {
            if self.session.waiters.lock().remove(&id).is_some() {
                let cancel = json!({
                    "jsonrpc": "2.0",
                    "method": "notifications/cancelled",
                    "params": { "requestId": id, "reason": "the HTTP client went away" }
                });
                if let Ok(message) = serde_json::from_value::<ClientJsonRpcMessage>(cancel) {
                    let _ = self.session.inbox.try_send(message);
                }
            }
        }
        *self.session.last_used.lock() = Instant::now();
        self.session.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A JSON-RPC error response (HTTP `status`), `id` null when the request's id is not known.
pub(super) fn rpc_error(
    status: StatusCode,
    id: Option<&RequestId>,
    error: ErrorData,
) -> HttpResponse {
    HttpResponse::build(status).json(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": error,
    }))
}

pub(super) fn header_str<'r>(req: &'r HttpRequest, name: &str) -> Option<&'r str> {
    req.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Reads the body up to `limit` bytes: `Err` with the `413` when it is longer.
pub(super) async fn read_body(
    mut payload: web::Payload,
    limit: usize,
) -> Result<web::BytesMut, HttpResponse> {
    let mut body = web::BytesMut::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, format!("bad request body: {e}"))
                .error_response()
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body larger than {limit} bytes"),
            )
            .error_response());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `POST /mcp`: one JSON-RPC message. `initialize` opens a session (`Mcp-Session-Id` in the
/// response); every other message names it. Each step answers the request itself when it refuses
/// it (the `Err` of each helper is the response).
pub(super) async fn post(
    state: web::Data<ApiState>,
    req: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    match post_message(&state, &req, payload).await {
        Ok(response) | Err(response) => response,
    }
}

// The `Err` is the refusal's whole response, built once on the cold path of one request.
#[allow(clippy::result_large_err)]
async fn post_message(
    state: &ApiState,
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, HttpResponse> {
    if let Some(refused) = check_origin(state, req) {
        return Err(refused);
    }
    let access = match access_of(req) {
        Ok(Access::Host) => return Err(api::host_refused().error_response()),
        Ok(access) => McpAccess::from(access),
        Err(err) => return Err(err.error_response()),
    };
    let body = read_body(payload, state.config.limit()).await?;
    let parsed = parse_message(req, &body)?;
    let (session_id, session) = session_for(state, req, access, &parsed)?;
    exchange(state, session_id, session, parsed).await
}

/// One POSTed message, checked: its id as given (for errors), whether it is `initialize`.
struct Parsed {
    message: ClientJsonRpcMessage,
    given_id: Option<RequestId>,
    initialize: bool,
}

/// Parses and checks one POSTed JSON-RPC message: JSON, not a batch, an MCP message, a supported
/// protocol version header, valid params.
// The `Err` is the refusal's whole response, built once on the cold path of one request.
#[allow(clippy::result_large_err)]
fn parse_message(req: &HttpRequest, body: &[u8]) -> Result<Parsed, HttpResponse> {
    let value: Value = serde_json::from_slice(body).map_err(|err| {
        rpc_error(
            StatusCode::BAD_REQUEST,
            None,
            ErrorData::parse_error(format!("the body is not JSON: {err}"), None),
        )
    })?;
    if value.is_array() {
        return Err(rpc_error(
            StatusCode::BAD_REQUEST,
            None,
            ErrorData::invalid_request(
                "JSON-RPC batches are not supported: send one message per POST",
                None,
            ),
        ));
    }
    let given_id: Option<RequestId> = value
        .get("id")
        .and_then(|id| serde_json::from_value(id.clone()).ok());
    let method = value
        .get("method")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let message: ClientJsonRpcMessage = match serde_json::from_value(value) {
        Ok(message) => message,
        // A known method whose `params` are not even an object (`[]`): invalid params.
        Err(_)
            if method
                .as_deref()
                .is_some_and(|m| METHODS_WITH_PARAMS.contains(&m)) =>
        {
            let method = method.unwrap_or_default();
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                given_id.as_ref(),
                ErrorData::invalid_params(
                    format!("invalid params for {method}: params must be an object"),
                    None,
                ),
            ));
        }
        Err(err) => {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                given_id.as_ref(),
                ErrorData::invalid_request(format!("not an MCP JSON-RPC message: {err}"), None),
            ))
        }
    };
    if let Some(version) = header_str(req, PROTOCOL_VERSION_HEADER) {
        if !versions().iter().any(|v| v.as_str() == version.trim()) {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                given_id.as_ref(),
                ErrorData::invalid_request(
                    format!(
                        "unsupported {PROTOCOL_VERSION_HEADER}: {version:?} (supported: {})",
                        versions()
                            .iter()
                            .map(ProtocolVersion::as_str)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    None,
                ),
            ));
        }
    }
    if let Some(refusal) = invalid_params(&message) {
        return Err(rpc_error(
            StatusCode::BAD_REQUEST,
            given_id.as_ref(),
            refusal,
        ));
    }
    let initialize = matches!(
        &message,
        JsonRpcMessage::Request(r) if matches!(r.request, ClientRequest::InitializeRequest(_))
    );
    Ok(Parsed {
        message,
        given_id,
        initialize,
    })
}

/// The message's session: a new one for `initialize` (refused on an open session, or when the
/// read token has too many), else the one its `Mcp-Session-Id` names, opened with the same token.
// The `Err` is the refusal's whole response, built once on the cold path of one request.
#[allow(clippy::result_large_err)]
fn session_for(
    state: &ApiState,
    req: &HttpRequest,
    access: McpAccess,
    parsed: &Parsed,
) -> Result<(String, Arc<Session>), HttpResponse> {
    let given_id = parsed.given_id.as_ref();
    let named = header_str(req, SESSION_HEADER).map(str::trim);
    if parsed.initialize {
        // A second `initialize` on an open session: refused, the session goes on as it was.
        if named.is_some_and(|open| state.mcp.get(open).is_some()) {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                given_id,
                ErrorData::invalid_request(
                    format!(
                        "this MCP session is already initialized: initialize opens a new \
                         session, so send it without {SESSION_HEADER} (or end this one \
                         with DELETE /mcp first)"
                    ),
                    None,
                ),
            ));
        }
        let operator = match access {
            McpAccess::Admin => MCP_HTTP_OPERATOR,
            McpAccess::Read => "mcp:read",
        };
        let handler = WardenMcp::new(
            state.supervisor.clone(),
            state.fates.clone(),
            access,
            operator,
        )
        .on_cluster(state.cluster.clone())
        .with_bus(state.bus.clone());
        return state.mcp.open(handler).ok_or_else(|| {
            rpc_error(
                StatusCode::SERVICE_UNAVAILABLE,
                given_id,
                ErrorData::internal_error(
                    format!(
                        "too many MCP sessions of the read token open ({MAX_SESSIONS}): end \
                         one with DELETE /mcp (the admin token may end any)"
                    ),
                    None,
                ),
            )
        });
    }
    let Some(id) = named else {
        return Err(rpc_error(
            StatusCode::BAD_REQUEST,
            given_id,
            ErrorData::invalid_request(
                format!("missing {SESSION_HEADER} header: send initialize first"),
                None,
            ),
        ));
    };
    let Some(session) = state.mcp.get(id) else {
        return Err(rpc_error(
            StatusCode::NOT_FOUND,
            given_id,
            ErrorData::invalid_request(
                "unknown or expired MCP session: send initialize again",
                None,
            ),
        ));
    };
    if session.access != access {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "this MCP session was opened with another token",
        )
        .error_response());
    }
    Ok((id.to_owned(), session))
}

/// Hands the message to its session and, for a request, waits for the answer (a notification or
/// a client's response: `202`, nothing comes back). A handshake refused by the server (an
/// unsupported version) leaves no session behind.
// The `Err` is the refusal's whole response, built once on the cold path of one request.
#[allow(clippy::result_large_err)]
async fn exchange(
    state: &ApiState,
    session_id: String,
    session: Arc<Session>,
    parsed: Parsed,
) -> Result<HttpResponse, HttpResponse> {
    let Parsed {
        message,
        initialize,
        ..
    } = parsed;
    session.in_flight.fetch_add(1, Ordering::AcqRel);
    let mut guard = InFlight {
        session: session.clone(),
        waiting: None,
    };
    let JsonRpcMessage::Request(request) = &message else {
        // Notifications and the client's responses: handed over, nothing comes back.
        if session.inbox.send(message).await.is_err() {
            state.mcp.close(&session_id);
            return Err(
                ApiError::new(StatusCode::NOT_FOUND, "the MCP session has ended").error_response(),
            );
        }
        return Ok(HttpResponse::Accepted().finish());
    };
    let id = request.id.clone();
    let (tx, rx) = oneshot::channel();
    {
        let mut waiters = session.waiters.lock();
        if waiters.contains_key(&id) {
            return Err(rpc_error(
                StatusCode::BAD_REQUEST,
                Some(&id),
                ErrorData::invalid_request("a request with this id is already in flight", None),
            ));
        }
        waiters.insert(id.clone(), tx);
    }
    guard.waiting = Some(id.clone());
    if session.inbox.send(message).await.is_err() {
        state.mcp.close(&session_id);
        return Err(rpc_error(
            StatusCode::NOT_FOUND,
            Some(&id),
            ErrorData::invalid_request("the MCP session has ended: send initialize again", None),
        ));
    }
    let answer = rx.await;
    guard.waiting = None;
    drop(guard);
    let Ok(answer) = answer else {
        state.mcp.close(&session_id);
        return Err(rpc_error(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some(&id),
            ErrorData::internal_error("the MCP session ended without an answer", None),
        ));
    };
    if initialize && matches!(answer, JsonRpcMessage::Error(_)) {
        // A refused handshake (an unsupported version) leaves no session behind.
        state.mcp.close(&session_id);
        return Ok(HttpResponse::Ok().json(answer));
    }
    let mut response = HttpResponse::Ok();
    if initialize {
        response.insert_header((SESSION_HEADER, session_id));
    }
    Ok(response.json(answer))
}

/// `GET /mcp`: this server starts no stream of its own (every answer comes with its POST).
pub(super) async fn get(state: web::Data<ApiState>, req: HttpRequest) -> HttpResponse {
    if let Some(refused) = check_origin(&state, &req) {
        return refused;
    }
    if let Err(err) = access_of(&req) {
        return err.error_response();
    }
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "GET /mcp: this server opens no stream of its own; POST JSON-RPC messages",
    )
    .error_response();
    response.headers_mut().insert(
        header::ALLOW,
        header::HeaderValue::from_static("POST, DELETE"),
    );
    response
}

/// `DELETE /mcp`: ends the session `Mcp-Session-Id` names: the admin token may end any session,
/// the read token only a read session.
pub(super) async fn delete(state: web::Data<ApiState>, req: HttpRequest) -> HttpResponse {
    if let Some(refused) = check_origin(&state, &req) {
        return refused;
    }
    let access = match access_of(&req) {
        Ok(Access::Host) => return api::host_refused().error_response(),
        Ok(access) => McpAccess::from(access),
        Err(err) => return err.error_response(),
    };
    let Some(id) = header_str(&req, SESSION_HEADER).map(str::trim) else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("missing {SESSION_HEADER} header"),
        )
        .error_response();
    };
    match state.mcp.get(id) {
        Some(session) if access == McpAccess::Read && session.access != McpAccess::Read => {
            ApiError::new(
                StatusCode::FORBIDDEN,
                "this MCP session was opened with the admin token: only the admin token may end it",
            )
            .error_response()
        }
        Some(_) => {
            state.mcp.close(id);
            HttpResponse::NoContent().finish()
        }
        None => {
            ApiError::new(StatusCode::NOT_FOUND, "unknown or expired MCP session").error_response()
        }
    }
}

/// The MCP methods whose `params` are required: rmcp reads such a request with missing or
/// malformed `params` as a custom request (answered "method not found"); it is answered here
/// as what it is, `-32602` invalid params.
pub(super) const METHODS_WITH_PARAMS: [&str; 8] = [
    "initialize",
    "tools/call",
    "prompts/get",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
];

/// `-32602` for a request of a known method whose `params` did not parse (missing, not an
/// object, or without a required field), with the parser's reason.
pub(super) fn invalid_params(message: &ClientJsonRpcMessage) -> Option<ErrorData> {
    let JsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CustomRequest(custom) = &request.request else {
        return None;
    };
    let method = custom.method.as_str();
    if !METHODS_WITH_PARAMS.contains(&method) {
        return None;
    }
    let reason = match (method, &custom.params) {
        (_, None) => "params are missing".to_owned(),
        ("tools/call", Some(params)) => {
            match serde_json::from_value::<CallToolRequestParams>(params.clone()) {
                Err(err) => err.to_string(),
                Ok(_) => "params do not fit the method".to_owned(),
            }
        }
        (_, Some(_)) => "params do not fit the method".to_owned(),
    };
    Some(ErrorData::invalid_params(
        format!("invalid params for {method}: {reason}"),
        None,
    ))
}

/// The MCP streamable-HTTP transport's `Origin` rule (against DNS rebinding): a request whose
/// `Origin` is present and is neither this server's own origin nor one of `api.allowed_origins`
/// is refused: the `403` to send. Without `Origin` (a client that is not a browser) the request
/// goes on (`None`).
///
/// This server's own origin is `http(s)://` and the `Host` the request was sent to, when that
/// host is an IP address or `localhost`: a name (what a rebinding page would use, its own name
/// resolving to this address) must be listed in `api.allowed_origins`.
pub(super) fn check_origin(state: &ApiState, req: &HttpRequest) -> Option<HttpResponse> {
    let origin = req.headers().get(header::ORIGIN)?;
    let origin = origin.to_str().unwrap_or("").trim();
    if allowed_origin(&state.config.allowed_origins, req, origin) {
        return None;
    }
    tracing::warn!(
        origin,
        "MCP request refused: its Origin is not this server's"
    );
    Some(
        ApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "Origin {origin:?} is not this server's origin nor one of api.allowed_origins \
                 (MCP transport rule against DNS rebinding)"
            ),
        )
        .error_response(),
    )
}

/// Whether `origin` may call `/mcp`: listed, or this server's own (see [`check_origin`]).
pub(super) fn allowed_origin(allowed: &[String], req: &HttpRequest, origin: &str) -> bool {
    let origin = origin.trim_end_matches('/');
    if allowed
        .iter()
        .any(|a| a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let Some(host) = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
    else {
        return false;
    };
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    if !bare.is_some_and(|b| b.eq_ignore_ascii_case(host)) {
        return false;
    }
    // The host without its port: an IP literal (`[::1]` included) or `localhost`.
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Any other method on `/mcp`.
pub(super) async fn other_method(req: HttpRequest) -> HttpResponse {
    let mut response = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{} /mcp is not served; allowed: POST, GET, DELETE",
            req.method()
        ),
    )
    .error_response();
    response.headers_mut().insert(
        header::ALLOW,
        header::HeaderValue::from_static("POST, GET, DELETE"),
    );
    response
}

/// The path of the MCP endpoint on `warden serve`.
pub const MCP_PATH: &str = "/mcp";

/// Registers `/mcp` (`POST`, `GET`, `DELETE`) on an app that has the API's [`ApiState`]
/// ([`api::configure`] calls it).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(MCP_PATH)
            .route(web::post().to(post))
            .route(web::get().to(get))
            .route(web::delete().to(delete))
            .default_service(web::to(other_method)),
    );
}
