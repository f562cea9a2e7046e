#!/usr/bin/python3
"""Checks two choices of deploy/kubernetes/render.py (run by process_test.cc,
KubernetesManifests.TlsServersGetTcpProbesAndTheBuildJobRendersAlone): servers given --tls-cert
are probed over TCP (Kubernetes' gRPC probes speak plaintext only), and --build-job renders the
Job alone (it must finish before the shards start). Exits non-zero naming what differs."""
import subprocess
import sys

import yaml


def render(*flags):
    out = subprocess.run(["/usr/bin/python3", "deploy/kubernetes/render.py", "--shards", "2",
                          "--replicas", "2", *flags],
                         check=True, capture_output=True, text=True).stdout
    return list(yaml.safe_load_all(out))


def probes(docs, kind):
    return [container[probe] for doc in docs if doc["kind"] == kind
            for container in doc["spec"]["template"]["spec"]["containers"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe")]


def main():
    failures = []
    plain = render()
    if not all("grpc" in probe for probe in probes(plain, "StatefulSet")):
        failures.append("without TLS, a shard probe does not ask grpc.health.v1")
    for tls_flag in ("--tls-cert /tls/crt --tls-key /tls/key", "--tls-cert=/tls/crt"):
        shard_tls = render("--shard-arg=" + tls_flag)
        shard = probes(shard_tls, "StatefulSet")
        if not shard or any(probe.get("tcpSocket") != {"port": "grpc"} for probe in shard):
            failures.append(f"shards given {tls_flag}: probes other than TCP: {shard}")
        if probes(shard_tls, "Deployment") != probes(plain, "Deployment"):
            failures.append(f"shards given {tls_flag}: the router's probes changed")
    router_tls = render("--router-arg=--tls-cert=/tls/crt")
    if probes(router_tls, "StatefulSet") != probes(plain, "StatefulSet"):
        failures.append("the router given --tls-cert: the shards' probes changed")
    if "tcpSocket" not in probes(router_tls, "Deployment")[0]:
        failures.append("the router given --tls-cert: its startup probe is not TCP")
    kinds = [doc["kind"] for doc in render("--build-job")]
    if kinds != ["Job"]:
        failures.append(f"--build-job rendered {kinds}, not the Job alone")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
