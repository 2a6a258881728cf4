"""`minicpm-speech`: run the operator, or show it working on an embedded cluster.

    minicpm-speech demo        reconcile examples/minicpmspeech.yaml and print the result
    minicpm-speech operator    the operator process the Helm chart runs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from minicpm_speech_contract.bounded import BoundedInputError, load_yaml_all

from .assets import asset_dir, crd_path
from .crd_schema import manifest_errors
from .errors import capped
from .manifests import GROUP

DEMO_MANIFEST = "minicpmspeech.yaml"


def main(argv: Sequence[str] | None = None) -> int:
    from .leader import LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S

    parser = argparse.ArgumentParser(prog="minicpm-speech", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="reconcile an example on an embedded API emulator "
                                            "(or on the cluster KUBECONFIG names) and print it")
    demo.add_argument("-f", "--filename", type=Path,
                      default=asset_dir("examples") / DEMO_MANIFEST,
                      help="a MiniCPMSpeech manifest to apply, with the Secrets and ConfigMaps "
                           "it refers to as further documents (---) of the same file "
                           "(default: %(default)s)")
    demo.add_argument("--timeout", type=float, default=60.0,
                      help="seconds to wait for the reconcile (default: %(default)s)")
    demo.add_argument("-o", "--output", choices=["summary", "yaml"], default="summary",
                      help="print a summary, or every object the operator created (perf Jobs "
                           "and their ConfigMaps included) and the resource, in full")
    run = commands.add_parser("operator", help="run the operator")
    scope = run.add_mutually_exclusive_group(required=True)
    scope.add_argument("--namespace", action="append", dest="namespaces",
                       help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace")
    run.add_argument("--leader-elect", action="store_true",
                     help="hold a coordination.k8s.io Lease before reconciling")
    run.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE"))
    run.add_argument("--leader-election-name", default="minicpm-speech-operator")
    run.add_argument("--lease-duration", type=float, default=LEASE_DURATION_S,
                     help="seconds a Lease is held without renewal (default: %(default)s)")
    run.add_argument("--lease-renew-deadline", type=float,
                     default=RENEW_DEADLINE_S,
                     help="seconds the leader keeps retrying a failed renewal before it stops "
                          "leading; below the lease duration (default: %(default)s)")
    run.add_argument("--lease-retry-period", type=float, default=RETRY_PERIOD_S,
                     help="seconds between tries on the Lease (default: %(default)s)")
    run.add_argument("--log-level", default="INFO",
                     choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                     help="log verbosity on stderr (default: %(default)s)")
    run.add_argument("--metrics-port", type=int, default=8080)
    run.add_argument("--health-port", type=int, default=8081)
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return asyncio.run(_demo(args.filename, args.timeout, args.output))
        return asyncio.run(_operator(args))
    except DemoError as error:
        print(f"minicpm-speech demo: {error}", file=sys.stderr)
        return 2


class DemoError(Exception):
    pass


async def _operator(args: argparse.Namespace) -> int:
    import kopf

    from . import handlers  # noqa: F401  (registers the handlers)
    from .health import Health, serve_health
    from .kubeconfig import ClusterUnreachable, check_api_server, load_configuration
    from .leader import LeaderElector, LeaseConfig
    from .metrics import serve as serve_metrics

    if args.leader_elect and not args.leader_election_namespace:
        raise SystemExit("--leader-elect needs --leader-election-namespace or POD_NAMESPACE")
    try:
        # Before anything starts: a missing or dead cluster is one line, not a retry loop.
        await asyncio.to_thread(check_api_server)
    except ClusterUnreachable as error:
        print(f"minicpm-speech operator: {error}", file=sys.stderr)
        return 1
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    serve_metrics(args.metrics_port)
    health = Health()
    health_server = await serve_health(args.health_port, health)
    elector = renewing = None
    try:
        if args.leader_elect:
            identity = os.environ.get("POD_NAME") or os.uname().nodename
            try:
                lease = LeaseConfig(args.leader_election_namespace, args.leader_election_name,
                                    identity, args.lease_duration, args.lease_renew_deadline,
                                    args.lease_retry_period)
            except ValueError as error:
                raise SystemExit(f"--lease-*: {error}") from error
            elector = LeaderElector(load_configuration(), lease)
            await elector.acquire()
            renewing = asyncio.create_task(elector.keep_renewing())
        health.operator = asyncio.create_task(kopf.operator(
            standalone=True, clusterwide=args.all_namespaces, namespaces=args.namespaces or ()))
        await health.operator
    finally:
        if renewing is not None:
            renewing.cancel()
        if elector is not None:
            await asyncio.to_thread(elector.release)
        await health_server.cleanup()
    return 0


# What `demo -f` applies, in this order: what a resource refers to, then the resource.
DEMO_KINDS = {"Secret": "v1", "ConfigMap": "v1", "MiniCPMSpeech": f"{GROUP}/v1alpha1"}
SPEECH = "MiniCPMSpeech"


def load_manifests(path: Path) -> list[dict[str, Any]]:
    """The documents of ``path`` in the order they are applied: Secrets and ConfigMaps as
    written, then the one MiniCPMSpeech. Input over the contract's limits, an unknown kind or
    a manifest the API server would refuse raises a one-line :class:`DemoError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DemoError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") \
            from None
    try:
        documents = [doc for doc in load_yaml_all(text, field=str(path)) if doc is not None]
    except BoundedInputError as error:
        raise DemoError(str(error)) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or type(error).__name__
        raise DemoError(f"{path} is not valid YAML: {problem}{where}") from None
    for index, doc in enumerate(documents, start=1):
        kind = doc.get("kind") if isinstance(doc, dict) else None
        if kind not in DEMO_KINDS:
            shown = repr(kind)[:60] if isinstance(kind, str) else "missing"
            raise DemoError(f"{path}: document {index} is of kind {shown}; the demo applies "
                            f"only {', '.join(DEMO_KINDS)}")
        if not isinstance(doc.get("metadata"), dict) or not doc["metadata"].get("name"):
            raise DemoError(f"{path}: document {index} ({kind}): metadata.name is required")
    speeches = [doc for doc in documents if doc["kind"] == SPEECH]
    if len(speeches) != 1:
        raise DemoError(f"{path} holds {len(speeches)} MiniCPMSpeech documents; the demo "
                        "applies exactly one (kind: MiniCPMSpeech expected)")
    speech = speeches[0]
    namespace = speech["metadata"].setdefault("namespace", "default")
    for index, doc in enumerate(documents, start=1):
        if doc["metadata"].setdefault("namespace", namespace) != namespace:
            raise DemoError(f"{path}: document {index} ({doc['kind']}) is in namespace "
                            f"{doc['metadata']['namespace']!r}, the MiniCPMSpeech in "
                            f"{namespace!r}; put them in one namespace")
    refused = manifest_errors(speech)
    if refused:
        # The API server would refuse it too; say why before touching any cluster.
        raise DemoError(f"{path}: {refused[0]}")
    return [*(doc for doc in documents if doc["kind"] != SPEECH), speech]


@contextlib.contextmanager
def _cluster(namespace: str) -> Iterator[str]:
    """The cluster KUBECONFIG names, or an emulator on loopback for the demo's lifetime."""
    if os.environ.get("KUBECONFIG"):
        yield f"the cluster in {os.environ['KUBECONFIG']}"
        return
    try:
        # Lazy, and not in the operator image: the emulator and kmock come with the `demo` extra.
        from minicpm_speech_emulator import BackgroundEmulator
    except ModuleNotFoundError as error:
        raise DemoError(
            f"the embedded API emulator is not installed (no module {error.name!r}); "
            "install it with: pip install 'minicpm-speech[demo]', "
            "or set KUBECONFIG to run against a cluster") from error

    with tempfile.TemporaryDirectory(prefix="minicpm-speech-demo-") as workdir, \
            BackgroundEmulator(crd_path(), (namespace,), Path(workdir) / "kubeconfig") as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig_path)
        try:
            yield f"an embedded Kubernetes API emulator at {cluster.url}"
        finally:
            del os.environ["KUBECONFIG"]


async def _demo(path: Path, timeout: float, output: str) -> int:
    documents = load_manifests(path)
    manifest = documents[-1]
    namespace, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
    with _cluster(namespace) as where:
        # Progress goes to stderr, so `-o yaml` output stays pure YAML.
        print(f"Operator against {where}; applying {path} ...", file=sys.stderr)
        import kopf

        from . import handlers  # noqa: F401  (registers the handlers)
        from .kubeapi import KubeApi
        from .kubeconfig import load_configuration

        stop, ready = asyncio.Event(), asyncio.Event()
        operator = asyncio.create_task(kopf.operator(
            standalone=True, namespaces=[namespace], stop_flag=stop, ready_flag=ready))
        try:
            try:
                await asyncio.wait_for(ready.wait(), timeout)
            except TimeoutError:
                raise DemoError(f"the operator did not start within {timeout:.0f}s") from None
            api = KubeApi(load_configuration())
            for document in documents[:-1]:
                await _apply(api, document)
            speech = await _apply(api, manifest)
            speech = await _wait_observed(api, namespace, name, speech, timeout)
            children = await _children(api, speech)
        finally:
            stop.set()
            await operator
    _print(speech, children, output)
    return 0 if (speech.get("status") or {}).get("phase") != "Degraded" else 1


async def _apply(api: Any, document: dict[str, Any]) -> dict[str, Any]:
    """Create ``document``, or merge-patch it over the one there; a refusal is a DemoError."""
    from kubernetes.client.exceptions import ApiException

    from .errors import InvalidSpec

    meta, kind = document["metadata"], document["kind"]
    try:
        if kind == SPEECH:
            existing = await api.get_speech(meta["namespace"], meta["name"])
            if existing is None:
                created: dict[str, Any] = await api.create_speech(document)
                return created
            patched: dict[str, Any] = await api.patch_speech(
                meta["namespace"], meta["name"], {"spec": document.get("spec")})
            return patched
        if await api.get(kind, meta["namespace"], meta["name"]) is None:
            return await api.create(document)  # type: ignore[no-any-return]
        body = {key: value for key, value in document.items() if key not in ("apiVersion", "kind")}
        return await api.patch(kind, meta["namespace"], meta["name"], body)  # type: ignore[no-any-return]
    except ApiException as error:
        raise DemoError(_refusal(kind, meta["name"], error)) from None
    except InvalidSpec as error:  # the client's own wording of a 413 or 422
        raise DemoError(capped(" ".join(str(error).split()), 300)) from None


def _refusal(kind: str, name: str, error: Any) -> str:
    try:
        reason = str(json.loads(error.body or "{}").get("message") or error.reason)
    except (ValueError, AttributeError):
        reason = str(error.reason)
    return capped(" ".join(f"the API server refused {kind} {name} ({error.status}): "
                           f"{reason}".split()), 300)


async def _wait_observed(api: Any, namespace: str, name: str, speech: dict[str, Any],
                         timeout: float) -> dict[str, Any]:
    generation = speech["metadata"].get("generation", 0)
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        current = await api.get_speech(namespace, name)
        status = (current or {}).get("status") or {}
        if current and status.get("observedGeneration", -1) >= generation:
            return current  # type: ignore[no-any-return]
        await asyncio.sleep(0.2)
    raise DemoError(f"no reconcile of {namespace}/{name} within {timeout:.0f}s")


_CHILD_KINDS = {"ConfigMap": "v1", "Deployment": "apps/v1", "Service": "v1",
                "Job": "batch/v1"}


async def _children(api: Any, speech: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object the operator created for ``speech``, found by owner reference: its
    ConfigMap, Deployment and Service, then each perf Job followed by the ConfigMap it owns,
    then anything else it owns (the last good config)."""
    from .manifests import configmap_name, owner_of

    owner = owner_of(speech)
    listed: list[dict[str, Any]] = []
    for kind, api_version in _CHILD_KINDS.items():
        for item in await api.list(kind, owner.namespace, ""):
            # A list's items carry no kind of their own.
            listed.append({"apiVersion": api_version, "kind": kind, **item})

    def owned_by(uid: str) -> list[dict[str, Any]]:
        return sorted((obj for obj in listed
                       if any(ref.get("uid") == uid
                              for ref in obj["metadata"].get("ownerReferences") or [])),
                      key=lambda obj: (obj["kind"], obj["metadata"]["name"]))

    mine = owned_by(owner.uid)
    first = [(kind, name) for kind, name in (("ConfigMap", configmap_name(owner)),
                                             ("Deployment", owner.name), ("Service", owner.name))]
    ordered = [obj for key in first for obj in mine
               if (obj["kind"], obj["metadata"]["name"]) == key]
    for job in (obj for obj in mine if obj["kind"] == "Job"):
        ordered += [job, *owned_by(job["metadata"]["uid"])]
    ordered += [obj for obj in mine if obj not in ordered]
    return ordered


def _print(speech: dict[str, Any], children: list[dict[str, Any]], output: str) -> None:
    from . import report
    from .manifests import configmap_name, owner_of

    if output == "yaml":
        for obj in [*children, speech]:
            print("---")
            print(report.as_yaml(obj), end="")
        return
    deploy_config = configmap_name(owner_of(speech))
    print("Objects created:\n" + report.children_table(children) + "\n")
    for child in children:
        if child["kind"] == "Deployment":
            print("Serving command:\n  " + report.server_command(child) + "\n")
        if child["kind"] == "ConfigMap" and child["metadata"]["name"] == deploy_config:
            text = next(iter((child.get("data") or {}).values()), "")
            print(f"Deploy config ({child['metadata']['name']}):")
            print("".join(f"  {line}\n" for line in text.splitlines()))
    print("$ kubectl get minicpmspeech\n" + report.status_table(speech) + "\n")
    print("Conditions:\n" + report.conditions_table(speech))


if __name__ == "__main__":
    raise SystemExit(main())
