"""`ledger_server.py`'s tools served on Streamable HTTP (official Python SDK, its default
stateful transport: a session id, answers on SSE streams) at http://127.0.0.1:PORT/mcp.

    python ledger_http_server.py LEDGER_PATH PORT
"""

import sys

from ledger_server import app  # reads the ledger's path from sys.argv[1]

if __name__ == "__main__":
    app.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
