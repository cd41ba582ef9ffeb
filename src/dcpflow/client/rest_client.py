"""A client of the management port's REST API for the command line (`dcpflow fault`, `dcpflow
collections`), with the standard library only: Basic authentication, form parameters, the JSON
answer, and ns_server's refusals turned into one line a person can act on.
"""

import argparse
import base64
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request


def admin_arguments() -> argparse.ArgumentParser:
    """The options every management-port command takes: where (`--url`) and who (`-u`/`-p`)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default="http://127.0.0.1:8091",
                        help="the server's management port (default http://127.0.0.1:8091; HOST:PORT works)")
    common.add_argument("-u", "--username", default="Administrator", help="an admin (default Administrator)")
    common.add_argument("-p", "--password", help="default: $DCPFLOW_PASSWORD, else 'password'")
    return common


def password_of(args: argparse.Namespace) -> str:
    """`-p`, else $DCPFLOW_PASSWORD, else the demo's 'password'."""
    return args.password if args.password is not None else os.environ.get("DCPFLOW_PASSWORD", "password")


class RestError(Exception):
    """The server refused, or could not be reached: the message says which and why."""


def base_url(url: str) -> str:
    """`host:port` or a full http(s) URL, without a trailing slash."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise RestError(f"--url {url!r} is not an http(s) URL of a management port (http://HOST:8091)")
    return f"{parts.scheme}://{parts.netloc}"


def call(url: str, user: str, password: str, method: str, path: str, params: dict | None = None,
         timeout: float = 180.0):
    """One request; the JSON answer, or RestError with the server's own words."""
    body = None
    headers = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    if params:
        body = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None}).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    req = urllib.request.Request(base_url(url) + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=ssl.create_default_context()) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        raise RestError(_refusal(e.code, e.read())) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise RestError(f"cannot reach {base_url(url)}: {reason}") from None


def _refusal(status: int, body: bytes) -> str:
    if status == 401:
        return "401: wrong or missing user and password (-u/-p: an admin of the server)"
    try:
        doc = json.loads(body)
    except ValueError:
        return f"{status}: {body.decode('utf-8', 'replace').strip() or 'no details'}"
    if isinstance(doc, dict) and isinstance(doc.get("errors"), dict):
        return f"{status}: " + "; ".join(msg if field == "_" else f"{field}: {msg}"
                                         for field, msg in doc["errors"].items())
    if isinstance(doc, dict) and "message" in doc:
        return f"{status}: {doc['message']} {', '.join(doc.get('permissions', []))}".rstrip()
    return f"{status}: {doc}"
