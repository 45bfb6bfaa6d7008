"""``polar view``: results, a ``polar generate`` folder or an exported dataset as one self-contained HTML page
(docs/view.md): ``load_view`` reads them into the view model, ``render_html`` writes the page, ``ViewServer`` serves
it on localhost."""

from polar_cli.view.load import load_view, session_view
from polar_cli.view.model import ChainStart, ChainView, SessionView, ViewData
from polar_cli.view.render import render_html
from polar_cli.view.serve import ViewServer

__all__ = ["ChainStart", "ChainView", "SessionView", "ViewData", "ViewServer", "load_view", "render_html",
           "session_view"]  # fmt: skip
