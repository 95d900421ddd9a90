"""The console's aiohttp application: shared state, the middlewares every request passes, rendering.

Every request passes, in order:
1. `_sessions`: finds or starts the browser's session (cookie `sluice_console`).
2. `_errors`: a `SluiceError` or `ConfigError` escaping a page becomes that page's error box with
   the code's name and the message (never a traceback); anything else is logged and answered 500.
3. `_guard`: with `auth = "on"`, every page but /login and /static needs a logged-in admin user;
   every POST must carry the session's CSRF token (403 otherwise, nothing changed); with
   `read_only`, every POST but login and logout is refused (403).
4. `_view`: the page is one `admin.cluster.view()`: the answers it reuses (broker list, routes,
   the proxies' client reports) are ones it asked for itself, never older than the request.

Pages live in console/pages_*.py; they call the same functions as `sluice admin`
(admin/*) and render their `Report`s. A POST that changes the cluster is logged (who,
what, outcome) and answers with a redirect to a page showing the outcome (post/redirect/get).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from admin.cluster import Cluster, view
from admin.output import format_time_ms
from common.config import ConfigError
from common.errors import SluiceError
from console.config import ConsoleConfig
from console.history import History
from console.labels import cell_class, heading
from console.plots import MemoryPlots, Plots, PrometheusPlots
from console.sessions import COOKIE, CSRF_FIELD, Session, Sessions, csrf_ok
from navigation.client import NavigationClient

log = logging.getLogger("sluice.console")

HERE = Path(__file__).parent
PUBLIC_PREFIXES = ("/login", "/static/")
ALWAYS_ALLOWED_POSTS = ("/login", "/logout")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Console:
    """What every page needs; one per application (`app[CONSOLE]`)."""

    config: ConsoleConfig
    cluster: Cluster
    navigation: NavigationClient | None
    sessions: Sessions
    history: History
    plots: Plots
    templates: jinja2.Environment


CONSOLE = web.AppKey("console", Console)
SESSION_KEY = web.RequestKey("session", Session)


def console_of(request: web.Request) -> Console:
    return request.app[CONSOLE]


def session_of(request: web.Request) -> Session:
    return request[SESSION_KEY]


def build_app(config: ConsoleConfig, cluster: Cluster, navigation: NavigationClient | None = None) -> web.Application:
    from console import (
        pages_access,
        pages_amqp,
        pages_cluster,
        pages_dlq,
        pages_groups,
        pages_messages,
        pages_mqtt,
        pages_topics,
    )

    app = web.Application(middlewares=[_sessions, _errors, _guard, _view], client_max_size=1024 * 1024)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined
    )
    env.filters["time"] = format_time_ms
    env.filters["heading"] = heading
    env.filters["cell_class"] = cell_class
    history = History(history_s=config.history_s, interval_s=config.sample_interval_s, watched_max=config.watched_max,
                      cluster_topics_max=config.cluster_topics_max)  # fmt: skip
    plots: Plots = MemoryPlots(history)
    if config.prometheus:
        plots = PrometheusPlots(config.prometheus, history=history, range_s=config.history_s,
                                step_s=config.sample_interval_s, window_s=config.prometheus_rate_window_s,
                                timeout_s=config.timeout_s)  # fmt: skip
    app[CONSOLE] = Console(
        config=config,
        cluster=cluster,
        navigation=navigation,
        sessions=Sessions(idle_s=config.session_idle_s, max_sessions=config.sessions_max),
        history=history,
        plots=plots,
        templates=env,
    )

    async def close_plots(_: web.Application) -> None:
        await plots.close()

    app.on_cleanup.append(close_plots)
    app.router.add_static("/static/", HERE / "static")
    for module in (pages_cluster, pages_topics, pages_groups, pages_messages, pages_dlq, pages_amqp, pages_mqtt,
                   pages_access):  # fmt: skip
        module.add_routes(app.router)
    return app


# -- rendering --------------------------------------------------------------------------------------


def render(request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
    console = console_of(request)
    session = session_of(request)
    page = console.templates.get_template(template).render(
        csrf=session.csrf,
        csrf_field=CSRF_FIELD,
        user=session.user,
        auth=console.config.auth_required,
        read_only=console.config.read_only,
        flashes=session.take_flashes(),
        path=request.path,
        **context,
    )
    return web.Response(text=page, status=status, content_type="text/html", headers=_NO_STORE)


def redirect_with(request: web.Request, location: str, kind: str, text: str) -> web.Response:
    """The answer to a POST: a one-shot message for the next page, and a redirect (303) to it."""
    session_of(request).flash(kind, text)
    return web.Response(status=303, headers={"Location": location, **_NO_STORE})


def log_action(request: web.Request, what: str, outcome: str) -> None:
    user = session_of(request).user or "(no auth)"
    log.info("console action by %s from %s: %s: %s", user, request.remote, what, outcome)


async def act(request: web.Request, what: str, back: str, action: Callable[[], Awaitable[str]],
              done: str | None = None) -> web.Response:  # fmt: skip
    """Run one state change for a POST: log it, and redirect with its note or its error."""
    try:
        note = await action()
    except (SluiceError, ConfigError) as exc:
        log_action(request, what, f"refused: {describe(exc)}")
        return redirect_with(request, back, "error", f"{what}: {describe(exc)}")
    log_action(request, what, f"done: {note}")
    return redirect_with(request, done or back, "ok", note or f"{what}: done")


async def delete_confirmed(request: web.Request, kind: str, delete: Callable[[str], Awaitable[str]],
                           home: str) -> web.Response:  # fmt: skip
    """A delete form's POST (`/<home>/<name>/delete`): done only when the form's `confirm` field
    repeats the name; `delete(name)` returns the note shown after."""
    name = request.match_info["name"]
    form = await request.post()

    async def run() -> str:
        if form.get("confirm") != name:
            raise ConfigError(f"type the {kind}'s name ({name}) to confirm its deletion")
        return await delete(name)

    return await act(request, f"delete {kind} {name}", f"{home}/{name}", run, done=home)


_NO_STORE = {"Cache-Control": "no-store", "X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff",
             "Content-Security-Policy": "default-src 'self'; style-src 'self'; img-src 'self' data:; "
                                        "frame-ancestors 'none'; form-action 'self'"}  # fmt: skip


def describe(exc: Exception) -> str:
    if isinstance(exc, SluiceError):
        return f"{exc.code.name}: {exc}"
    return f"bad input: {exc}"


# -- middlewares ------------------------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        if SESSION_KEY not in request:
            raise
        return render(request, "error.html", status=404, message=f"NOT_FOUND: the console has no page {request.path}")
    except web.HTTPException:
        raise
    except (SluiceError, ConfigError) as exc:
        return render(request, "error.html", status=error_status(exc), message=describe(exc))
    except Exception:
        log.exception("console page %s %s failed", request.method, request.path)
        return render(request, "error.html", status=500, message="INTERNAL_ERROR: the console failed; see its log")


def error_status(exc: SluiceError | ConfigError) -> int:
    """The HTTP status of a page showing `exc`: 400 for bad input, 404 for not found, 502 otherwise."""
    if isinstance(exc, ConfigError):
        return 400
    status = int(exc.code) // 100  # apache.rocketmq.v2.Code: 40402 -> 404
    return status if 400 <= status < 500 else 502


@web.middleware
async def _view(request: web.Request, handler: Handler) -> web.StreamResponse:
    with view():
        return await handler(request)


@web.middleware
async def _sessions(request: web.Request, handler: Handler) -> web.StreamResponse:
    sessions = console_of(request).sessions
    session = sessions.get(request.cookies.get(COOKIE))
    fresh = session is None
    if session is None:
        session = sessions.new()
    request[SESSION_KEY] = session
    try:
        response = await handler(request)
    except web.HTTPException as answer:
        _set_cookie(answer, request[SESSION_KEY], fresh or request[SESSION_KEY] is not session)
        raise
    _set_cookie(response, request[SESSION_KEY], fresh or request[SESSION_KEY] is not session)
    return response


def _set_cookie(response: web.StreamResponse, session: Session, changed: bool) -> None:
    if changed:
        response.set_cookie(COOKIE, session.session_id, httponly=True, samesite="Strict", path="/")


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    console = console_of(request)
    session = session_of(request)
    public = request.path.startswith(PUBLIC_PREFIXES)
    if console.config.auth_required and not session.user and not public:
        if request.method == "POST":
            return render(request, "error.html", status=401, message="log in first; nothing was changed")
        raise web.HTTPSeeOther(f"/login?next={request.path_qs}" if request.path != "/" else "/login")
    if request.method == "POST":
        form = await request.post()
        sent = form.get(CSRF_FIELD)
        if not isinstance(sent, str) or not csrf_ok(session, sent):
            log_action(request, f"POST {request.path}", "refused: no or wrong CSRF token")
            return render(request, "error.html", status=403,
                          message="this form did not come from this console session (missing or wrong CSRF "
                                  "token), so nothing was changed; reload the page and try again")  # fmt: skip
        if console.config.read_only and request.path not in ALWAYS_ALLOWED_POSTS:
            log_action(request, f"POST {request.path}", "refused: read-only console")
            return render(request, "error.html", status=403,
                          message="the console runs read-only (--read-only): nothing can be changed here")  # fmt: skip
    return await handler(request)
