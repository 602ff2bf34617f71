"""The relay's web face: status page, information document, invite page, health and metrics.

    GET /                          status page (JSON information document with Accept: application/json)
    GET /.well-known/sapling-relay the information document, always JSON (engine/relay/info.py)
    GET /stats.json                live numbers and the last day per minute, polled by the status page
    GET /stats/peers.json          the peers whose rollouts others used most today, with their credit
    GET /stats/results.json        each key's latest and best evaluation result, re-scored by the relay
    GET /join?relay=...&token=...  "Open in Sapling" for an invite to this relay, and how to install Sapling;
                                   an invite to another relay gets "this page does not vouch for that relay"
    GET /static/NAME               the page's own script, style sheet and vendored chart library
    GET /healthz, GET /metrics     operations (JSON; Prometheus text)

`RelayPages(relay).add_routes(app)` is called by the relay (engine/relay/server.py).
The pages are files under engine/relay/static/; every value put into them is
HTML-escaped here, the script sets text with `textContent` only, and every
response carries a Content-Security-Policy that allows nothing but the
relay's own origin (no inline script or style), `nosniff` and no referrer
(an invite page's address holds the join token).
"""

from __future__ import annotations

import html
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sized
from importlib import resources
from string import Template
from typing import Any, Protocol
from urllib.parse import urlsplit

from aiohttp import web

from engine import __version__
from engine.common.errors import ConfigError
from engine.common.rules import Invite, check_relay_url, parse_invite
from engine.relay.credit import CreditBook
from engine.relay.info import SOFTWARE, WELL_KNOWN_PATH, info_document
from engine.relay.results import ResultsBook
from engine.relay.settings import RelaySettings
from engine.relay.stats import LiveStats
from engine.swarm import protocol
from engine.swarm.identity import Identity
from engine.swarm.receipts import OUTCOMES as RECEIPT_OUTCOMES

# Where people without Sapling get it; the status and /join pages link here.
DOWNLOAD_URL = "https://github.com/sapling-swarm/sapling/releases"
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
                               "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_ACCEPT_CHARS = 1024
