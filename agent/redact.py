"""Drop anything that looks like a credential from command lines and environment entries.

The rule is "anything that looks like a credential is dropped", applied twice over: once when
the agent reads ``/proc/<pid>/cmdline`` (:func:`redact_argv`, which still knows where each
argument ends) and once more when any process record enters the store (:func:`redact_cmdline`,
idempotent, for imports and anything else that carries a command line). A false positive costs
one value in a report; a false negative puts a credential into a database that is copied around
a fleet, so where the two conflict the rules redact.

What is dropped (each replaced by ``<redacted>``):

* **Values named as secrets.** The value of a flag (``--token X``, ``--db-password=X``,
  ``--pw=X``), an assignment (``PGPASSWORD=X``, ``MYSQL_PWD=X``,
  ``-Djavax.net.ssl.keyStorePassword=X``, ``spark.hadoop.fs.s3a.secret.key=X``), a JSON or
  dict member (``{"api_key": "X"}``), an HTTP header (``Authorization: Bearer X``,
  ``Cookie: X``, ``X-Api-Key: X``) or a query parameter (``?token=X``) whose name says secret.
  A name says secret when one of its words (split at ``_ - .`` and camelCase) is password,
  passwd, passphrase, pass, pwd, pw, secret, token, auth, authorization, credential(s), creds,
  cookie, session, bearer, jwt, otp, dsn, signature, or ends in one of those (``PGPASSWORD``,
  ``hftoken``, keytool's ``-storepass``), or is one word that ends in pass, auth or key
  (``--requirepass``, ``--masterauth``, ``--licensekey``; not ``--bypass``, ``--lowpass``,
  ``--hotkey``); or when it ends in ``key`` (``MY_KEY``, ``--ssl-key``)
  or has an api / access / secret / private / account / client ... key in it. A ``key`` inside
  a name (``--num-key-value-heads``) or a column's key (``--sort-key``, ``--text-key``) is not a
  secret, a token after pad / eos / bos / ... is a vocabulary entry (``--pad-token``), and a
  name whose last word is a reference keeps its value, which is still checked by shape
  (``--password-file /run/secrets/db``, ``--token-budget 4096``, ``--auth-url``). Values that
  say "no secret" (``--auth none``, ``false``) stay.
* **Program conventions** where the flag gives no name: ``mysql -pX`` (and mysqldump, mysqladmin,
  mariadb, ``7z -pX``), ``sshpass -p X``, ``redis-cli -a X``, ``docker login -p X``, ``ldapsearch
  -w X`` (and the other OpenLDAP clients), ``mongosh -p X``, ``sqlcmd -P X``, ``ipmitool -P X``,
  ``unzip -P X``, ``useradd -p HASH``; positional passwords: ``wandb login X``, ``htpasswd -b FILE
  USER X`` (``-nb USER X``), ``smbclient //server/share X``; and ``user:pass`` after ``-u`` /
  ``--user`` / ``--proxy-user`` (``curl -u alice:X``; ``1000:1000`` uid:gid pairs stay), Samba's
  ``-U user%X``.
* **Key names inside code**: ``os.environ['WANDB_API_KEY'] = 'X'``, ``X_TOKEN = "X"``,
  ``os.environ.setdefault("MY_SECRET", "X")``, ``os.putenv('DB_PASSWORD', 'X')``.
* **URL credentials**: ``scheme://user:X@host`` keeps the user, drops the password.
* **Values by shape**, wherever they appear: known token formats (AWS access key ids ``AKIA…``,
  GitHub ``ghp_…``/``github_pat_…``, GitLab ``glpat-…``, Slack ``xox?-…``, OpenAI/Anthropic
  ``sk-…``, Hugging Face ``hf_…``, Google ``AIza…``, Stripe, npm, PyPI, JWTs ``eyJ….eyJ….…``,
  PEM private keys), and any run of 20 or more token characters whose character classes change
  as often as random text does (base62/base64 secrets), or pure hex longer than 40 characters
  that is not a ``sha256:`` digest or a path component.

What is kept: program names, flags, paths (``/data/imagenet``, ``~/.cache/huggingface``), model
names (``meta-llama/Llama-3.1-8B-Instruct``), numbers, sizes, learning rates, host names and
ports, UUIDs, and hex strings of up to 40 characters (git commits, MD5 sums); a 40-character hex
API key with no name and no known prefix is therefore indistinguishable from a commit and kept.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from functools import lru_cache

REDACTED = "<redacted>"

# -- names ---------------------------------------------------------------------------------------

#: Words that make a name a secret by themselves.
_STRONG_WORDS = frozenset(
    {
        "password", "passwd", "passphrase", "pass", "pwd", "pw", "secret", "secrets", "token",
        "keypass", "storepass", "srcstorepass", "deststorepass", "srckeypass", "destkeypass",
        "auth", "authorization", "authtoken", "credential", "credentials", "creds", "cookie",
        "session", "sessionid", "bearer", "jwt", "otp", "dsn", "signature", "sig", "apikey",
        "accesskey", "secretkey", "privatekey", "sas", "psk",
    }
)  # fmt: skip
#: Endings that make a one-word name a secret (``PGPASSWORD``, ``hftoken``, ``dbpass`` is not:
#: ``bypass`` and ``compass`` end in pass too).
_STRONG_ENDINGS = (
    "password", "passwd", "passphrase", "secret", "token", "apikey", "accesskey", "secretkey",
    "privatekey", "authkey", "credential", "credentials",
)  # fmt: skip
#: A ``key`` after one of these is a secret key (api key, access key, account key, ...).
_KEY_QUALIFIERS = frozenset(
    {
        "api", "access", "secret", "private", "account", "storage", "master", "license",
        "encryption", "signing", "subscription", "client", "service", "app", "ssh", "gpg",
        "consumer", "shared", "hmac", "session", "deploy", "auth", "sas", "primary", "secondary",
    }
)  # fmt: skip
#: A ``key`` after one of these names a column, a field or an index, not a secret.
_KEY_NOT_SECRET = frozenset(
    {
        "sort", "hash", "partition", "group", "join", "dict", "foreign", "cache", "lookup",
        "index", "row", "map", "shard", "order", "dedup", "unique", "label", "text", "image",
        "input", "output", "target", "value", "query", "metric", "monitor", "prompt", "caption",
        "audio", "video", "response", "answer", "question", "context", "message", "messages",
        "conversation", "conversations", "data", "feature", "batch", "kv",
    }
)  # fmt: skip
#: A name ending in one of these refers to the secret (a file, a size, a URL) rather than holding
#: it: ``--password-file``, ``--token-budget``, ``--auth-url``.
_REFERENCE_WORDS = frozenset(
    {
        "file", "files", "path", "paths", "dir", "directory", "env", "var", "name", "names",
        "len", "length", "size", "count", "num", "limit", "budget", "max", "min", "ttl",
        "timeout", "type", "mode", "format", "url", "uri", "endpoint", "host", "port", "kind",
        "scheme", "method", "provider", "backend", "enabled", "required", "policy", "level",
        "version", "algorithm", "strategy", "interval", "header", "id", "ids", "column",
        "field", "helper", "store", "location", "cmd", "command", "plugin", "server", "source",
    }
)  # fmt: skip
#: Environment variables that contain secret words but are never secrets.
_NOT_SECRET_NAMES = frozenset({"pwd", "oldpwd"})

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NAME_SPLIT = re.compile(r"[^A-Za-z0-9]+")


def _words(name: str) -> list[str]:
    """``keyStorePassword`` and ``KEY_STORE.password`` both give ``[key, store, password]``."""
    return [w.lower() for part in _NAME_SPLIT.split(name) for w in _CAMEL.split(part) if w]


#: A token after one of these is a model's vocabulary entry, not a credential (``--pad-token``).
_VOCABULARY_TOKENS = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "chat", "image", "stop", "end",
     "start", "new", "max", "min", "num", "per", "total", "decoder", "sentinel"}
)  # fmt: skip


#: Secret words that end a one-word option name (issue #27: ``--requirepass``, ``--masterauth``,
#: ``--adminpass``, ``--licensekey``), weaker than :data:`_STRONG_ENDINGS` because English and
#: signal processing have words that end in them too.
_ONE_WORD_ENDINGS = ("pass", "auth", "key")
#: One-word names that end in pass / auth / key and hold no secret.
_ONE_WORD_NOT_SECRET = frozenset(
    {
        "bypass", "compass", "surpass", "trespass", "overpass", "underpass", "encompass",
        "multipass", "onepass", "twopass", "singlepass", "firstpass", "secondpass", "lowpass",
        "highpass", "bandpass", "allpass", "hotkey", "monkey", "turkey", "donkey", "jockey",
        "hockey", "whiskey", "lackey", "turnkey", "nokey",
    }
)  # fmt: skip


def _one_word_secret(word: str) -> bool:
    """A name written as one word whose end is a secret word: ``requirepass``, ``masterauth``;
    a column's key written as one word (``sortkey``) is not."""
    for ending in _ONE_WORD_ENDINGS:
        prefix = word[: -len(ending)]
        if word.endswith(ending) and len(prefix) >= 2 and word not in _ONE_WORD_NOT_SECRET:
            return not (ending == "key" and prefix in _KEY_NOT_SECRET)
    return False


