#!/usr/bin/env python3
"""Usage: python3 tests/chaos/cluster.py [SECONDS [SEED]] (after `cargo build`; WARDEN_BIN,
NATS_SERVER and CHAOS_DIR override the binary, nats-server and the scratch directory). Not run by
`cargo test`: it takes minutes and reports rather than asserts.

Chaos run against real `warden serve --cluster` nodes on one nats-server.

Three nodes list the same ten agents. For DURATION seconds a driver sends events, halts and
lifts the cluster, kills -9 and restarts nodes, freezes them (SIGSTOP/SIGCONT) and restarts NATS,
and checks invariants:
  * ownership: no agent is owned by two live, unfrozen nodes for longer than GRACE seconds;
  * a cluster halt acknowledged: every live unfrozen node that is not in fail safe shows every
    agent it owns STOPPED within 2 s;
At the end everything is healed: every agent must be owned by exactly one node and answer.
"""
import json, os, random, signal, subprocess, sys, time, urllib.request, urllib.error

W = os.environ.get("WARDEN_BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../target/debug/warden"))
NATS = os.environ.get("NATS_SERVER", "nats-server")
DIR = os.environ.get("CHAOS_DIR", "/tmp/warden-chaos")
TOKEN = "t"
DURATION = float(sys.argv[1]) if len(sys.argv) > 1 else 300
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
GRACE = 4.0
random.seed(SEED)
AGENTS = ["x%d" % i for i in range(10)]
NATS_PORT = 16000 + random.randrange(500)

def log(*a):
    print("[%7.2f]" % (time.time() - T0), *a, flush=True)

def http(port, method, path, body=None, timeout=5):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data=data, method=method)
    req.add_header("Authorization", "Bearer " + TOKEN)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read() or b"null")
        except Exception:
            return e.code, None
    except Exception as e:
        return None, str(e)

TEAM = """[providers.m]
kind = "scripted"
cycle = true
latency_ms = 50
replies = ["ok"]

[cluster]
url = "nats://127.0.0.1:%d"
fail_safe_seconds = 2
lease_ttl_seconds = 3
halt_ack_timeout_ms = 1000
""" % NATS_PORT + "".join('\n[[agents]]\nkey = "%s"\nprovider = "m"\n' % a for a in AGENTS)

class Node:
    def __init__(self, name, port):
        self.name, self.port, self.proc, self.frozen = name, port, None, False
        self.dir = os.path.join(DIR, name)
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, "team.toml"), "w") as f:
            f.write(TEAM)
    def start(self):
        env = dict(os.environ, WARDEN_ADMIN_TOKEN=TOKEN)
        self.err = open(os.path.join(self.dir, "stderr.log"), "a")
        self.proc = subprocess.Popen([W, "serve", "--config", os.path.join(self.dir, "team.toml"),
            "--db", os.path.join(self.dir, "j.db"), "--listen", "127.0.0.1:%d" % self.port,
            "--node", self.name], env=env, stdout=subprocess.DEVNULL, stderr=self.err)
        self.frozen = False
        deadline = time.time() + 30
        while time.time() < deadline:
            if self.proc.poll() is not None:
                log("node", self.name, "exited at start:", self.proc.returncode)
                self.proc = None
                return False
            if http(self.port, "GET", "/healthz")[0] in (200, 503):
                return True
            time.sleep(0.1)
        return False
    def alive(self):
        return self.proc is not None and self.proc.poll() is None
    def kill(self):
        if self.proc:
            if self.frozen:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill(); self.proc.wait(); self.proc = None; self.frozen = False
    def freeze(self):
        self.proc.send_signal(signal.SIGSTOP); self.frozen = True
    def thaw(self):
        self.proc.send_signal(signal.SIGCONT); self.frozen = False

