"""The web status page, `/ui/`: nodes, buckets, the vbucket map, DCP connections with each stream's
position and lag, replica links, recent events, and charts of ops/s and DCP backlog.

Rendered here as HTML (every value escaped); `static/ui.js` refreshes the page's <main> from
`/ui/main` every two seconds and draws the charts from `/ui/series.json` (the Observer's samples).
No build step: `static/` holds the stylesheet and the script as written.

Login as ns_server's console does it: a form posts the user's name and password to `/uilogin`,
which sets a session cookie (HttpOnly, SameSite=Strict); the cookie is accepted for GET only
(server/mgmt/app.py), so the page can read but not change anything. Basic auth works too. A
user sees the node and the buckets they may read stats of.
"""

import html
import json
import time
from pathlib import Path

from aiohttp import web

from ..audit import LOGIN_FAILURE
from . import dcpview
from .app import LISTENER, SERVER, SESSION_COOKIE, USER, allowed, check_login, read_form, reply_json
from .buckets import settings_of

routes = web.RouteTableDef()

STATIC = Path(__file__).parent / "static"
REFRESH_SECONDS = 2
_e = html.escape


def _page(title: str, body: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<link rel="icon" href="/ui/static/favicon.svg" type="image/svg+xml">'
            f'<link rel="stylesheet" href="/ui/static/ui.css"></head><body>{body}</body></html>')


def _html(text: str, status: int = 200, headers=None) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", headers=headers)