def _strong(before: str, word: str, last: bool) -> bool:
    if word == "token" and before in _VOCABULARY_TOKENS:
        return False
    if word == "pass" and not last:  # --pass-through, --pass-at-k
        return False
    if last and _one_word_secret(word):
        return True
    return word in _STRONG_WORDS or word.endswith(_STRONG_ENDINGS)


@lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """Whether a flag, variable, header or field named ``name`` holds a secret."""
    words = _words(name.lstrip("-"))
    if not words or name.strip("-").lower() in _NOT_SECRET_NAMES:
        return False
    if len(words) > 1 and words[-1] in _REFERENCE_WORDS:
        return False
    pairs = list(zip(["", *words], words, strict=False))
    if any(_strong(b, w, i == len(words) - 1) for i, (b, w) in enumerate(pairs)):
        return True
    # A key that ends the name (MY_KEY, --ssl-key) or is an api / access / ... key; a key inside
    # a name (--num-key-value-heads) or a column's key (--sort-key, --text-key) is not.
    return any(
        word == "key"
        and before not in _KEY_NOT_SECRET
        and (before in _KEY_QUALIFIERS or i == len(words) - 1)
        for i, (before, word) in enumerate(pairs)
    )


#: Values that say a secret is absent or switched off (``--auth none``).
_NO_SECRET = frozenset(
    {"", "none", "null", "true", "false", "yes", "no", "on", "off", "disabled", "enabled", "auto"}
)


