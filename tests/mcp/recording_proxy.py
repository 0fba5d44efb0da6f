#!/usr/bin/env python3
"""Runs an MCP stdio server (argv[2:]) and passes its stdio through, appending every line the
client sends (with a time stamp) to the file argv[1]: a test or the mcp_halt example can then see
what the server received, e.g. `notifications/cancelled`."""
import json
import subprocess
import sys
import threading
import time

log_path, command = sys.argv[1], sys.argv[2:]
child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)


def to_client():
    for line in child.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()


threading.Thread(target=to_client, daemon=True).start()
with open(log_path, "a") as log:
    for line in sys.stdin.buffer:
        try:
            child.stdin.write(line)
            child.stdin.flush()
        except BrokenPipeError:
            break
        try:
            message = json.loads(line)
        except ValueError:
            continue
        log.write(json.dumps({"at": time.time(), "message": message}) + "\n")
        log.flush()
child.terminate()
