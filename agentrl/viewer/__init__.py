"""`agentrl view`: a local web page over trajectory files, token by token.

    run dir / .jsonl -> TrajectoryIndex (byte offsets, followed live) -> create_app (FastAPI)
        -> static/index.html + app.js (no CDN) in the browser

See docs/guides/viewer.md.
"""

from agentrl.viewer.app import create_app
from agentrl.viewer.index import Entry, Filters, Source, TrajectoryIndex

__all__ = ["Entry", "Filters", "Source", "TrajectoryIndex", "create_app"]