def _value_is_secret(named_secret: bool, value: str) -> bool:
    return named_secret and value.lower() not in _NO_SECRET


# -- values by shape -----------------------------------------------------------------------------

_KNOWN_TOKENS = re.compile(
    r"(?:"
    r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA|A3T[A-Z0-9])[A-Z0-9]{16}\b"
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"
    r"|\bgithub_pat_[A-Za-z0-9_]{20,}"
    r"|\bglpat-[A-Za-z0-9_-]{20,}"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bxapp-[A-Za-z0-9-]{10,}"
    r"|\bsk-(?:ant-|proj-|live-|test-)?[A-Za-z0-9_-]{16,}"
    r"|\bhf_[A-Za-z0-9]{30,}"
    r"|\bAIza[0-9A-Za-z_-]{35}"
    r"|\b[sr]k_(?:live|test)_[0-9A-Za-z]{16,}"
    r"|\bnpm_[A-Za-z0-9]{36}"
    r"|\bpypi-[A-Za-z0-9_-]{50,}"
    r"|\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
    r"|-----BEGIN[A-Z ]*PRIVATE KEY-----[^-]*(?:-----END[A-Z ]*PRIVATE KEY-----)?"
    r")"
)
#: A run of characters a token is made of; ``.`` splits runs (model names, versions, hosts).
_RUN = re.compile(r"[A-Za-z0-9+/_~-]{20,}={0,2}")
_SEGMENTS = re.compile(r"[-_~]")
_HEX = re.compile(r"^[0-9a-f]+$|^[0-9A-F]+$")
_DIGEST_BEFORE = re.compile(r"(?:sha\d*|md5|blake\d*\w*)[:=-]$|/$", re.IGNORECASE)


