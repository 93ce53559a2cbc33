"""Credentials in a config: URL user-info masked wherever a config is written or shown, and values
that look like tokens refused at the door.

- :func:`mask_url_credentials` turns ``http://user:password@host`` into ``http://***:***@host``;
  :func:`mask_config` applies it to every text of a config. ``ExperimentConfig.resolved()`` (what
  the record, ``config.yaml``, the trackers' params and the config's sha256 are made from) is
  masked, so a credential in ``tracking.uri`` lives only in memory, for the connection.
- :func:`token_problem` says why a config value looks like a credential (a known token prefix
  such as ``hf_``, ``ghp_``, ``sk-``, an AWS key id, or a long random string under a key named
  like ``*token*``, ``*key*``, ``*secret*``, ``*password*``). The YAML reader refuses such values
  unless tagged :data:`NOT_SECRET_TAG`; credentials belong in the environment (``HF_TOKEN``,
  ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``), which reprotune records redacted.
- :func:`redact_env`: the environment a record keeps. A variable whose name looks secret
  (:func:`is_secret_name`, the same test as a config key's), or whose value holds a token-shaped
  string whatever its name (``WANDB_NOTES=ghp_...``), is :data:`REDACTED`; every other value has URL
  credentials and secret-looking query parameters masked.

This module is the one place that knows what a secret looks like.
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

#: The YAML tag that marks a value as not secret: ``system_prompt: !not-secret "sk-..."``.
NOT_SECRET_TAG = "!not-secret"
MASK = "***"
#: What a record keeps of a secret environment variable's value.
REDACTED = "***REDACTED***"

#: Environment variables whose name starts with one of these (or equals one) are recorded.
ENV_PREFIXES: tuple[str, ...] = (
    "CUDA_",
    "CUBLAS_",
    "CUBLASLT_",
    "CUDNN_",
    "NCCL_",
    "NVIDIA_",
    "PYTHONHASHSEED",
    "PYTHONPATH",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOTO_",
    "TOKENIZERS_",
    "HF_",
    "HUGGINGFACE_",
    "TRANSFORMERS_",
    "ACCELERATE_",
    "SAFETENSORS_",
    "MLFLOW_",
    "WANDB_",
    "TORCH_",
    "PYTORCH_",
    "TORCHINDUCTOR_",
    "REPROTUNE_",
    "LD_PRELOAD",
)

# A URL's user-info: ``user@`` or ``user:password@``. A password may hold ``/`` or ``@`` (it then
# runs to the last ``@`` before white space); ``host:8443/x@v1`` is a port and a path, not a
# password. In what reprotune prints and records (not in a config's own values, which a rerun
# reads back), the scheme's slashes may also have been collapsed by path normalisation
# (``https:/u:p@h``).
_USERINFO = r"(?:[^:@/\s?#]+:(?!\d+(?:[/?#\s]|$))\S*|[^:@/\s?#]+)@"
URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)" + _USERINFO)
_URL_CREDENTIALS_LOOSE = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:/{1,3})" + _USERINFO)
# A query parameter named like a secret: ``?api_key=...``, ``&token=...``, ``;sig=...``.
SECRET_QUERY = re.compile(
    r"(?P<key>[?&;](?:[^=&#\s]*(?:token|key|secret|password|passwd|sig|signature|auth|credential)[^=&#\s]*)=)"
    r"[^&#\s]*",
    re.IGNORECASE,
)

# (what, pattern): tokens recognised by their shape wherever they appear in a value.
_TOKEN_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (what, re.compile(r"(?<![A-Za-z0-9_])" + pattern))
    for what, pattern in (
        ("a Hugging Face token (hf_...)", r"hf_[A-Za-z0-9]{30,}"),
        ("a GitHub token (ghp_...)", r"gh[pousr]_[A-Za-z0-9]{30,}"),
        ("a GitHub token (github_pat_...)", r"github_pat_[A-Za-z0-9_]{30,}"),
        ("an API secret key (sk-...)", r"sk-[A-Za-z0-9_-]{20,}"),
        ("an AWS access key id (AKIA...)", r"(?:AKIA|ASIA)[0-9A-Z]{16}(?![0-9A-Z])"),
        ("a Slack token (xox...)", r"xox[abposr]-[A-Za-z0-9-]{10,}"),
        ("a GitLab token (glpat-...)", r"glpat-[A-Za-z0-9_-]{20,}"),
    )
)
# A name (an environment variable's, a config key's) is secret when one of its words (split on
# _ . - and white space) ends with one of the suffixes or is one of the words. Word-wise, so
# TOKENIZERS_PARALLELISM stays visible while HF_TOKEN, HFTOKEN and WANDB_API_KEY do not.
# Over-redacting costs nothing; leaking costs a credential.
_SECRET_SUFFIXES = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "CREDENTIALS", "AUTH")
_SECRET_WORDS = (
    "PASS", "PWD", "AUTHORIZATION", "COOKIE", "SESSION", "SIGNATURE", "SIG", "PRIVATE", "CREDS", "PAT",
    "USERNAME", "APIKEY",
)  # fmt: skip
_RANDOM_MIN_LENGTH = 16
_RANDOM_MIN_BITS_PER_CHAR = 3.0


def mask_url_credentials(value: str, *, loose: bool = False) -> str:
    """``value`` with the user-info of every URL masked (``https://u:p@h`` -> ``https://***:***@h``)
    and, in a text holding a URL, every secret-named query parameter (``?token=abc`` ->
    ``?token=***``); a plain path such as ``data/train;key=3.jsonl`` is left alone. ``loose``
    also reads a URL whose slashes path normalisation collapsed (for what is printed or recorded
    outside a config)."""
    if "@" in value:
        value = (_URL_CREDENTIALS_LOOSE if loose else URL_CREDENTIALS).sub(_mask, value)
    if "=" in value and (":/" in value if loose else "://" in value):
        value = SECRET_QUERY.sub(lambda m: f"{m.group('key')}{MASK}", value)
    return value


def without_masked_credentials(url: str) -> str:
    """``url`` with user-info that :func:`mask_url_credentials` masked taken out
    (``https://***:***@h`` -> ``https://h``), so that a client connects with credentials from the
    environment instead of the mask."""
    return url.replace(f"://{MASK}:{MASK}@", "://").replace(f"://{MASK}@", "://")


def mask_tokens(value: str) -> str:
    """``value`` with every token-shaped string (``hf_...``, ``ghp_...``, ``sk-...``, an AWS key
    id, ...) replaced by ``***``, whatever its context."""
    for what, pattern in _TOKEN_SHAPES:

        def masked(match: re.Match[str], what: str = what) -> str:
            return MASK if _plausible(what, match.group(0)) else match.group(0)

        value = pattern.sub(masked, value)
    return value


def _plausible(what: str, token: str) -> bool:
    """``sk-`` is also how words start (``sk-sentiment-finetune-2024``, a folder name): an API key
    of that shape is random, with upper and lower case letters and digits."""
    if not what.startswith("an API secret key"):
        return True
    body = token[3:]
    return (
        any(c.isupper() for c in body) and any(c.islower() for c in body) and any(c.isdigit() for c in body)
    )


def mask_secrets(value: str) -> str:
    """Everything reprotune prints or writes outside a config: URL credentials, secret query
    parameters and token-shaped strings masked. (A config's own values are masked by
    :func:`mask_config`, which keeps token-shaped text a config marked ``!not-secret``.)"""
    return mask_tokens(mask_url_credentials(value, loose=True))


def mask_command(command: str) -> str:
    """A shell command as reprotune writes it down (a trace's header, a verification): what
    :func:`mask_secrets` masks, and the value of every secret-named variable set on it
    (``WANDB_API_KEY=...``, also inside a ``bash -c`` string) and of every option whose name ends
    in a secret word (``--hub_token X``, ``--api-key=X``; not ``--num_key_value_heads``), whose
    values have no shape of their own to be found by. A command that does not split as a shell
    splits it keeps only :func:`mask_secrets`'s masking."""
    try:
        words = shlex.split(command)
    except ValueError:
        return mask_secrets(command)
    masked, hide_next = [], False
    for word in words:
        name, equals, _ = word.partition("=")
        option = name.startswith("-")
        if hide_next and not option:
            word = MASK
        elif option and equals and _secret_option(name):
            word = f"{name}={MASK}"
        elif not option:
            word = _ASSIGNMENT.sub(lambda m: f"{m[1]}={MASK}" if is_secret_name(m[1]) else m[0], word)
        hide_next = option and not equals and _secret_option(name)
        masked.append(word)
    return mask_secrets(shlex.join(masked)) if masked != words else mask_secrets(command)


#: ``NAME=value`` in a word of a command: a variable set for it (or in a ``bash -c`` string).
_ASSIGNMENT = re.compile(r"(?<![\w.-])([A-Za-z_][A-Za-z0-9_]*)=(\S+)")


def _secret_option(option: str) -> bool:
    """Whether a command-line option takes a secret: the last word of its name says so
    (``--hub_token``, ``--api-key``), but not a tokenizer's special token (``--pad_token``) or a
    switch (``--use-auth-token``, whose next word is the script's own, not a value: a token
    given there is still masked by its shape)."""
    words = [w.upper() for w in re.split(r"[_\-]", option.lstrip("-")) if w]
    if not words or words[0] in _SWITCH_WORDS or (len(words) > 1 and words[-2] in _TOKENIZER_WORDS):
        return False
    return is_secret_name(words[-1])


#: First words of an option that turns something on or off: it takes no value.
_SWITCH_WORDS = frozenset({"USE", "NO", "ENABLE", "DISABLE", "WITH", "WITHOUT", "PUSH"})
#: Words before ``token`` in a tokenizer's special tokens (``--pad_token``, ``--eos-token``).
_TOKENIZER_WORDS = frozenset({"PAD", "BOS", "EOS", "UNK", "SEP", "CLS", "MASK", "SPECIAL"})


def token_shape(value: str) -> str | None:
    """What token ``value`` holds by its shape alone (``a GitHub token (ghp_...)``), or None."""
    for what, pattern in _TOKEN_SHAPES:
        if any(_plausible(what, m.group(0)) for m in pattern.finditer(value)):
            return what
    return None


def mask_data(value: Any) -> Any:
    """A copy of JSON-like data with :func:`mask_secrets` applied to every text (keys kept)."""
    return map_texts(value, mask_secrets)


def map_texts(value: Any, mask: Callable[[str], str]) -> Any:
    """A copy of JSON-like data (mappings, lists, scalars) with ``mask`` applied to every text."""
    if isinstance(value, str):
        return mask(value)
    if isinstance(value, Mapping):
        return {key: map_texts(item, mask) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_texts(item, mask) for item in value]
    return value


def _mask(match: re.Match[str]) -> str:
    scheme = match.group("scheme")
    has_password = ":" in match.group(0)[len(scheme) :]
    scheme = scheme.split(":", 1)[0] + "://"  # collapsed slashes restored: the mask is one form
    return f"{scheme}{MASK}:{MASK}@" if has_password else f"{scheme}{MASK}@"


def mask_config(value: Any) -> Any:
    """A copy of config data (dicts, lists, scalars) with every text's URL user-info and secret
    query parameters masked."""
    return map_texts(value, mask_url_credentials)


def is_secret_name(name: str) -> bool:
    """Whether a name says it holds a secret: an environment variable (``HF_TOKEN``) or a config
    key (``api_key``, ``hf-token``, ``password``)."""
    words = [w for w in re.split(r"[_.\-\s]", name.upper()) if w]
    return any(w in _SECRET_WORDS or w.endswith(_SECRET_SUFFIXES) for w in words)


def _looks_random(value: str) -> bool:
    if len(value) < _RANDOM_MIN_LENGTH or any(c.isspace() for c in value):
        return False
    counts = Counter(value)
    bits = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return bits >= _RANDOM_MIN_BITS_PER_CHAR


def token_problem(path: Sequence[str | int], value: str) -> str | None:
    """What credential ``value`` (at key ``path``) looks like, or None when it looks like none."""
    for what, pattern in _TOKEN_SHAPES:
        if pattern.search(value):
            return f"holds what looks like {what}"
    key = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
    if key and is_secret_name(key) and _looks_random(value):
        return f"is named like a secret ({key!r}) and holds a long random-looking string"
    return None


#: The fix said with every refused value.
TOKEN_FIX = (
    "do not put credentials in a config (it is recorded and mirrored to trackers): set them in the "
    "environment (HF_TOKEN, MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, ...), which "
    f"reprotune records redacted; if the value is not a secret, mark it: `key: {NOT_SECRET_TAG} VALUE`"
)


def redact_env(env: Mapping[str, str], prefixes: Iterable[str] = ENV_PREFIXES) -> dict[str, str]:
    """The relevant variables of ``env``, with secrets redacted.

    Args:
        env: e.g. ``os.environ``.
        prefixes: a variable is kept when its name starts with one of these.

    Returns:
        name -> value, sorted by name; a secret-looking name's value, or a value holding a
        token-shaped string, is :data:`REDACTED`, and every other value has URL credentials and
        secret query parameters masked.
    """
    wanted = tuple(prefixes)
    out = {}
    for name in sorted(env):
        if not name.startswith(wanted):
            continue
        secret = is_secret_name(name) or token_shape(env[name]) is not None
        out[name] = REDACTED if secret else mask_url_credentials(env[name])
    return out


_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.")
_URL_CREDENTIALS_AT_A_START = re.compile(r"(?<![A-Za-z0-9+.-])" + URL_CREDENTIALS.pattern)
#: A value given to a name: ``name = "value"``, ``NAME=value``, ``name: str = "value"``,
#: ``{"name": "value"}``, ``os.environ["NAME"] = "value"``, ``setdefault("NAME", "value")``. Each
#: name starts after a character no name holds, so a long line is read once, not once per start.
_ASSIGNED = re.compile(
    r"(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)"
    r"""(?:["']\]?)?"""
    r"(?:\s*:\s*[A-Za-z_][\w.\[\]]*(?=\s*=))?"
    r"\s*(?P<op>[:=,])\s*"
    r"""(?:(?P<q>["'])(?P<quoted>[^"'\s]+)(?P=q)|(?P<bare>[^"'\s#,;)]+))"""
)
_CREDENTIAL_CHARS = re.compile(r"[A-Za-z0-9+/=_-]+")  # no dot: a dotted name is code
_NAME_LIKE = re.compile(r"[a-z0-9]+(?:[_-][a-z0-9]+)+|[A-Z0-9]+(?:[_-][A-Z0-9]+)+")  # snake_case, kebab-case
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO_ID = re.compile(r"[\w-]+/[\w-]*[_-][\w-]*")  # a Hugging Face repo id: owner/name-with-parts


def credential_in(text: str) -> str | None:
    """What credential a line of code holds, or None: a token by its shape (``ghp_...``), a JSON
    web token, a private key, a URL with a password, or a long random-looking string of letters and
    digits given to a name that says it is a secret (``aws_secret_access_key = "..."``,
    ``os.environ["WANDB_API_KEY"] = "..."``, ``WANDB_API_KEY=... python train.py``). A value that
    is code (a dotted or snake_case name, a sha256 digest, a repo id) or a type is none."""
    what = token_shape(text)
    if what is not None:
        return what
    if _PRIVATE_KEY.search(text):
        return "a private key (-----BEGIN ... PRIVATE KEY-----)"
    if _JWT.search(text):
        return "a JSON web token (eyJ...)"
    for match in _URL_CREDENTIALS_AT_A_START.finditer(text) if "://" in text else ():
        if ":" in match.group(0)[len(match.group("scheme")) :]:
            return "a URL with a password (scheme://user:password@host)"
    for match in _ASSIGNED.finditer(text):
        value, name = match["quoted"] or match["bare"], match["name"].rsplit(".", 1)[-1]
        if match["bare"] and match["op"] != "=":
            continue  # `token: Qwen2TokenizerFast`: a type, not a value
        if _secret_value(name, value):
            return f"a secret assigned to {name}"
    return None


def _secret_value(name: str, value: str) -> bool:
    mixed = any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
    if not (mixed and _CREDENTIAL_CHARS.fullmatch(value)):
        return False
    if _SHA256.fullmatch(value) or _REPO_ID.fullmatch(value):
        return False
    if _NAME_LIKE.fullmatch(value) and not _UUID.fullmatch(value):
        return False
    words = [w for w in re.split(r"[_.\-\s]", name.upper()) if w and w != "USERNAME"]
    return token_problem(["_".join(words)], value) is not None
