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


# How long `minicpm-speech operator` waits for the API server before it says it cannot reach
# it: (connect, read) seconds, no retries, so a dead address fails in well under 10 s.
PROBE_TIMEOUT_S = (3.0, 5.0)


class ClusterUnreachable(Exception):
    """The operator cannot talk to its API server; ``str()`` is one line: the problem, then
    the fix."""


def _settings_source() -> str:
    path = os.environ.get("KUBECONFIG")
    if path:
        return f"KUBECONFIG={path}"
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "the pod's in-cluster service account"
    return "~/.kube/config (KUBECONFIG is not set)"


def _one_line(error: BaseException, limit: int = 200) -> str:
    reason = getattr(error, "reason", None)  # urllib3 keeps the cause of a failed retry here
    text = " ".join(str(reason if isinstance(reason, BaseException) else error).split())
    text = text.rstrip(".") or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_api_server(timeout: tuple[float, float] = PROBE_TIMEOUT_S) -> str:
    """Load the client settings and ask the API server for its version, once, with
    ``timeout``; returns the server's address or raises :class:`ClusterUnreachable`.
    Any HTTP answer (even 401 or 404) counts: the server is there."""
    from kubernetes.client.exceptions import ApiException

    source = _settings_source()
    path = os.environ.get("KUBECONFIG")
    if path and not os.path.isfile(path):
        raise ClusterUnreachable(
            f"KUBECONFIG={path} names no file. Fix: point KUBECONFIG at the kubeconfig file of "
            "the cluster (kubectl config view --raw > FILE writes one)")
    try:
        config = load_configuration()
    except Exception as error:  # FileNotFoundError, ConfigException, a malformed file
        raise ClusterUnreachable(
            f"cannot load the Kubernetes client settings from {source}: {_one_line(error)}. "
            "Fix: set KUBECONFIG to a readable kubeconfig file of the cluster, or run the "
            "operator in a pod (in-cluster service account)") from None
    config.retries = 0
    client = kubernetes.client.ApiClient(configuration=config)
    try:
        kubernetes.client.VersionApi(client).get_code(_request_timeout=timeout)
    except ApiException:
        pass  # it answered
    except Exception as error:
        raise ClusterUnreachable(
            f"the Kubernetes API server at {config.host} (from {source}) does not answer: "
            f"{_one_line(error)}. Fix: check that the cluster is up and reachable from here, "
            "and that KUBECONFIG names its current address and context") from None
    finally:
        client.close()  # type: ignore[no-untyped-call]
    return str(config.host)