def _ago(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h"


def _table(cls: str, head: list[str], rows: list[str], empty: str) -> str:
    if not rows:
        return f'<p class="empty">{_e(empty)}</p>'
    heads = "".join(f"<th>{_e(h)}</th>" for h in head)
    return f'<table class="{cls}"><thead><tr>{heads}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _row(cells: list, cls: str = "", attrs: str = "") -> str:
    tds = "".join(f"<td>{_e(str(c))}</td>" for c in cells)
    return f'<tr class="{cls}"{attrs}>{tds}</tr>'


# ---------------------------------------------------------------------------------------------
# sections


def _nodes(server) -> str:
    rows = []
    for i, n in enumerate(server.topology.nodes):
        host = "this node" if n.this_node else n.hostname
        rows.append(_row([i, host, n.kv_port, n.mgmt_port, n.kv_ssl_port or "", n.mgmt_ssl_port or "",
                          "serving" if n.this_node else "in the map"], "node"))
    return _table("nodes", ["#", "node", "KV", "mgmt", "KV TLS", "mgmt TLS", "status"], rows, "no nodes")


def _buckets(server, visible) -> str:
    rows = []
    observer = server.mgmt.observer
    for name, bucket in visible:
        stats = bucket.engine.stats()
        settings = settings_of(bucket)
        rows.append(_row([name, stats["curr_items"], stats["vb_active_num"], stats["vb_replica_num"],
                          f"{observer.ops_per_second(name):.0f}", stats["ep_queue_size"],
                          bucket.engine.conflict_resolution.value, settings["replicaNumber"],
                          "yes" if settings["flushEnabled"] else "no"], "bucket", f' data-name="{_e(name)}"'))
    return _table("buckets", ["bucket", "items", "active vbuckets", "replica vbuckets", "ops/s", "disk queue",
                              "conflict resolution", "replicas", "flush"], rows, "no buckets")


def _vbucket_map(server, visible) -> str:
    """One cell per vbucket: where its active copy is (here, on another node, nowhere)."""
    out = []
    me = server.topology.this_node
    for name, bucket in visible:
        vmap = json.loads(bucket.config())["vBucketServerMap"]["vBucketMap"]
        cells = []
        counts = dict.fromkeys(("here", "elsewhere", "none"), 0)
        for vb, chain in enumerate(vmap):
            active = chain[0]
            cls = "here" if active == me else ("none" if active < 0 else "elsewhere")
            counts[cls] += 1
            title = f"vb {vb}: active on node {active}" if active >= 0 else f"vb {vb}: no active copy"
            if len(chain) > 1:
                title += ", replicas on " + ", ".join(str(r) if r >= 0 else "none" for r in chain[1:])
            cells.append(f'<span class="vb {cls}" title="{_e(title)}"></span>')
        out.append(f'<div class="vbmap" data-bucket="{_e(name)}"><h3>{_e(name)}: {len(vmap)} vbuckets - '
                   f'{counts["here"]} active here, {counts["elsewhere"]} elsewhere, {counts["none"]} without an '
                   f'active</h3><div class="cells">{"".join(cells)}</div></div>')
    return "".join(out) or '<p class="empty">no buckets</p>'


def _dcp(views) -> str:
    if not views:
        return '<p class="empty">no DCP connections</p>'
    out = []
    for v in views:
        fc = f"{v.unacked_bytes} of {v.buffer_size} B unacknowledged" if v.buffer_size else "off"
        backlog = (f", {v.items_remaining} items not yet queued, {sum(s.queue_bytes for s in v.streams)} B queued"
                   if v.type == "producer" else "")
        summary = (f'<span class="name">{_e(v.name)}</span> <span class="type">{_e(v.type)}</span> '
                   f'bucket {_e(v.bucket)}, peer {_e(v.peer)}, {len(v.streams)} streams, '
                   f'flow control {_e(fc)}{backlog}')
        rows = []
        for s in v.streams:
            cells = [s.vb, "" if s.sid is None else s.sid, s.state]
            if v.type == "producer":
                cells += [s.stats.get("start_seqno", ""), s.position, s.high_seqno, s.items_remaining,
                          s.queue_bytes]
            else:
                cells += [s.stats.get("start_seqno", ""), s.position, s.stats.get("items", ""),
                          s.stats.get("rollbacks", "")]
            rows.append(_row(cells, "stream", f' data-vb="{s.vb}"'))
        head = (["vb", "sid", "state", "start", "last queued", "high seqno", "lag (items to queue)", "queued bytes"]
                if v.type == "producer" else ["vb", "sid", "state", "start", "last received", "items", "rollbacks"])
        out.append(f'<details class="conn" data-name="{_e(v.name)}" data-type="{_e(v.type)}">'
                   f'<summary>{summary}</summary>{_table("streams", head, rows, "no streams")}</details>')
    return "".join(out)


def _links(views) -> str:
    rows = []
    for v in views:
        if not v.replication:
            continue
        lag = v.items_remaining if v.type == "producer" else ""
        direction = "outgoing (actives here)" if v.type == "producer" else "incoming (replicas here)"
        rows.append(_row([v.name, direction, v.bucket, len(v.streams), lag], "link", f' data-name="{_e(v.name)}"'))
    return _table("links", ["link", "direction", "bucket", "streams", "lag (items)"], rows, "no replica links")


def _events(server, may_see) -> str:
    rows = [_row([time.strftime("%H:%M:%S", time.localtime(ev.time)), ev.kind, ev.bucket, ev.text],
                 f"event {ev.kind}") for ev in reversed(server.mgmt.observer.events) if may_see(ev.bucket)]
    return _table("events", ["time", "kind", "bucket", "what"], rows[:100], "nothing has happened yet")


def main_html(server, user) -> str:
    def may_see(bucket: str) -> bool:
        return allowed(user, "bucket.stats", bucket)

    visible = [(n, b) for n, b in list(server.buckets.items()) if may_see(n)]
    views = dcpview.views(server, may_see)
    topology = server.topology
    return (f'<p class="node">KV port {server.port}, management port {server.mgmt.port}, '
            f'version {_e(server.version)}, up {_ago(time.time() - server.started)}, '
            f'{len(server.connections)} connections, signed in as {_e(user.name)} - map rev {topology.rev}'
            f'{f", node {topology.this_node} of a cluster" if len(topology.nodes) > 1 else ""}</p>'
            f'<section id="nodes"><h2>Nodes</h2>{_nodes(server)}</section>'
            f'<section id="buckets"><h2>Buckets</h2>{_buckets(server, visible)}</section>'
            f'<section id="dcp"><h2>DCP connections</h2>{_dcp(views)}</section>'
            f'<section id="links"><h2>Replica links</h2>{_links(views)}</section>'
            f'<section id="events"><h2>Recent events</h2>{_events(server, may_see)}</section>'
            f'<section id="vbmap"><h2>Vbucket map</h2>{_vbucket_map(server, visible)}</section>')


def _charts() -> str:
    def chart(cid: str, title: str) -> str:
        return (f'<figure class="chart"><figcaption>{title} <span class="now" id="{cid}-now"></span></figcaption>'
                f'<svg id="{cid}" viewBox="0 0 300 80" preserveAspectRatio="none"><polyline points=""/></svg>'
                f'</figure>')

    return (f'<section id="charts">{chart("chart-ops", "KV ops/s")}'
            f'{chart("chart-backlog", "DCP backlog (items to queue)")}</section>')


# ---------------------------------------------------------------------------------------------
# routes


def _user(request: web.Request):
    return request.get(USER)


@routes.get("/ui/login")
async def login_page(request: web.Request, message: str = "", status: int = 200) -> web.Response:
    note = f'<p class="error">{_e(message)}</p>' if message else ""
    form = ('<form class="login" method="post" action="/uilogin"><h1>dcpflow</h1>'
            f'{note}<label>User <input name="user" id="user" autocomplete="username" autofocus></label>'
            '<label>Password <input name="password" id="password" type="password" autocomplete="current-password">'
            '</label><button type="submit" id="sign-in">Sign in</button></form>')
    return _html(_page("dcpflow - sign in", form), status)


@routes.post("/uilogin")
async def login(request: web.Request) -> web.Response:
    form = await read_form(request)
    user = check_login(request, form.get("user", ""), form.get("password", ""), event=LOGIN_FAILURE)
    if user is None:
        return await login_page(request, "Wrong user name or password.", 401)
    token = request.app[LISTENER].logins.open_session(user)
    response = web.HTTPSeeOther("/ui/")
    response.set_cookie(SESSION_COOKIE, token, httponly=True, samesite="Strict", path="/")
    raise response


@routes.post("/uilogout")
async def logout(request: web.Request) -> web.Response:
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        request.app[LISTENER].logins.close_session(token)
    response = web.HTTPSeeOther("/ui/login")
    response.del_cookie(SESSION_COOKIE, path="/")
    raise response


@routes.get("/ui")
async def ui_redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui/")


@routes.get("/ui/")
async def ui_page(request: web.Request) -> web.Response:
    user = _user(request)
    if user is None:
        raise web.HTTPSeeOther("/ui/login")
    server = request.app[SERVER]
    body = (f'<header><h1>dcpflow</h1><form method="post" action="/uilogout"><button id="sign-out">Sign out'
            f'</button></form></header>{_charts()}<main data-refresh="{REFRESH_SECONDS}">{main_html(server, user)}'
            f'</main><script src="/ui/static/ui.js"></script>')
    return _html(_page(f"dcpflow - {server.config.host}:{server.port}", body))


@routes.get("/ui/main")
async def ui_main(request: web.Request) -> web.Response:
    user = _user(request)
    if user is None:
        raise web.HTTPUnauthorized()
    return _html(main_html(request.app[SERVER], user))


@routes.get("/ui/series.json")
async def ui_series(request: web.Request) -> web.Response:
    user = _user(request)
    if user is None:
        raise web.HTTPUnauthorized()
    samples = list(request.app[SERVER].mgmt.observer.samples)

    def total(values: dict) -> float:
        return sum(v for b, v in values.items() if allowed(user, "bucket.stats", b))

    return reply_json({"t": [round(s.time, 3) for s in samples],
                       "ops": [round(total(s.ops_per_second), 1) for s in samples],
                       "backlog": [total(s.backlog) for s in samples]})


routes.static("/ui/static", STATIC)
