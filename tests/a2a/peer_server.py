"""A remote A2A agent built on the official Python `a2a-sdk` (1.x) server, for tests/a2a_client.rs:
warden's agents delegate to it through `[a2a_agents.NAME]`.

Usage: peer_server.py PORT LOG_FILE TOKEN [v03]

With `v03` it is an A2A 0.3 peer: its card is a 0.3 card (`url`, `protocolVersion` 0.3.0, no
`supportedInterfaces`) and the SDK's 0.3 compatibility serves `message/send`, `tasks/get`,
`tasks/cancel`.

Every JSON-RPC call it receives is appended to LOG_FILE as one JSON line
`{"t": UNIX_SECONDS, "method": …, "task": TASK_ID or null, "text": FIRST_TEXT or null}` before it
is handled; a call without `Authorization: Bearer TOKEN` is answered 401 (and logged with
`"method": "unauthorized"`). What the agent does depends on the text of the message that starts a
task:
  * `echo …`  completes with the artifact `peer: …`;
  * `ask …`   asks `Which colour?` (input-required); the next message on that task completes it
              with `peer got: ANSWER`;
  * `slow …`  works for ten minutes (to be canceled);
  * `fail …`  fails with `peer failed on purpose`;
  * `malformed …`, `garbage …`, `huge …` are answered by the wrapper, not the SDK: a JSON-RPC
              result that is neither a task nor a message, a body that is not JSON, 2 MiB.
"""

import asyncio
import json
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    Part,
    Task,
    TaskState,
    TaskStatus,
)

PORT, LOG, TOKEN = int(sys.argv[1]), sys.argv[2], sys.argv[3]
V03 = sys.argv[4:] == ["v03"]


def log(entry):
    entry["t"] = time.time()
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


def text_of(context):
    return " ".join(p.text for p in context.message.parts if p.text) if context.message else ""


class Peer(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = text_of(context)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        task = context.current_task
        if task is None:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        elif task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.add_artifact([Part(text=f"peer got: {text}")], name="answer")
            await updater.complete()
            return
        await updater.start_work()
        if text.startswith("echo"):
            await updater.add_artifact([Part(text=f"peer: {text}")], name="answer")
            await updater.complete()
        elif text.startswith("ask"):
            await updater.requires_input(updater.new_agent_message([Part(text="Which colour?")]))
        elif text.startswith("slow"):
            await asyncio.sleep(600)
            await updater.complete()
        else:
            await updater.failed(updater.new_agent_message([Part(text="peer failed on purpose")]))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


card = AgentCard(
    name="peer",
    description="A test peer: echoes, asks, works slowly or fails.",
    version="1.0",
    supported_interfaces=[
        AgentInterface(
            url=f"http://127.0.0.1:{PORT}/rpc", protocol_binding="JSONRPC", protocol_version="1.0"
        )
    ],
    capabilities=AgentCapabilities(streaming=False),
    default_input_modes=["text/plain"],
    default_output_modes=["text/plain"],
    skills=[AgentSkill(id="peer", name="peer", description="everything", tags=["test"])],
)
handler = DefaultRequestHandler(agent_executor=Peer(), task_store=InMemoryTaskStore(), agent_card=card)
if V03:
    from starlette.routing import Route

    async def card_03(request):
        return JSONResponse(
            {
                "name": "peer",
                "description": "A test peer speaking A2A 0.3.",
                "url": f"http://127.0.0.1:{PORT}/rpc",
                "preferredTransport": "JSONRPC",
                "protocolVersion": "0.3.0",
                "version": "1.0",
                "capabilities": {},
                "defaultInputModes": ["text/plain"],
                "defaultOutputModes": ["text/plain"],
                "skills": [],
            }
        )

    card_routes = [Route("/.well-known/agent-card.json", card_03)]
else:
    card_routes = create_agent_card_routes(card)
app = Starlette(routes=card_routes + create_jsonrpc_routes(handler, "/rpc", enable_v0_3_compat=V03))
inner = app


async def logged(scope, receive, send):
    """Logs each JSON-RPC call (and refuses a wrong token) before the SDK handles it."""
    if scope["type"] != "http" or scope["path"] != "/rpc":
        return await inner(scope, receive, send)
    headers = dict(scope["headers"])
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if headers.get(b"authorization") != f"Bearer {TOKEN}".encode():
        log({"method": "unauthorized", "task": None, "text": None})
        return await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
    try:
        request = json.loads(body)
        params = request.get("params") or {}
        message = params.get("message") or {}
        parts = message.get("parts") or [{}]
        log(
            {
                "method": request.get("method"),
                "task": params.get("id") or message.get("taskId"),
                "text": parts[0].get("text"),
            }
        )
    except Exception as e:  # noqa: BLE001 - logged, then the SDK answers the bad request itself
        log({"method": "unparsable", "task": None, "text": str(e)})
        parts = [{}]
    text = parts[0].get("text") or ""
    if text.startswith("malformed"):
        # JSON, JSON-RPC even, but its result is neither a task nor a message.
        bad = {"jsonrpc": "2.0", "id": request.get("id"), "result": {"surprise": True}}
        return await JSONResponse(bad)(scope, receive, send)
    if text.startswith("garbage"):
        body = b'{"jsonrpc": "2.0", "result": {"task": '
        return await Response(body, media_type="application/json")(scope, receive, send)
    if text.startswith("huge"):
        body = b'{"jsonrpc": "2.0", "id": 1, "result": {"pad": "' + b"x" * (2 << 20) + b'"}}'
        return await Response(body, media_type="application/json")(scope, receive, send)
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return await inner(scope, replay, send)


if __name__ == "__main__":
    uvicorn.run(logged, host="127.0.0.1", port=PORT, log_level="warning")
