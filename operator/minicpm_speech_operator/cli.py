"""`minicpm-speech`: run the operator, or show it working on an embedded cluster.

    minicpm-speech demo        reconcile examples/minicpmspeech.yaml and print the result
    minicpm-speech operator    the operator process the Helm chart runs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from .assets import asset_dir, crd_path
from .crd_schema import manifest_errors

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
                      help="MiniCPMSpeech manifest to apply (default: %(default)s)")
    demo.add_argument("--timeout", type=float, default=60.0,
                      help="seconds to wait for the reconcile (default: %(default)s)")
    demo.add_argument("-o", "--output", choices=["summary", "yaml"], default="summary",
                      help="print a summary, or every object in full")
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
    from .kubeconfig import load_configuration
    from .leader import LeaderElector, LeaseConfig
    from .metrics import serve as serve_metrics

    if args.leader_elect and not args.leader_election_namespace:
        raise SystemExit("--leader-elect needs --leader-election-namespace or POD_NAMESPACE")
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


def load_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        raise DemoError(f"cannot read {path}: {error}") from error
    if not isinstance(manifest, dict) or manifest.get("kind") != "MiniCPMSpeech":
        raise DemoError(f"{path} is not a MiniCPMSpeech manifest (kind: MiniCPMSpeech expected)")
    if not (manifest.get("metadata") or {}).get("name"):
        raise DemoError(f"{path}: metadata.name is required")
    manifest["metadata"].setdefault("namespace", "default")
    refused = manifest_errors(manifest)
    if refused:
        # The API server would refuse it too; say why before touching any cluster.
        raise DemoError(f"{path}: {refused[0]}")
    return manifest


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
    manifest = load_manifest(path)
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
            await asyncio.wait_for(ready.wait(), timeout)
            api = KubeApi(load_configuration())
            speech = await _apply(api, manifest)
            speech = await _wait_observed(api, namespace, name, speech, timeout)
            children = await _children(api, speech)
        finally:
            stop.set()
            await operator
    _print(speech, children, output)
    return 0 if (speech.get("status") or {}).get("phase") != "Degraded" else 1


async def _apply(api: Any, manifest: dict[str, Any]) -> dict[str, Any]:
    meta = manifest["metadata"]
    existing = await api.get_speech(meta["namespace"], meta["name"])
    if existing is None:
        created: dict[str, Any] = await api.create_speech(manifest)
        return created
    patched: dict[str, Any] = await api.patch_speech(
        meta["namespace"], meta["name"], {"spec": manifest.get("spec")})
    return patched


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


async def _children(api: Any, speech: dict[str, Any]) -> list[dict[str, Any]]:
    from .manifests import configmap_name, owner_of

    owner = owner_of(speech)
    wanted = [("ConfigMap", configmap_name(owner)), ("Deployment", owner.name),
              ("Service", owner.name)]
    found = [await api.get(kind, owner.namespace, name) for kind, name in wanted]
    return [child for child in found if child is not None]


def _print(speech: dict[str, Any], children: list[dict[str, Any]], output: str) -> None:
    from . import report

    if output == "yaml":
        for obj in [*children, speech]:
            print("---")
            print(report.as_yaml(obj), end="")
        return
    print("Objects created:\n" + report.children_table(children) + "\n")
    for child in children:
        if child["kind"] == "Deployment":
            print("Serving command:\n  " + report.server_command(child) + "\n")
        if child["kind"] == "ConfigMap":
            text = next(iter((child.get("data") or {}).values()), "")
            print(f"Deploy config ({child['metadata']['name']}):")
            print("".join(f"  {line}\n" for line in text.splitlines()))
    print("$ kubectl get minicpmspeech\n" + report.status_table(speech) + "\n")
    print("Conditions:\n" + report.conditions_table(speech))


if __name__ == "__main__":
    raise SystemExit(main())
