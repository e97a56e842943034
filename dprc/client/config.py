"""Where the client finds its server and key.

The server URL: ``--server``, else ``DPRC_SERVER_URL``, else the config file. The key:
``DPRC_API_KEY``, else the config file; never a command-line flag (it would land in the shell
history and in ``ps``). The config file is ``$DPRC_CLIENT_CONFIG``, else
``$XDG_CONFIG_HOME/dprc/client.toml`` (``~/.config/dprc/client.toml``)::

    server_url = "http://127.0.0.1:8000"
    api_key = "dprc-…"

``dprc login`` writes it with mode 0600; a config file holding a key that others can read is
refused (as ssh refuses such a private key).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path

SERVER_ENV = "DPRC_SERVER_URL"
KEY_ENV = "DPRC_API_KEY"
CONFIG_ENV = "DPRC_CLIENT_CONFIG"


class ConfigError(ValueError):
    """No server or key, or an unusable config file (one line for the user)."""


@dataclass(frozen=True)
class ClientConfig:
    server_url: str
    api_key: str


def config_path() -> Path:
    given = os.environ.get(CONFIG_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dprc" / "client.toml"


def _read_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the client config {path}: {exc}") from exc
    unknown = set(data) - {"server_url", "api_key"}
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown)} (server_url, api_key)")
    if not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"{path}: server_url and api_key must be strings")
    if "api_key" in data:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"{path} holds an API key and is readable by others (mode {mode:o}); "
                f"run: chmod 600 {path}"
            )
    return data


def normalize_url(url: str) -> str:
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"the server URL must start with http:// or https://, got {url!r}")
    return url


def load_config(server: str | None = None) -> ClientConfig:
    """The server URL and key (see the module's docstring for the order)."""
    path = config_path()
    stored = _read_file(path)
    url = server or os.environ.get(SERVER_ENV) or stored.get("server_url")
    key = os.environ.get(KEY_ENV) or stored.get("api_key")
    if not url:
        raise ConfigError(
            f"no server: give --server URL, set {SERVER_ENV}, or run `dprc login --server URL`"
        )
    if not key:
        raise ConfigError(
            f"no API key: set {KEY_ENV} or run `dprc login` (writes {path}, mode 0600)"
        )
    return ClientConfig(normalize_url(url), key.strip())


def save_config(server_url: str, api_key: str, path: Path | None = None) -> Path:
    """Write the config file, 0600 in a 0700 folder, atomically."""
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    body = f"server_url = {json.dumps(normalize_url(server_url))}\n"
    body += f"api_key = {json.dumps(api_key.strip())}\n"
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
