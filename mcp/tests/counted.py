"""Every outcome of a tools/call, counted (features `metrics` and `tracing`), with the official
Python SDK as the client in front of the ledger server: each outcome is made to happen a known
number of times, then the gateway's `/metrics` (on `--metrics 127.0.0.1:0`, the address read
from its stderr) must show exactly those counts, the waits, and the store's own metrics beside
them, and its stderr one event per call with the outcome, tool, tenant and key.

Two gateways on one store: the first (`--wait 1`) has calls executed, replayed (once at once,
once after waiting for a duplicate in flight), in progress after a wait, released, refused (a
key given badly), unkeyed and read-only; the second (`--wait 0 --strict`) has a call in progress
at once, a strict refusal, and last an unknown outcome (`create_and_die`): its upstream dies, and
with it the gateway, so that count is read from the event it wrote before ending (a scrape
cannot outlive the process).

    python counted.py GATEWAY_BINARY PYTHON STORE_DIR
"""

import os
import re
import socket
import time
import urllib.request

import anyio
from ledger_gateway import ledger_lines, ledger_path, store_dir
from ledger_gateway import params as gateway_params
from mcp import ClientSession, stdio_client
from mcp.shared.exceptions import MCPError

OUTCOMES = ["executed", "replayed", "in_progress", "unknown", "released", "refused", "failed",
            "unkeyed", "read_only"]
TIMEOUT = 10.0


def meta(task, step):
    return {"io.idemdb/task": task, "io.idemdb/step": step}


def metrics_url(errlog_path):
    """The address the gateway printed on stderr."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        with open(errlog_path) as f:
            found = re.search(r"idemdb-mcp: metrics on (http://127\.0\.0\.1:\d+/metrics)", f.read())
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError("the gateway never said where its metrics are")


def scrape(url):
    """Each sample of the Prometheus text: `name{labels}` -> value."""
    with urllib.request.urlopen(url, timeout=TIMEOUT) as response:
        assert response.status == 200, response.status
        assert response.headers["Content-Type"].startswith("text/plain"), response.headers
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def calls(samples):
    return {o: samples[f'idemdb_mcp_tool_calls_total{{outcome="{o}"}}'] for o in OUTCOMES}


def raw_http(url, request):
    """The status line a raw request to the metrics listener gets."""
    host, port = re.match(r"http://([\d.]+):(\d+)/", url).groups()
    with socket.create_connection((host, int(port)), timeout=TIMEOUT) as conn:
        conn.sendall(request)
        return conn.makefile("rb").readline().decode().strip()


async def wait_for_ledger(title):
    """Until the tool's side effect for `title` is in the ledger (so its claim is held)."""
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        if os.path.exists(ledger_path) and any(l.startswith(title + "\t") for l in ledger_lines()):
            return
        await anyio.sleep(0.02)
    raise AssertionError(f"{title} never reached the ledger")


async def error_of(call):
    try:
        result = await call
    except MCPError as e:
        return e.error
    raise AssertionError(f"answered: {result}")


async def duplicate_during(s, title, answer_after, task, step):
    """A call that holds its key for `answer_after` seconds after its side effect, and a
    duplicate (the same arguments: strict mode would refuse others) sent once the side effect
    is in the ledger: (first's result, duplicate's result or JSON-RPC error)."""
    out = {}
    arguments = {"title": title, "answer_after": answer_after}

    async def first():
        out["first"] = await s.call_tool("create_incident", arguments,
                                         read_timeout_seconds=TIMEOUT, meta=meta(task, step))

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await wait_for_ledger(title)
        try:
            out["duplicate"] = await s.call_tool("create_incident", arguments,
                                                 read_timeout_seconds=TIMEOUT,
                                                 meta=meta(task, step))
        except MCPError as e:
            out["duplicate"] = e.error
    return out["first"], out["duplicate"]


