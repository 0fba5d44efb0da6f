"""Round trips through /a2a on a running `warden serve` with docs/a2a.md's team (not a test: figures).

Usage: figures.py BASE_URL ADMIN_TOKEN  (the agent `slow` must not be STOPPED)
"""
import json, time, urllib.request, statistics, sys
BASE, ADMIN = sys.argv[1], sys.argv[2]
URL=BASE + "/a2a"
def rpc(method, params):
    req=urllib.request.Request(URL, data=json.dumps({"jsonrpc":"2.0","id":1,"method":method,"params":params}).encode(),
        headers={"Authorization":"Bearer " + ADMIN + "","Content-Type":"application/json"})
    return json.load(urllib.request.urlopen(req))
ask, cancel = [], []
for i in range(20):
    r=rpc("SendMessage",{"message":{"messageId":f"q{i}-{time.time()}","role":"ROLE_USER","parts":[{"text":"go"}],"metadata":{"agent":"asker"}}})
    t=r["result"]["task"]; assert t["status"]["state"]=="TASK_STATE_INPUT_REQUIRED", t
    t0=time.perf_counter()
    r=rpc("SendMessage",{"message":{"messageId":f"a{i}-{time.time()}","taskId":t["id"],"role":"ROLE_USER","parts":[{"text":"yes"}]}})
    ask.append((time.perf_counter()-t0)*1000); assert r["result"]["task"]["status"]["state"]=="TASK_STATE_COMPLETED", r
for i in range(20):
    r=rpc("SendMessage",{"message":{"messageId":f"s{i}-{time.time()}","role":"ROLE_USER","parts":[{"text":"go"}],"metadata":{"agent":"slow"}},"configuration":{"returnImmediately":True}})
    t=r["result"]["task"]; time.sleep(0.2)
    t0=time.perf_counter(); r=rpc("CancelTask",{"id":t["id"]}); cancel.append((time.perf_counter()-t0)*1000)
    assert "result" in r and r["result"]["status"]["state"]=="TASK_STATE_CANCELED", (i, r)
    req=urllib.request.Request(BASE + "/api/agents/slow/resume", data=b"", method="POST", headers={"Authorization":"Bearer " + ADMIN + ""}); urllib.request.urlopen(req)
q=lambda xs: (round(statistics.median(xs),1), round(sorted(xs)[int(len(xs)*0.95)-1],1))
print("answer->completed ms (median, p95):", q(ask)); print("CancelTask->canceled ack ms (median, p95):", q(cancel))
