#!/usr/bin/env python3
"""A minimal streamable-HTTP MCP server for warden's tests (tests/mcp.rs): JSON responses only, one
tool `echo`. Its sessions live in memory, so a restart forgets them; how it answers a request for a
session it does not know is chosen by SESSION_GONE:

  404       404, as the MCP spec says
  400-json  400 with a JSON-RPC error without an id (as the TypeScript SDK's examples answer)
  400-text  400 with a plain-text body

Usage: http_server.py PORT
"""
import json
import os
import sys
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GONE = os.environ.get("SESSION_GONE", "404")
sessions = set()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=None, content_type="application/json", headers=()):
        data = b"" if body is None else (
            body.encode() if isinstance(body, str) else json.dumps(body).encode())
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", content_type)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def session_gone(self):
        if GONE == "404":
            self.reply(404, "no such session", "text/plain")
        elif GONE == "400-json":
            self.reply(400, {"jsonrpc": "2.0", "error": {
                "code": -32000, "message": "Bad Request: No valid session ID provided"}})
        else:
            self.reply(400, "Bad Request: unknown session", "text/plain")

    def do_GET(self):
        # No server-initiated stream.
        self.reply(405, "no GET stream", "text/plain")

    def do_DELETE(self):
        sessions.discard(self.headers.get("Mcp-Session-Id"))
        self.reply(200)

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        message = json.loads(self.rfile.read(length) or b"{}")
        session = self.headers.get("Mcp-Session-Id")
        method = message.get("method")
        if method == "initialize":
            new = str(uuid.uuid4())
            sessions.add(new)
            self.reply(200, {"jsonrpc": "2.0", "id": message["id"], "result": {
                "protocolVersion": message["params"].get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "http-test", "version": "0"},
            }}, headers=[("Mcp-Session-Id", new)])
            return
        if session not in sessions:
            self.session_gone()
            return
        if "id" not in message:
            self.reply(202)
            return
        id = message["id"]
        if method == "tools/list":
            result = {"tools": [{"name": "echo", "description": "Echoes its message.",
                                 "inputSchema": {"type": "object",
                                                 "properties": {"message": {"type": "string"}}}}]}
        elif method == "tools/call":
            text = "Echo: " + str(message["params"].get("arguments", {}).get("message"))
            result = {"content": [{"type": "text", "text": text}]}
        elif method == "ping":
            result = {}
        else:
            self.reply(200, {"jsonrpc": "2.0", "id": id,
                             "error": {"code": -32601, "message": "no method " + str(method)}},
                       headers=[("Mcp-Session-Id", session)])
            return
        self.reply(200, {"jsonrpc": "2.0", "id": id, "result": result},
                   headers=[("Mcp-Session-Id", session)])


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