def _char_class(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2 if c.isdigit() else 3


def _randomness(run: str) -> float:
    """Share of adjacent alphanumeric pairs whose class (lower, upper, digit) changes: about
    0.6 for random base62, 0.47 for random hex, 0.2-0.3 for CamelCase words and model names."""
    pairs = [(a, b) for a, b in itertools.pairwise(run) if a.isalnum() and b.isalnum()]
    if not pairs:
        return 0.0
    return sum(_char_class(a) != _char_class(b) for a, b in pairs) / len(pairs)


def _entropy_bits(run: str) -> float:
    counts = Counter(run)
    return -sum(n / len(run) * math.log2(n / len(run)) for n in counts.values())


def _random_piece(piece: str) -> bool:
    """A piece of a run (no ``/``) that reads as random text rather than words or numbers."""
    if len(piece) < 20 or piece.isdigit():
        return False
    segments = _SEGMENTS.split(piece)
    if max(len(s) for s in segments) < 12:
        return False  # words joined by - and _: a model name, a UUID, a run name
    alnum = [c for c in piece if c.isalnum()]
    if len(alnum) < 0.8 * len(piece):
        return False
    if _HEX.match(piece):
        return len(piece) > 40
    if _entropy_bits(piece) < 0.8 * math.log2(min(len(piece), 62)):
        return False
    classes = {_char_class(c) for c in alnum}
    if classes in ({0}, {1}):
        vowels = sum(c in "aeiouAEIOU" for c in alnum)
        return len(piece) >= 24 and vowels / len(alnum) < 0.12
    return _randomness(piece) >= 0.3


def looks_like_credential(run: str, before: str = "") -> bool:
    """Whether a token-character run (``[A-Za-z0-9+/_~-]``, 20+ long) is random enough to be a
    key. A run with ``/`` is judged whole only when it has no path or name structure (base64
    such as an AWS secret key), else component by component; hex components of a path are
    content addresses (``blobs/<sha256>``), not keys."""
    if _HEX.match(run) and _DIGEST_BEFORE.search(before):
        return len(run) > 64  # sha256:…, /blobs/… : digests and content addresses, not keys
    if "/" not in run:
        return _random_piece(run.rstrip("="))
    if not run.startswith(("/", "~")) and not _SEGMENTS.search(run) and _random_piece(run):
        return True
    return any(_random_piece(p) and not _digest(p) for p in run.split("/") if p)


def _digest(piece: str) -> bool:
    return bool(_HEX.match(piece)) and len(piece) <= 64


def _redact_shapes(text: str) -> str:
    text = _KNOWN_TOKENS.sub(REDACTED, text)
    return _RUN.sub(
        lambda m: REDACTED if looks_like_credential(m[0], text[: m.start()]) else m[0], text
    )


# -- names inside text ---------------------------------------------------------------------------

_URL_CREDENTIALS = re.compile(
    r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@"
)
#: The ``name =`` / ``name:`` / ``"name":`` before a value: assignments, query parameters,
#: connection strings, JSON and dict members, HTTP headers (the name may be quoted). A ``:``
#: followed by ``//`` is a URL's scheme.
#: The name may be a subscript in code: ``os.environ['WANDB_API_KEY'] = '…'`` (issue #27).
_NAME_LEAD = re.compile(
    r"""(?<![\w.\-])(?<!//)(?P<q>["']?)(?P<name>-{0,2}[A-Za-z_][\w.\-]*)(?P=q)\]?"""
    r"""\s*(?::(?!//)|=)\s*"""
)
#: A quoted name and a quoted value as a call's two arguments, in code:
#: ``os.environ.setdefault('X_TOKEN', '…')``, ``os.putenv("DB_PASSWORD", "…")``, ``setenv(…)``.
_CALL_PAIR = re.compile(
    r"""(?P<q>["'])(?P<name>[A-Za-z_][\w.\-]*)(?P=q)\s*,\s*"""
    r"""(?P<vq>["'])(?P<value>(?:(?!(?P=vq))[^\\]|\\.)*)(?P=vq)"""
)
#: A value: quoted, or an optional auth scheme and a run up to a delimiter. Inside a token
#: (``?a=1&token=X``, ``AccountName=a;AccountKey=X``) ``& ; ,`` end it; a name that starts a
#: token (``PGPASSWORD=X``, ``Authorization: Bearer X``) owns the token to its end.
_QUOTED = r"""(?P<quote>["'])(?P<quoted>(?:(?!(?P=quote))[^\\]|\\.)*)(?P=quote)"""
_AUTH_SCHEME = r"(?P<scheme>(?i:bearer|basic|token|digest|negotiate|aws4-hmac-sha256)\s+)?"
_VALUE = re.compile(rf"""{_QUOTED}|{_AUTH_SCHEME}(?P<bare>[^\s,;&#"'}}\])]+)""")
_TOKEN_VALUE = re.compile(rf"""{_QUOTED}|{_AUTH_SCHEME}(?P<bare>[^\s"']+)""")
_SCHEME = re.compile(r"^(?i:bearer|basic|token|digest|negotiate|aws4-hmac-sha256)\s+")


def _redact_named_values(text: str) -> str:
    """Each value whose name says secret becomes ``<redacted>`` (quotes and an auth scheme
    word kept); other names leave their values to be scanned for names of their own."""
    out: list[str] = []
    done = 0
    for lead in _NAME_LEAD.finditer(text):
        if lead.start() < done:
            continue
        kind = is_secret_name(lead["name"])
        starts_token = lead.start() == 0 or text[lead.start() - 1].isspace()
        pattern = _TOKEN_VALUE if starts_token else _VALUE
        value = pattern.match(text, lead.end()) if kind else None
        if value is None:
            continue
        quote, scheme = value["quote"] or "", value["scheme"] or ""
        inner = value["quoted"] if quote else value["bare"]
        if inner == REDACTED or not _value_is_secret(kind, inner):
            continue
        out += [text[done : value.start()], f"{quote}{scheme}{REDACTED}{quote}"]
        done = value.end()
    return "".join([*out, text[done:]])


def _call_pair(match: re.Match[str]) -> str:
    if not (is_secret_name(match["name"]) and _value_is_secret(True, match["value"])):
        return match[0]
    head = match[0][: match.start("vq") - match.start()]
    return f"{head}{match['vq']}{REDACTED}{match['vq']}"


def redact_text(text: str) -> str:
    """Redact credentials inside one string: URL passwords, named values (assignments, query
    parameters, JSON members, headers, subscripts and call arguments in code) and values shaped
    like keys. Idempotent."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    text = _CALL_PAIR.sub(_call_pair, text)
    text = _redact_named_values(text)
    return _redact_shapes(text)


# -- argument vectors ----------------------------------------------------------------------------

#: Programs whose ``-pVALUE`` (attached) is a password (``mysql -p`` alone prompts, and the
#: argument after it is the database; ``7z x -pSECRET``).
_ATTACHED_P = frozenset(
    {"mysql", "mysqldump", "mysqladmin", "mysqlimport", "mariadb", "7z", "7za", "7zr"}
)
_LDAP = ("ldapsearch", "ldapadd", "ldapmodify", "ldapdelete", "ldapmodrdn", "ldapwhoami",
         "ldapcompare", "ldapexop", "ldapurl")  # fmt: skip
_MONGO = ("mongo", "mongosh", "mongodump", "mongorestore", "mongoexport", "mongoimport",
          "mongostat", "mongotop", "mongofiles")  # fmt: skip
#: (program, subcommand or ``""`` for any) and the short flags whose next argument is a password.
_PASSWORD_FLAGS = {
    ("sshpass", ""): frozenset({"-p"}),
    ("redis-cli", ""): frozenset({"-a"}),
    ("docker", "login"): frozenset({"-p"}),
    ("podman", "login"): frozenset({"-p"}),
    ("nerdctl", "login"): frozenset({"-p"}),
    ("helm", "login"): frozenset({"-p"}),
    **{(ldap, ""): frozenset({"-w"}) for ldap in _LDAP},
    ("ldappasswd", ""): frozenset({"-w", "-s", "-a"}),  # bind, new and old password
    **{(mongo, ""): frozenset({"-p"}) for mongo in _MONGO},
    ("sqlcmd", ""): frozenset({"-P"}),
    ("bcp", ""): frozenset({"-P"}),
    ("ipmitool", ""): frozenset({"-P"}),
    ("unzip", ""): frozenset({"-P"}),
    ("zip", ""): frozenset({"-P"}),
    ("useradd", ""): frozenset({"-p"}),  # a crypt hash, crackable offline
    ("usermod", ""): frozenset({"-p"}),
}
#: ``program subcommand SECRET``: the first positional argument after the subcommand.
_POSITIONAL_SECRET = frozenset(
    {("wandb", "login"), ("huggingface-cli", "login"), ("ngrok", "authtoken")}
)
#: Samba's clients write a user and password as ``-U user%password`` (``--user=``).
_PERCENT_USER = frozenset({"smbclient", "rpcclient", "smbcacls", "smbget", "smbtree", "net"})
#: Short flags of these programs that take a value (so it is not a positional argument).
_VALUE_FLAGS = {"htpasswd": frozenset({"-C", "-r"})}


def _htpasswd_password(shorts: frozenset[str], positionals: tuple[str, ...]) -> bool:
    """``htpasswd -b FILE USER PASSWORD`` (``-nb USER PASSWORD`` without a file)."""
    return "b" in shorts and len(positionals) == (1 if "n" in shorts else 2)


def _smbclient_password(shorts: frozenset[str], positionals: tuple[str, ...]) -> bool:
    """``smbclient //server/share PASSWORD``: the argument right after the service."""
    return len(positionals) >= 1 and positionals[-1].startswith(("//", "\\\\"))


#: Programs that take a password as a positional argument, by what came before it: the short
#: option letters given and the positional arguments before it.
_POSITIONAL_PASSWORD = {"htpasswd": _htpasswd_password, "smbclient": _smbclient_password}
_PROGRAMS = (
    _ATTACHED_P
    | {p for p, _ in _PASSWORD_FLAGS}
    | {p for p, _ in _POSITIONAL_SECRET}
    | _PERCENT_USER
    | set(_POSITIONAL_PASSWORD)
)
_USER_FLAGS = frozenset({"-u", "--user", "-U", "--proxy-user"})
_HEADER_FLAGS = frozenset({"-H", "--header", "--headers", "--proxy-header"})
_FLAG = re.compile(r"^--?[A-Za-z][\w.-]*$")


def _user_pass(value: str, program: str = "") -> str:
    """``alice:secret`` keeps the user; ``1000:1000`` (uid:gid) stays; Samba's ``alice%secret``
    keeps the user."""
    if program in _PERCENT_USER and "%" in value:
        user, _, rest = value.partition("%")
        return f"{user}%{REDACTED}" if rest and rest != REDACTED else value
    user, colon, rest = value.partition(":")
    if not colon or not rest or (user.isdigit() and rest.isdigit()) or rest == REDACTED:
        return value
    return f"{user}:{REDACTED}"


def _header(value: str) -> str:
    """A header given as one argument: all of its value goes when its name says secret."""
    name, colon, rest = value.partition(":")
    if not colon or not is_secret_name(name.strip()) or not rest.strip():
        return redact_text(value)
    scheme = _SCHEME.match(rest.strip())
    return f"{name}: {scheme[0] if scheme else ''}{REDACTED}"


class _Context:
    """Where in a command line we are: the program, its subcommand, what the last flag wants."""

    __slots__ = ("args", "pending", "positional", "program", "shorts", "sub")

    def __init__(self) -> None:
        self.program = ""
        self.sub = ""
        self.pending: str | None = None  # secret, key, user or header: what the next arg is
        self.positional = False  # the next positional argument is a secret (wandb login KEY)
        self.shorts: set[str] = set()  # short option letters given to the program (-bc)
        self.args: list[str] = []  # its positional arguments so far

    def positional_password(self) -> bool:
        """Whether the next positional argument is a password by the program's convention."""
        rule = _POSITIONAL_PASSWORD.get(self.program)
        return rule is not None and rule(frozenset(self.shorts), tuple(self.args))

    def password_flags(self) -> frozenset[str]:
        return _PASSWORD_FLAGS.get((self.program, ""), frozenset()) | _PASSWORD_FLAGS.get(
            (self.program, self.sub), frozenset()
        )

    def see_positional(self, arg: str) -> None:
        name = arg.rsplit("/", 1)[-1]
        if not self.program or name in _PROGRAMS:
            self.program, self.sub = name, ""
            self.shorts, self.args = set(), []
            return
        self.args.append(arg)
        if not self.sub:
            self.sub = arg
            self.positional = (self.program, arg) in _POSITIONAL_SECRET

    def see_flag(self, arg: str) -> None:
        if len(arg) > 1 and arg[1] != "-":
            self.shorts.update(arg[1:])
        if arg in _VALUE_FLAGS.get(self.program, ()):
            self.pending = "value"
        elif arg in _USER_FLAGS:
            self.pending = "user"
        elif arg in _HEADER_FLAGS:
            self.pending = "header"
        elif arg in self.password_flags() or (_FLAG.match(arg) and is_secret_name(arg)):
            self.pending = "secret"


def _redact_value(kind: str, arg: str, program: str) -> str:
    if kind == "secret":
        return REDACTED if _value_is_secret(True, arg) else redact_text(arg)
    if kind == "user":
        return redact_text(_user_pass(arg, program))
    if kind == "value":
        return redact_text(arg)
    return _header(arg)


_ASSIGNED_NAME = re.compile(r"^-{0,2}[A-Za-z_][\w.\-]*$")


def _redact_one(arg: str, program: str) -> str:
    if any(c.isspace() for c in arg):  # a command inside an argument (bash -c "...")
        return " ".join(redact_argv(redact_text(arg).split()))
    if program in _ATTACHED_P and arg.startswith("-p") and len(arg) > 2 and arg[2] != "-":
        return f"-p{REDACTED}"
    flag, eq, value = arg.partition("=")
    if eq and flag in ("--user", "--proxy-user"):
        return f"{flag}={_user_pass(value, program)}"
    if eq and _ASSIGNED_NAME.match(flag) and _value_is_secret(is_secret_name(flag), value):
        return f"{flag}={REDACTED}"  # all of the argument after = is the value
    return redact_text(arg)


def redact_argv(argv: list[str]) -> list[str]:
    """Redact an argument vector, argument by argument, knowing which flag each value follows
    and which program (``mysql``, ``sshpass``, ``docker login``, ...) the flags belong to."""
    out: list[str] = []
    ctx = _Context()
    for arg in argv:
        pending, ctx.pending = ctx.pending, None
        if pending == "secret" and arg.startswith("--"):
            # The value of a secret flag, or the next flag after one that takes none
            # (``--use_auth_token --hub_token T``): click hands ``--token --x1`` the value
            # "--x1", so it is redacted (Hypothesis found "--token --0000" kept whole), and
            # read as a flag too, so that the value of a secret flag it names is redacted.
            out.append(REDACTED)
            ctx.see_flag(arg)
            continue
        if pending is not None and not arg.startswith("--"):
            out.append(_redact_value(pending, arg, ctx.program))
            if arg.rsplit("/", 1)[-1] in _PROGRAMS:  # a program can follow a flag (srun -n 8)
                ctx.see_positional(arg)
            continue
        if arg.startswith("-"):
            ctx.see_flag(arg)
        elif ctx.positional or (
            ctx.positional_password() and arg.rsplit("/", 1)[-1] not in _PROGRAMS
        ):
            ctx.positional = False
            ctx.args.append(arg)
            out.append(REDACTED)
            continue
        elif "=" not in arg:
            ctx.see_positional(arg)
        out.append(_redact_one(arg, ctx.program))
    return out


@lru_cache(maxsize=1024)
def redact_cmdline(cmdline: str) -> str:
    """Redact a command line already joined with spaces (an import's process name, a stored
    row). Idempotent, so it can run on every record that enters the store: applying it to a
    line :func:`redact_argv` produced changes nothing."""
    return " ".join(redact_argv(redact_text(cmdline).split(" ")))


def redact_environment_entry(name: str, value: str) -> str:
    """The value to store for an environment entry: dropped when the name says secret, else
    redacted like any text (a DSN in ``DATABASE_URL`` loses its password)."""
    if _value_is_secret(is_secret_name(name), value):
        return REDACTED
    return redact_text(value)