def start_nats():
    os.makedirs(os.path.join(DIR, "js"), exist_ok=True)
    return subprocess.Popen([NATS, "-js", "-sd", os.path.join(DIR, "js"),
        "-p", str(NATS_PORT), "-a", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

subprocess.run(["rm", "-rf", DIR]); os.makedirs(DIR)
T0 = time.time()
nats = start_nats(); time.sleep(0.5)
nodes = [Node(n, 18900 + i) for i, n in enumerate("abc")]
for n in nodes:
    assert n.start(), n.name
violations = []
overlap_since = {}
counts = {"events": 0, "accepted": 0, "halts": 0, "lifts": 0, "kills": 0, "freezes": 0, "nats_restarts": 0}
thaw_at = {}
refusals = {}

def cluster_view(n):
    s, c = http(n.port, "GET", "/api/cluster", timeout=3)
    return c if s == 200 else None

def check_ownership():
    now = time.time()
    owners = {}
    for n in nodes:
        if not n.alive() or n.frozen:
            continue
        c = cluster_view(n)
        if not c or c.get("fail_safe"):
            continue
        for a in c.get("owned", []):
            owners.setdefault(a, []).append(n.name)
    for a in AGENTS:
        if len(owners.get(a, [])) > 1:
            since = overlap_since.setdefault(a, now)
            if now - since > GRACE:
                violations.append("t=%.1f %s owned by %s for %.1f s" % (now - T0, a, owners[a], now - since))
                overlap_since[a] = now
        else:
            overlap_since.pop(a, None)

def owner_of(a):
    for n in nodes:
        if n.alive() and not n.frozen:
            s, st = http(n.port, "GET", "/api/agents/" + a, timeout=3)
            if s == 200 and st.get("node"):
                return st["node"]
    return None

while time.time() - T0 < DURATION:
    # thaw frozen nodes whose time came
    for n in nodes:
        if n.frozen and time.time() >= thaw_at.get(n.name, 0):
            n.thaw(); log("thaw", n.name)
    live = [n for n in nodes if n.alive()]
    r = random.random()
    if r < 0.55:
        a = random.choice(AGENTS)
        own = owner_of(a)
        tgt = next((n for n in nodes if n.name == own and n.alive() and not n.frozen), None)
        if tgt:
            s, body = http(tgt.port, "POST", "/api/agents/%s/events" % a, {"content": "hi"})
            counts["events"] += 1
            counts["accepted"] += s == 202
            if s != 202:
                why = (body or {}).get("error", str(body))[:90] if isinstance(body, dict) else str(body)[:90]
                refusals[(s, why)] = refusals.get((s, why), 0) + 1
                if "STOPPED" in why:
                    s3, ev = http(tgt.port, "GET", "/api/events/recent?agent=%s&limit=200" % a)
                    halts = [e["kind"] for e in (ev or {}).get("events", []) if e["kind"]["type"] in ("halted", "spawned", "resumed", "state_changed")]
                    log("STOPPED", a, "on", tgt.name, json.dumps(halts[-4:])[:600])
    elif r < 0.62:
        cands = [n for n in live if not n.frozen]
        if cands:
            n = random.choice(cands)
            s, body = http(n.port, "POST", "/api/halt", timeout=10)
            counts["halts"] += 1
            log("halt via", n.name, s, "unanswered", (body or {}).get("unanswered") if isinstance(body, dict) else body)
            time.sleep(2)
            for m in nodes:
                if not m.alive() or m.frozen:
                    continue
                c = cluster_view(m)
                if not c or c.get("fail_safe"):
                    continue
                for a in c.get("owned", []):
                    s2, st = http(m.port, "GET", "/api/agents/" + a, timeout=3)
                    if s2 == 200 and st.get("node") == m.name and st["state"] not in ("STOPPED", "SAFETY_LOCKOUT"):
                        violations.append("t=%.1f after halt: %s on %s is %s" % (time.time() - T0, a, m.name, st["state"]))
            # lift
            for _ in range(10):
                cands = [n for n in nodes if n.alive() and not n.frozen]
                if not cands:
                    break
                s, body = http(random.choice(cands).port, "POST", "/api/resume", {"reason": "chaos"}, timeout=10)
                if s == 200 or (s == 409 and "not halted" in json.dumps(body)):
                    counts["lifts"] += 1
                    break
                time.sleep(0.5)
    elif r < 0.68 and len(live) >= 2:
        n = random.choice(live)
        n.kill(); counts["kills"] += 1; log("kill -9", n.name)
    elif r < 0.74:
        dead = [n for n in nodes if not n.alive()]
        if dead:
            n = random.choice(dead); ok = n.start(); log("restart", n.name, ok)
    elif r < 0.79:
        cands = [n for n in live if not n.frozen]
        if len(cands) >= 2:
            n = random.choice(cands); n.freeze(); counts["freezes"] += 1
            thaw_at[n.name] = time.time() + random.uniform(1, 6)
            log("freeze", n.name, "for %.1f s" % (thaw_at[n.name] - time.time()))
    elif r < 0.81:
        nats.kill(); nats.wait(); counts["nats_restarts"] += 1
        log("NATS down")
        time.sleep(random.uniform(0.5, 4))
        nats = start_nats(); log("NATS up")
    check_ownership()
    time.sleep(0.2)

log("chaos over:", counts)
for k, v in sorted(refusals.items(), key=lambda kv: -kv[1]):
    log("  refused", v, "x", k)
# heal
for n in nodes:
    if n.frozen:
        n.thaw()
for n in nodes:
    if not n.alive():
        n.start()
# make sure the cluster is not halted
time.sleep(3)
for _ in range(5):
    s, body = http(nodes[0].port, "POST", "/api/resume", {"reason": "heal"}, timeout=10)
    if s == 200 or (s == 409 and "not halted" in json.dumps(body)):
        break
    time.sleep(1)
deadline = time.time() + 30
while time.time() < deadline:
    owners = {}
    for n in nodes:
        c = cluster_view(n)
        for a in (c or {}).get("owned", []):
            owners.setdefault(a, []).append(n.name)
    if all(len(owners.get(a, [])) == 1 for a in AGENTS):
        break
    time.sleep(1)
log("owners at the end:", owners)
for a in AGENTS:
    if len(owners.get(a, [])) != 1:
        violations.append("end: %s owned by %s" % (a, owners.get(a)))
# every agent answers through its owner (resume it first if a kill left it stopped by itself)
for a in AGENTS:
    own = owners.get(a, [None])[0]
    n = next((m for m in nodes if m.name == own), None)
    if not n:
        continue
    s, st = http(n.port, "GET", "/api/agents/" + a)
    if st and st.get("state") == "STOPPED":
        http(n.port, "POST", "/api/agents/%s/resume" % a)
    s, body = http(n.port, "POST", "/api/agents/%s/events?wait=10" % a, {"content": "final"}, timeout=15)
    if not (s == 200 and body and body.get("status") == "answered"):
        violations.append("end: %s on %s did not answer: %s %s" % (a, own, s, body))
for n in nodes:
    n.kill()
nats.kill()
print("VIOLATIONS:", len(violations))
for v in violations:
    print("  ", v)
sys.exit(1 if violations else 0)
