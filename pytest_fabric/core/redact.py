"""Secrets never leave the harness: the values of secret-looking variables become ``***``.

Ranks inherit the harness's environment, so a rank that prints its environment, or a traceback that
shows a dict of settings, puts a token into its log, and from there into a failure report, the
JUnit file, the saved results and the reports made of them. Everything the harness writes for a
person or a dashboard goes through ``redact`` (text) or ``redact_data`` (JSON-like records) first.

Two rules:

- the *value* of every secret-looking variable of the environment (``os.environ``, plus values the
  user gave through ``fabric_env`` / ``--fabric-env``, see ``remember``) is replaced wherever it
  appears; values shorter than ``MIN_SECRET_LEN`` are left alone (masking ``1`` or ``true``
  everywhere would mangle the text and hide nothing);
- ``NAME=value`` and ``"NAME": "value"`` with a secret-looking NAME lose their value whatever it is,
  so a secret that is not in this process's environment (a remote host's, a file's) is caught too.

A name is secret-looking when one of its ``_``-separated words is TOKEN, SECRET(S), PASSWORD, PASSWD,
CREDENTIAL(S) or APIKEY, or ends in TOKEN, SECRET, PASSWORD, PASSWD or APIKEY (``GHTOKEN``,
``PGPASSWORD``); or when a word is KEY(S), AUTH, PASS, COOKIE or PRIVATE or it starts with ``AWS_``,
and the name is an environment variable's (upper case) or has several words (``api_key``): a lone
lower-case ``key`` is a JSON field or a keyword argument, not a secret. Whole words only:
``KEYBOARD``, ``MONKEY`` and ``tokens_per_s`` are not secrets.
"""

from __future__ import annotations

import html
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from .atomic import write_text

MASK = "***"
MIN_SECRET_LEN = 6

_WORDS = {"TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "APIKEY"}
_WEAK_WORDS = {"KEY", "KEYS", "AUTH", "PASS", "COOKIE", "PRIVATE"}  # secret-looking in NAME_KEY, not as 'key'
_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY")
_NOT_SECRET = {"SSH_AUTH_SOCK", "PWD", "OLDPWD"}  # a socket path, the working directory

# NAME=value (shell, env dumps, command lines) and "NAME": "value" / 'NAME': 'value' (JSON, dict reprs).
_ASSIGNMENT = re.compile(
    r"""(?P<lead>(?P<q>["']?)\b(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P=q)\s*(?:=|:\s*(?=["'])))"""
    r"""(?P<value>"[^"\n]*"|'[^'\n]*'|[^\s"',;}\])]+)""")

_extra: set[str] = set()  # secret values given other than through the environment


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    if upper in _NOT_SECRET:
        return False
    words = [w for w in upper.split("_") if w]
    if any(w in _WORDS or w.endswith(_SUFFIXES) for w in words):
        return True
    env_like = name == upper or len(words) > 1
    return env_like and (upper.startswith("AWS_") or any(w in _WEAK_WORDS for w in words))


def remember(env: Mapping[str, str]) -> None:
    """Treat the values of ``env``'s secret-looking names as secrets too (``--fabric-env`` settings)."""
    _extra.update(v for k, v in env.items() if is_secret_name(k) and isinstance(v, str))


def secret_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """The values to mask: the secret-looking variables of ``environ`` (default os.environ) and the
    remembered ones, long enough to be worth masking."""
    environ = os.environ if environ is None else environ
    values = {v for k, v in environ.items() if is_secret_name(k)} | _extra
    return {v.strip() for v in values if len(v.strip()) >= MIN_SECRET_LEN}


def _pattern(values: Iterable[str]) -> re.Pattern[str] | None:
    # Also the forms the value takes in XML and HTML files (a '&' in a token is '&amp;' there).
    forms = {f for v in values for f in (v, html.escape(v, quote=False), html.escape(v))}
    if not forms:
        return None
    return re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))


def _mask_assignment(match: re.Match[str]) -> str:
    if not is_secret_name(match["name"]):
        return match[0]
    value = match["value"]
    quote = value[0] if value[:1] in ("'", '"') else ""
    inner = value[1:-1] if quote else value
    if not inner or inner == MASK:
        return match[0]
    return f"{match['lead']}{quote}{MASK}{quote}"


def redact(text: str, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with every secret value and every secret-looking assignment's value masked."""
    if not text:
        return text
    pattern = _pattern(secret_values(environ))
    if pattern is not None:
        text = pattern.sub(MASK, text)
    return _ASSIGNMENT.sub(_mask_assignment, text)


def redact_data(data: Any, environ: Mapping[str, str] | None = None) -> Any:
    """A copy of a JSON-like structure with every string redacted, and the value of every
    secret-looking key masked outright (an env dict recorded with results keeps its names only)."""
    pattern = _pattern(secret_values(environ))

    def text(s: str) -> str:
        if pattern is not None:
            s = pattern.sub(MASK, s)
        return _ASSIGNMENT.sub(_mask_assignment, s)

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, Mapping):
            return {(text(k) if isinstance(k, str) else k):
                    (MASK if isinstance(k, str) and is_secret_name(k) and isinstance(v, str) and v else walk(v))
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v) for v in value]
        return value

    return walk(data)


def redact_file(path: str | os.PathLike[str]) -> bool:
    """Mask secrets in a text file (a JUnit XML) in place, atomically; True when anything changed."""
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        text = f.read()
    masked = redact(text)
    if masked == text:
        return False
    write_text(path, masked, errors="surrogateescape")
    return True
