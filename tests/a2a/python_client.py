"""The official Python `a2a-sdk` (1.x) as a client of a real `warden serve` (run by tests/a2a.rs).

Usage: python_client.py BASE_URL ADMIN_TOKEN READ_TOKEN

Each check prints `PASS name` (the Rust test wants every one) or raises (non-zero exit). The team is
tests/a2a.rs's: `a` answers "hello from a", `slow` takes ten minutes, `asker` reaches its iteration
limit and asks.
"""

import asyncio
import http.server
import json
import sys
import threading
import uuid

import httpx
from a2a.client import ClientConfig, create_client
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import TaskNotCancelableError, TaskNotFoundError

BASE, ADMIN, READ = sys.argv[1], sys.argv[2], sys.argv[3]


def message(text, agent=None, task_id=None):
    m = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)])
    if agent:
        m.metadata.update({"agent": agent})
    if task_id:
        m.task_id = task_id
    return SendMessageRequest(message=m)


async def client(token, streaming, polling=False):
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    config = ClientConfig(streaming=streaming, polling=polling, httpx_client=http)
    return await create_client(BASE, client_config=config)


async def collect(stream):
    return [e async for e in stream]


async def events(c, request):
    return [e async for e in c.send_message(request)]


async def main():
    c = await client(ADMIN, streaming=False)
    card = c._card  # what the SDK resolved from /.well-known/agent-card.json
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC", card
    assert {s.id for s in card.skills} >= {"a", "slow", "asker"}, card.skills
    print("PASS card")

    [e] = await events(c, message("hi", agent="a"))
    task = e.task
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    assert task.artifacts[0].parts[0].text == "hello from a", task
    print("PASS send")

    got = await c.get_task(GetTaskRequest(id=task.id))
    assert got.status.state == TaskState.TASK_STATE_COMPLETED and got.id == task.id, got
    listed = await c.list_tasks(ListTasksRequest(context_id="a"))
    assert task.id in [t.id for t in listed.tasks], listed
    print("PASS get_list")

    s = await client(ADMIN, streaming=True)
    items = await events(s, message("stream it", agent="a"))
    kinds = [e.WhichOneof("payload") for e in items]
    assert kinds[0] == "task" and "artifact_update" in kinds, kinds
    last = items[-1].status_update
    assert last.status.state == TaskState.TASK_STATE_COMPLETED, items
    art = [e.artifact_update for e in items if e.WhichOneof("payload") == "artifact_update"][0]
    assert art.artifact.parts[0].text == "hello from a", art
    print("PASS stream")

    p = await client(ADMIN, streaming=False, polling=True)
    [e] = await events(p, message("take your time", agent="slow"))
    slow = e.task
    assert slow.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING), slow
    # A subscriber (read token) sees the cancel as the stream's last status.
    reader = await client(READ, streaming=True)
    watched = asyncio.ensure_future(
        collect(reader.subscribe(SubscribeToTaskRequest(id=slow.id)))
    )
    await asyncio.sleep(0.5)  # let the subscription start (the assertion does not depend on it)
    canceled = await c.cancel_task(CancelTaskRequest(id=slow.id))
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED, canceled
    seen = await asyncio.wait_for(watched, 30)
    assert seen[0].WhichOneof("payload") == "task", seen
    assert seen[-1].WhichOneof("payload") in ("status_update", "task"), seen
    final = seen[-1].status_update.status if seen[-1].WhichOneof("payload") == "status_update" \
        else seen[-1].task.status
    assert final.state == TaskState.TASK_STATE_CANCELED, seen
    try:
        await c.cancel_task(CancelTaskRequest(id=slow.id))
        raise AssertionError("a canceled task was canceled again")
    except TaskNotCancelableError:
        pass
    print("PASS cancel")

    [e] = await events(c, message("look it up", agent="asker"))
    asked = e.task
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, asked
    assert "max_iterations_per_task" in asked.status.message.parts[0].text, asked
    [e] = await events(c, message("yes, one more", task_id=asked.id))
    assert e.task.status.state == TaskState.TASK_STATE_COMPLETED, e.task
    print("PASS input_required")

    try:
        await c.get_task(GetTaskRequest(id="a/999999"))
        raise AssertionError("an unknown task was found")
    except TaskNotFoundError:
        pass
    r = await client(READ, streaming=False)
    await r.get_task(GetTaskRequest(id=task.id))
    try:
        await events(r, message("not allowed", agent="a"))
        raise AssertionError("the read token sent a message")
    except A2AClientError:
        pass
    print("PASS errors")


    # Push notifications to a local webhook, set with the SDK's config method.
    received = []

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append((self.headers.get("X-A2A-Notification-Token"), json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    hook = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    [e] = await events(p, message("push me", agent="a"))
    config = await c.create_task_push_notification_config(
        TaskPushNotificationConfig(
            task_id=e.task.id,
            url=f"http://127.0.0.1:{hook.server_address[1]}/hook",
            token="py-token",
        )
    )
    assert config.id and config.task_id == e.task.id, config
    for _ in range(600):
        if any(
            b.get("statusUpdate", {}).get("status", {}).get("state") == "TASK_STATE_COMPLETED"
            for _, b in received
        ):
            break
        await asyncio.sleep(0.05)
    assert received and all(t == "py-token" for t, _ in received), received
    assert received[-1][1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED", received
    hook.shutdown()
    print("PASS push")


asyncio.run(main())