async def first_gateway(errlog_path):
    params = gateway_params("--wait", "1", "--metrics", "127.0.0.1:0")
    params.env = {"RUST_LOG": "info"}
    with open(errlog_path, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            url = metrics_url(errlog_path)
            before = calls(scrape(url))
            assert set(before.values()) == {0}, f"every outcome's series is there, at 0: {before}"
            await s.list_tools()  # The gateway learns which tools are read-only.

            await s.call_tool("ledger", {}, read_timeout_seconds=TIMEOUT)
            await s.call_tool("create_incident", {"title": "unkeyed"}, read_timeout_seconds=TIMEOUT)
            await s.call_tool("create_incident", {"title": "one"}, read_timeout_seconds=TIMEOUT,
                              meta=meta("task-c", 1))
            replay = await s.call_tool("create_incident", {"title": "one, reworded"},
                                       read_timeout_seconds=TIMEOUT, meta=meta("task-c", 1))
            assert replay.meta["io.idemdb/replayed"] is True, replay.meta
            bad = await error_of(s.call_tool("create_incident", {"title": "x"},
                                             read_timeout_seconds=TIMEOUT,
                                             meta={"io.idemdb/task": "task-c"}))
            assert bad.code == -32602, bad
            down = await error_of(s.call_tool("unavailable", {"title": "two"},
                                              read_timeout_seconds=TIMEOUT,
                                              meta=meta("task-c", 2)))
            assert down.code == -32050, down
            # A duplicate that waits for the call in flight (0.6 s) and gets its replay.
            first, waited = await duplicate_during(s, "three", 0.6, "task-c", 3)
            assert waited.meta["io.idemdb/replayed"] is True, waited
            assert waited.content[0].text == first.content[0].text
            # A duplicate that waits its whole second, then hears the step is in progress.
            _, busy = await duplicate_during(s, "four", 2.5, "task-c", 4)
            assert busy.code == -32001, busy

            samples = scrape(url)
            expected = dict.fromkeys(OUTCOMES, 0) | {
                "executed": 3, "replayed": 2, "in_progress": 1, "released": 1, "refused": 1,
                "unkeyed": 1, "read_only": 1}
            assert calls(samples) == expected, calls(samples)
            assert samples["idemdb_mcp_waited_calls_total"] == 2, samples
            assert samples["idemdb_mcp_wait_seconds_count"] == 2, samples
            # The replay waited about 0.6 s, the in-progress 1 s: neither below 25 ms.
            assert samples['idemdb_mcp_wait_seconds_bucket{le="0.025"}'] == 0, samples
            assert 1.2 <= samples["idemdb_mcp_wait_seconds_sum"] <= 4.0, samples
            # The store's own metrics, beside them: steps 1 to 4 claimed once each, two replays.
            assert samples['idemdb_claims_total{decision="acquired"}'] == 4, samples
            assert samples['idemdb_claims_total{decision="replay"}'] == 2, samples
            assert samples["idemdb_releases_total"] == 1, samples
            assert samples["idemdb_completes_total"] == 3, samples

            # Odd requests get HTTP errors, and the endpoint goes on.
            assert raw_http(url, b"GET /nope HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 404"), url
            assert raw_http(url, b"POST /metrics HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 405")
            assert raw_http(url, b"\x00\xff garbage\r\n\r\n").startswith("HTTP/1.1 400")
            assert raw_http(url, b"GET /" + b"x" * 9000).startswith("HTTP/1.1 431")
            assert calls(scrape(url)) == expected
    return expected


async def second_gateway(errlog_path):
    params = gateway_params("--wait", "0", "--strict", "--metrics", "127.0.0.1:0")
    params.env = {"RUST_LOG": "info"}
    with open(errlog_path, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            url = metrics_url(errlog_path)
            await s.list_tools()
            strict = await error_of(s.call_tool("create_incident", {"title": "x"},
                                                read_timeout_seconds=TIMEOUT))
            assert strict.code == -32602 and "strict" in strict.message, strict
            _, busy = await duplicate_during(s, "five", 1.0, "task-d", 1)
            assert busy.code == -32001, busy

            samples = scrape(url)
            expected = dict.fromkeys(OUTCOMES, 0) | {
                "executed": 1, "in_progress": 1, "refused": 1}
            assert calls(samples) == expected, calls(samples)
            assert samples["idemdb_mcp_waited_calls_total"] == 0, "--wait 0: nothing waited"

            lost = await error_of(s.call_tool("create_and_die", {"title": "six"},
                                              read_timeout_seconds=TIMEOUT,
                                              meta=meta("task-d", 2)))
            assert lost.code == -32002, lost
    return expected | {"unknown": 1}


def events(errlog_path):
    """The gateway's tools/call events: one dict of fields each."""
    found = []
    with open(errlog_path) as f:
        for line in f:
            if "idemdb_mcp: tools/call" in line:
                found.append(dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line)))
    return found


def check_events(errlog_path, expected):
    seen = events(errlog_path)
    counted = {o: sum(e["outcome"] == f'"{o}"' for e in seen) for o in OUTCOMES}
    assert counted == expected, (counted, expected)
    for event in seen:
        assert event["tenant"] == '"agent-1"', event
        keyed = event["outcome"] not in ('"unkeyed"', '"read_only"', '"refused"')
        assert ("key" in event) == keyed, event
        if keyed:
            assert event["key"].strip('"').endswith(event["tool"].strip('"')), event
    return seen


async def main():
    first_log = os.path.join(store_dir, "first.stderr")
    second_log = os.path.join(store_dir, "second.stderr")
    first = await first_gateway(first_log)
    seen = check_events(first_log, first)
    released = [e for e in seen if e["outcome"] == '"released"']
    assert released[0]["tool"] == '"unavailable"', released
    assert released[0]["key"] == '"tc1:task-c:2:unavailable"', released
    waited = [e for e in seen if "waited_ms" in e]
    assert sorted(e["outcome"] for e in waited) == ['"in_progress"', '"replayed"'], waited

    second = await second_gateway(second_log)
    seen = check_events(second_log, second)
    unknown = [e for e in seen if e["outcome"] == '"unknown"']
    assert unknown[0]["key"] == '"tc1:task-d:2:create_and_die"', unknown
    with open(second_log) as f:
        assert " WARN idemdb_mcp: tools/call outcome=\"unknown\"" in f.read()

    lines = ledger_lines()
    assert len(lines) == 6, lines  # unkeyed, one, three, four; five, and six (it died).
    total = sum(first.values()) + sum(second.values())
    print(f"counted: {total} tools/call, every outcome counted exactly in /metrics and in one "
          f"event each on stderr ({', '.join(f'{o} {first[o] + second[o]}' for o in OUTCOMES)}); "
          f"2 waits")


anyio.run(main)
