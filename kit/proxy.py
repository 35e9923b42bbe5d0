"""The auth proxy in front of TorchServe when the kit runs in a container (kit/supervise.py).

    proxy = AuthProxy(key_file=Path("/run/secrets/kit/api-key"))
    text = proxy.render(config, run_dir)     # nginx.conf; nginx -c it, in the foreground

Why a proxy: TorchServe 0.12's token authorization draws its keys at random at every start,
writes them into its working directory, and lets the inference key expire after
`token_expiration_min` (60 min by default). A Deployment needs a key its clients already hold,
that lives as long as a Secret and is the same in every replica: TorchServe stays on loopback
(token auth off there) and nginx publishes the inference API with a bearer key read from a
file (a mounted Secret), and the metrics without one (the NetworkPolicy limits who may scrape
it): the router's /metrics, the kit's series and TorchServe's in one scrape (kit/openai_router.py),
or TorchServe's alone in a config without the router. The management API is never published.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

from handlers.openai_shapes import error_body as openai_error_body
from handlers.payload import error_body
from kit.ports import INFERENCE_PORT, METRICS_PORT
from kit.serve_config import ConfigError, ServeConfig

# A bearer token as RFC 6750 spells it, and long enough to be a secret: it is written into
# nginx.conf, so nothing that could end the quoted string may be in it.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/=-]{16,512}")
CONF_FILE = "nginx.conf"
# nginx's status for an answer TorchServe could not give (starting, stopping, overloaded).
UNAVAILABLE = json.dumps(error_body("the model server is not available; retry", 503))
UNAUTHORIZED = json.dumps(error_body("send the API key as the header Authorization: Bearer <key>", 401))
# The same at the OpenAI base URL, in OpenAI's shape: its clients send the key as their api_key.
OPENAI_UNAUTHORIZED = json.dumps(
    openai_error_body("send the API key as api_key (the header Authorization: Bearer <key>)", 401)
)
NOT_SERVED = json.dumps(error_body("only /metrics is served here", 404))


def read_key(path: Path) -> str:
    """The API key in `path` (a mounted Secret), checked; the error says how to fix it."""
    if not path.is_file():
        raise ConfigError(
            f"API key file {path} does not exist: mount a Secret there (deploy/k8s generates one from deploy/k8s/api-key), "
            "or point --key-file at a file holding the key"
        )
    key = path.read_text().strip()
    if not KEY_PATTERN.fullmatch(key):
        raise ConfigError(
            f"API key in {path} must be 16-512 characters of A-Z a-z 0-9 . _ ~ + / = -, got {len(key)} characters"
            " (make one with: openssl rand -base64 33)"
        )
    return key


@dataclasses.dataclass(frozen=True)
class AuthProxy:
    key_file: Path
    inference_port: int = INFERENCE_PORT  # published: the bearer key is required but for /ping
    metrics_port: int = METRICS_PORT  # published: Prometheus text, no key
    workers: int = 1  # nginx worker processes: one event loop carries thousands of requests/s

    def __post_init__(self) -> None:
        if self.inference_port == self.metrics_port:
            raise ConfigError(f"proxy ports must differ, got {self.inference_port} twice")

    def check(self, config: ServeConfig) -> None:
        published = {self.inference_port, self.metrics_port}
        served = {config.inference_port, config.management_port, config.metrics_port, config.openai_port}
        if published & served:
            raise ConfigError(
                f"the proxy publishes ports {sorted(published)}, TorchServe serves {sorted(served)}: "
                "give TorchServe other ports in the preset (config/presets/container.yaml uses 8180-8182)"
            )
        if config.bind != "127.0.0.1" or config.management_bind != "127.0.0.1":
            raise ConfigError(
                f"behind the proxy TorchServe binds 127.0.0.1 only, got bind {config.bind!r} and "
                f"management_bind {config.management_bind!r}"
            )

    def render(self, config: ServeConfig, run_dir: Path) -> str:
        self.check(config)
        key = read_key(self.key_file)
        temp = run_dir / "nginx"
        return f"""# Rendered by kit/proxy.py at every start; the API key is inside: mode 0600.
worker_processes {self.workers};
daemon off;
pid {temp}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    server_tokens off;
    default_type application/json;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    # TorchServe refuses bigger bodies itself (413); nginx refuses them before buffering.
    client_max_body_size {config.max_request_mb}m;
    client_body_buffer_size 1m;
    # TorchServe's frontend decodes a form body itself and answers 500 when it is not one (a
    # JPEG, or curl's default for --data): the handlers read raw bodies, so forms go on as bytes.
    map $content_type $kit_content_type {{
        ~*^application/x-www-form-urlencoded application/octet-stream;
        default $content_type;
    }}
    upstream torchserve {{ server 127.0.0.1:{config.inference_port}; keepalive 64; }}
    upstream torchserve_metrics {{ server 127.0.0.1:{config.metrics_port}; }}{self.openai_upstream(config)}
    server {{
        listen {self.inference_port};
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_read_timeout 130s;  # TorchServe answers or times out a request at 120 s
        error_page 502 503 504 = @unavailable;
        location = /ping {{ proxy_pass http://torchserve; }}
        location / {{
            if ($http_authorization != "Bearer {key}") {{
                add_header WWW-Authenticate Bearer always;
                return 401 '{UNAUTHORIZED}';
            }}
            proxy_set_header Content-Type $kit_content_type;
            proxy_pass http://torchserve;
        }}
{self.openai_location(config, key)}
        location @unavailable {{ return 503 '{UNAVAILABLE}'; }}
    }}
    server {{
        listen {self.metrics_port};
        location = /metrics {{ proxy_pass http://{"openai_router" if config.openai_port else "torchserve_metrics"}; }}
        location / {{ return 404 '{NOT_SERVED}'; }}
    }}
}}
"""

    @staticmethod
    def openai_upstream(config: ServeConfig) -> str:
        if not config.openai_port:
            return ""
        return f"\n    upstream openai_router {{ server 127.0.0.1:{config.openai_port}; keepalive 64; }}"

    @staticmethod
    def openai_location(config: ServeConfig, key: str) -> str:
        """/v1/ on the published inference port: the one OpenAI base URL (kit/openai_router.py)."""
        if not config.openai_port:
            return ""
        return f"""        location /v1/ {{
            if ($http_authorization != "Bearer {key}") {{
                add_header WWW-Authenticate Bearer always;
                return 401 '{OPENAI_UNAUTHORIZED}';
            }}
            proxy_buffering off;  # server-sent events pass on as they come
            proxy_pass http://openai_router;
        }}"""

    def start(self, config: ServeConfig, run_dir: Path) -> subprocess.Popen:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        temp = run_dir / "nginx"
        temp.mkdir(parents=True, exist_ok=True)
        conf = run_dir / CONF_FILE
        conf.touch(mode=0o600)
        conf.chmod(0o600)
        conf.write_text(self.render(config, run_dir))
        # -e: nginx opens its compiled-in error log before reading the config, which a
        # non-root user may not write.
        return subprocess.Popen([nginx, "-e", "stderr", "-p", str(temp), "-c", str(conf)], stdin=subprocess.DEVNULL)
