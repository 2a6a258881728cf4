"""Where the operator's Kubernetes API is, decided each time it logs in, not at import.

Kopf and the ``kubernetes`` package read ``KUBECONFIG`` once, when imported. Reading it at
call time instead lets one process talk to a different API server on each run: a fresh
emulator per test, or the one the ``demo`` command starts.

Register the login for Kopf with ``kopf.on.login()(connection_from_environment)`` and build
the operator's own clients with :func:`api_client`, so that both talk to the same server.
"""

from __future__ import annotations

import os
from typing import Any

import kopf
import kubernetes.client
import kubernetes.config


def load_configuration() -> kubernetes.client.Configuration:
    """Client settings from ``$KUBECONFIG`` if set, else in-cluster, else ``~/.kube/config``."""
    config = kubernetes.client.Configuration()
    # An explicit KUBECONFIG wins over the in-cluster account, so that tests run inside a pod
    # still reach the cluster they were pointed at.
    path = os.environ.get("KUBECONFIG")
    if path:
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=config, persist_config=False
        )
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
    else:
        default = os.path.expanduser("~/.kube/config")
        kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=default, client_configuration=config, persist_config=False
        )
    return config


def api_client() -> kubernetes.client.ApiClient:
    """A client of the official library, configured as :func:`load_configuration` says."""
    return kubernetes.client.ApiClient(configuration=load_configuration())


def connection_from_environment(**_: Any) -> kopf.ConnectionInfo:
    """Kopf's credentials from the same settings as :func:`api_client`; a login handler."""
    config = load_configuration()
    # The client keeps the token under "BearerToken" since version 36, "authorization" before.
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
        "authorization"
    )
    scheme, _space, token = (header or "").rpartition(" ")  # "Bearer xyz" or "xyz"
    return kopf.ConnectionInfo(
        server=config.host,
        ca_path=config.ssl_ca_cert,
        insecure=not config.verify_ssl,
        username=config.username or None,
        password=config.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=config.cert_file,
        private_key_path=config.key_file,
    )