_MEDIA_RANGE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+/[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# Files under engine/relay/static/ served at /static/NAME, and their types; nothing else is.
STATIC_TYPES = {
    "status.js": "text/javascript",
    "relay.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
    "favicon.svg": "image/svg+xml",
}
PAGE_NAMES = ("status.html", "join.html", "foreign.html", "error.html")


class RelayView(Protocol):
    """What the pages read from the relay (engine/relay/server.py's Relay)."""

    settings: RelaySettings
    identity: Identity
    live: LiveStats
    credit: CreditBook
    results: ResultsBook
    metrics: Counter[str]
    rejections: Counter[str]
    started: float

    @property
    def connections(self) -> Sized: ...

    @property
    def online(self) -> int: ...

    def window_size(self) -> int: ...


def wants_json(accept: str) -> bool:
    """True when an Accept header prefers JSON to HTML; ValueError when it is not a valid Accept header.

    The better-ranked of application/json and text/html wins, by q then by how exactly the range
    names it (`application/json` over `application/*` over `*/*`); a tie goes to HTML."""
    if len(accept) > MAX_ACCEPT_CHARS:
        raise ValueError(f"the Accept header is longer than {MAX_ACCEPT_CHARS} characters")
    best = {"json": (0.0, -1), "html": (0.0, -1)}
    for part in accept.split(","):
        media, *params = (p.strip() for p in part.split(";"))
        if not media and not params:
            continue
        if not _MEDIA_RANGE.match(media):
            raise ValueError("the Accept header is not a list of media types")
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    raise ValueError("the Accept header has a q value that is not a number") from None
                if not 0.0 <= q <= 1.0:
                    raise ValueError("the Accept header has a q value outside 0-1")
        kind, _, sub = media.lower().partition("/")
        for target, (want_kind, want_sub) in (("json", ("application", "json")), ("html", ("text", "html"))):
            if kind == want_kind and sub == want_sub:
                rank = (q, 2)
            elif kind == want_kind and sub == "*":
                rank = (q, 1)
            elif kind == "*" and sub == "*":
                rank = (q, 0)
            else:
                continue
            if rank[1] > best[target][1]:  # the most specific range that matches decides the q
                best[target] = rank
    return best["json"][0] > 0 and best["json"] > best["html"]


def _contact_href(contact: str) -> str:
    """A link for the operator's contact: mailto: for an address, the URL itself for http(s); else none."""
    if re.fullmatch(r"[^@\s/:]+@[^@\s/:]+\.[^@\s/:]+", contact):
        return "mailto:" + contact
    if urlsplit(contact).scheme in ("http", "https") and urlsplit(contact).netloc:
        return contact
    return ""


def relay_key(url: str) -> tuple[str, str, int, str]:
    """What makes two relay addresses the same relay: scheme, host (any case), port (the scheme's by default), path."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port, parts.path.rstrip("/") or "/"


def _load(name: str) -> bytes:
    return resources.files("engine.relay").joinpath("static", name).read_bytes()


# A page file holds its own head lines (title, scripts), this line, then its body; page.html is the frame they share.
PAGE_SEPARATOR = "<!-- the head above goes into page.html's <head>, the page below after its <main> -->\n"


def _page_template(name: str) -> Template:
    """Page `name` in the shared frame (static/page.html), as a template of its own values."""
    head, separator, body = _load(name).decode("utf-8").partition(PAGE_SEPARATOR)
    if not separator:
        raise ValueError(f"engine/relay/static/{name} has no head separator line.")
    frame = _load("page.html").decode("utf-8")
    return Template(frame.replace("$page_head", head, 1).replace("$page_body", body, 1))


class RelayPages:
    def __init__(self, relay: RelayView) -> None:
        self.relay = relay
        self.static = {name: _load(name) for name in STATIC_TYPES}
        self.pages = {name: _page_template(name) for name in PAGE_NAMES}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.handle_index)
        app.router.add_get(WELL_KNOWN_PATH, self.handle_info)
        app.router.add_get("/stats.json", self.handle_stats)
        app.router.add_get("/stats/peers.json", self.handle_peers)
        app.router.add_get("/stats/results.json", self.handle_results)
        app.router.add_get("/join", self.handle_join)
        app.router.add_get("/static/{name}", self.handle_static)
        app.router.add_get("/favicon.ico", self.handle_favicon)  # asked for by browsers that skip the <link>
        app.router.add_get("/healthz", self.handle_health)
        app.router.add_get("/metrics", self.handle_metrics)
        app.middlewares.append(self._branded_errors)
        app.on_response_prepare.append(self._secure)

    @staticmethod
    async def _secure(_request: web.Request, response: web.StreamResponse) -> None:
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        response.headers["Server"] = SOFTWARE  # one name, no versions (aiohttp would name itself and Python's)

    @web.middleware
    async def _branded_errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """An unknown path or method gets the relay's own error page instead of aiohttp's bare text."""
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return self._error(404, "Page not found", "This relay has no page at that address; its status page "
                               "has the links to everything it serves.")
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            page = self._error(405, "Method not allowed", f"This address answers {allowed} only, not {exc.method}.")
            page.headers["Allow"] = allowed
            return page

    # -- pages --------------------------------------------------------------------------------
    def _page(self, page: str, status: int = 200, **values: str) -> web.Response:
        body = self.pages[page].substitute(version=html.escape(__version__), download=html.escape(DOWNLOAD_URL),
                                           **values)
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})

    def _error(self, status: int, title: str, sentence: str) -> web.Response:
        return self._page("error.html", status, title=html.escape(title), message=html.escape(sentence))

    def _accept_json(self, request: web.Request) -> bool | web.Response:
        try:
            return wants_json(request.headers.get("Accept", ""))
        except ValueError as exc:
            return self._error(400, "Bad request", f"{str(exc).capitalize()}.")

    async def _live(self) -> dict[str, Any]:
        return await self.relay.live.snapshot(self.relay.online)

    async def _document(self) -> dict[str, Any]:
        snapshot = await self._live()
        return info_document(self.relay.settings, self.relay.identity.public_key, snapshot["live"])

    @staticmethod
    def _json(data: dict[str, Any]) -> web.Response:
        return web.json_response(data, headers={"Cache-Control": "no-store", "Access-Control-Allow-Origin": "*"})

    async def handle_info(self, request: web.Request) -> web.Response:
        accept = self._accept_json(request)
        if isinstance(accept, web.Response):
            return accept
        return self._json(await self._document())

    async def handle_stats(self, request: web.Request) -> web.Response:
        accept = self._accept_json(request)
        if isinstance(accept, web.Response):
            return accept
        return self._json(await self._live())

    async def handle_peers(self, request: web.Request) -> web.Response:
        """The credit board (engine/relay/credit.py): public names and peer ids, never addresses."""
        return await self._board(request, self.relay.credit.board, self.relay.credit.store.errors)

    async def handle_results(self, request: web.Request) -> web.Response:
        """The results table (engine/relay/results.py): names, peer ids and re-scored results, never addresses."""
        return await self._board(request, self.relay.results.board, self.relay.results.errors)

    async def _board(self, request: web.Request, board: Callable[[], Awaitable[dict[str, Any]]],
                     errors: tuple[type[BaseException], ...]) -> web.Response:
        accept = self._accept_json(request)
        if isinstance(accept, web.Response):
            return accept
        try:
            return self._json(await board())
        except errors:
            return web.json_response({"error": "the relay cannot read its store now; try again shortly"}, status=503,
                                     headers={"Cache-Control": "no-store"})

    async def handle_index(self, request: web.Request) -> web.Response:
        accept = self._accept_json(request)
        if isinstance(accept, web.Response):
            return accept
        if accept:
            return self._json(await self._document())
        settings = self.relay.settings
        live = (await self._live())["live"]
        private = bool(settings.join_token)
        if private:
            policy_text = "Private swarm: nodes need a join token from its operator."
        elif settings.allow_keys:
            policy_text = "Private swarm: only nodes on its allow-list are let in."
        else:
            policy_text = "Open swarm: anyone with Sapling can join."
        return self._page(
            "status.html",
            name=html.escape(settings.name),
            description=html.escape(settings.description),
            policy=html.escape(policy_text),
            operator=self._operator_html(),
            contact=self._contact_html(),
            peers=str(int(live["peers_online"])),
            rate=html.escape(f"{live['rollouts_per_minute']:g}"),
            hour=str(int(live["batches_last_hour"])),
            joined=str(int(live["joined_today"])),
            protocol=str(protocol.VERSION),
            software=SOFTWARE,
            join=self._join_section(request, private),
            dataset=self._dataset_html(),
        )

    def _dataset_html(self) -> str:
        """The status page's line on the swarm's dataset (engine/relay/dataset.py): none when it keeps none."""
        settings = self.relay.settings
        if not settings.dataset_dir:
            return ""
        line = (f"Answers shared here may be published in this swarm's dataset, license "
                f"{html.escape(settings.dataset_license)}.")
        if settings.dataset_url:
            line += f' <a id="dataset-link" href="{html.escape(settings.dataset_url)}">The latest export</a>.'
        return f'<p id="dataset">{line}</p>'

    def _contact_html(self) -> str:
        contact = self.relay.settings.contact
        href = _contact_href(contact)
        if href:
            return f'<a href="{html.escape(href)}">{html.escape(contact)}</a>'
        return html.escape(contact) if contact else "not given"

    def _operator_html(self) -> str:
        return html.escape(self.relay.settings.operator or "not given")

    def _relay_urls(self, request: web.Request) -> tuple[str, ...]:
        """The addresses to invite people to: --public-url, else this request's host (for display only)."""
        if self.relay.settings.public_url:
            return tuple(self.relay.settings.public_url)
        proto = request.headers.get("X-Forwarded-Proto", request.scheme).split(",")[0].strip().lower()
        try:
            return (check_relay_url(f"{'wss' if proto == 'https' else 'ws'}://{request.host}/ws"),)
        except ValueError:  # ConfigError, or urllib's own for a Host header like "["
            return ()

    def _join_section(self, request: web.Request, private: bool) -> str:
        if private:
            return ('<p>This swarm is private. Ask its operator (see "Contact" below) for an invite link; '
                    "it carries the join token.</p>")
        urls = self._relay_urls(request)
        if not urls:
            return "<p>Ask the operator for this relay's address.</p>"
        invite = Invite(urls, "", self.relay.settings.name)
        link = html.escape(invite.link())
        page = html.escape(invite.page_url())
        return (f'<p><a class="button" id="open-link" href="{link}">Open in Sapling</a></p>'
                f'<p>Or paste this link into Sapling\'s "Join a swarm" field:</p>'
                f'<p><code id="invite-link">{link}</code></p>'
                f'<p>To send to someone without Sapling: <a href="{page}">{page}</a></p>')

    async def handle_join(self, request: web.Request) -> web.Response:
        """An invite page for this relay's own addresses only; an invite to any other relay gets a page saying
        that this site does not vouch for it (a link could otherwise dress someone else's relay in this site's
        name and certificate)."""
        accept = self._accept_json(request)
        if isinstance(accept, web.Response):
            return accept
        try:
            invite = parse_invite(f"https://relay.invalid/join?{request.query_string}")
        except ConfigError as exc:
            return self._error(400, "Not a valid invite", str(exc))
        settings = self.relay.settings
        own = {relay_key(url) for url in self._relay_urls(request)}
        if not all(relay_key(url) in own for url in invite.relays):
            return self._foreign_invite(invite)
        relays = "".join(f"<li><code>{html.escape(url)}</code></li>" for url in invite.relays)
        if invite.token:
            privacy = "A private swarm: this link carries its join token, so share it only with people you want in."
        else:
            privacy = "An open swarm: anyone with Sapling can join."
        vouched = Invite(invite.relays, invite.token, settings.name)  # the relay's own name, never the link's
        return self._page(
            "join.html",
            name=html.escape(settings.name),
            description=html.escape(settings.description),
            privacy=html.escape(privacy),
            relays=relays,
            link=html.escape(vouched.link()),
            operator=self._operator_html(),
            contact=self._contact_html(),
        )

    def _foreign_invite(self, invite: Invite) -> web.Response:
        relays = "".join(f"<li><code>{html.escape(url)}</code></li>" for url in invite.relays)
        claimed = ""
        if invite.name:
            claimed = (f'<p>The link calls its swarm <q class="claimed" id="claimed-name">{html.escape(invite.name)}'
                       "</q>; anyone can write any name into a link.</p>")
        return self._page("foreign.html", relays=relays, claimed=claimed, own=html.escape(self.relay.settings.name))

    async def handle_static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = self.static.get(name)
        if body is None:
            raise web.HTTPNotFound()  # the branded page (_branded_errors)
        return web.Response(body=body, content_type=STATIC_TYPES[name], charset="utf-8",
                            headers={"Cache-Control": "public, max-age=300"})

    async def handle_favicon(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.static["favicon.svg"], content_type="image/svg+xml",
                            headers={"Cache-Control": "public, max-age=86400"})

    # -- operations -----------------------------------------------------------------------------
    async def handle_health(self, _request: web.Request) -> web.Response:
        relay = self.relay
        return web.json_response({
            "status": "ok",
            "connections": len(relay.connections),
            "online": relay.online,
            "window": relay.window_size(),
            "uptime_s": round(time.time() - relay.started, 1),
        })

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        relay = self.relay
        lines = [
            "# HELP sapling_relay_connections Open websocket connections.",
            "# TYPE sapling_relay_connections gauge",
            f"sapling_relay_connections {len(relay.connections)}",
            "# HELP sapling_relay_peers_online Authenticated peers across the swarm.",
            "# TYPE sapling_relay_peers_online gauge",
            f"sapling_relay_peers_online {relay.online}",
            "# HELP sapling_relay_window_batches Batches held for sampling.",
            "# TYPE sapling_relay_window_batches gauge",
            f"sapling_relay_window_batches {relay.window_size()}",
        ]
        for name, help_text in (
            ("publishes", "Batches accepted."),
            ("resends_acknowledged", "Batches sent again after a lost acknowledgement, already held: acknowledged, "
             "not stored twice."),
            ("samples", "Sample requests answered."),
            ("batches_served", "Batches sent in sample replies."),
            ("handshakes", "Completed handshakes."),
            ("bytes_in", "Websocket bytes received."),
            ("bytes_out", "Websocket bytes sent."),
        ):
            lines += [
                f"# HELP sapling_relay_{name}_total {help_text}",
                f"# TYPE sapling_relay_{name}_total counter",
                f"sapling_relay_{name}_total {relay.metrics[name]}",
            ]
        lines += [
            "# HELP sapling_relay_receipt_items_total Items named in receipts, by outcome "
            "(docs/protocol.md, Receipts).",
            "# TYPE sapling_relay_receipt_items_total counter",
        ]
        lines += [f'sapling_relay_receipt_items_total{{result="{name}"}} {relay.credit.metrics[name]}'
                  for name in RECEIPT_OUTCOMES]
        dataset = getattr(relay, "dataset", None)
        for metric, counts, kinds, help_text in (
            ("results", relay.results.metrics, ("results", "results_unchecked"), "Evaluation reports re-scored "
             "and kept, and those taken unchecked for want of reasoning-gym (engine/relay/results.py)."),
            ("dataset_kept", dataset and dataset.metrics, ("batches", "used", "write_errors", "pruned"), "Batches, "
             "used items, failed writes and pruned segments of the swarm's dataset (engine/relay/dataset.py)."),
        ):
            if counts is not None:
                lines += [f"# HELP sapling_relay_{metric}_total {help_text}",
                          f"# TYPE sapling_relay_{metric}_total counter"]
                lines += [f'sapling_relay_{metric}_total{{kind="{k}"}} {counts[k]}' for k in kinds]
        lines += [
            "# HELP sapling_relay_rejections_total Messages or connections refused, by error code.",
            "# TYPE sapling_relay_rejections_total counter",
        ]
        lines += [f'sapling_relay_rejections_total{{code="{code}"}} {relay.rejections[code]}'
                  for code in protocol.ERROR_CODES]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")
