"""What the tests of the gateway on Streamable HTTP share: starting `idemdb-mcp serve --listen
127.0.0.1:0 ...` and reading the URL it prints once listening."""

import subprocess
import threading


def start_listening(command):
    """Starts the gateway `command` (with `--listen 127.0.0.1:0`); returns the process and its
    URL, read from the line it prints once listening. Its stderr is drained on a thread after
    that, so it never blocks."""
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].strip()
            break
    assert url and url.endswith("/mcp"), f"the gateway did not listen (exit {proc.poll()})"
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    return proc, url
