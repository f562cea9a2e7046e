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


def probes(docs):
    return [container[probe] for doc in docs if doc["kind"] in ("StatefulSet", "Deployment")
            for container in doc["spec"]["template"]["spec"]["containers"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe")]


def main():
    failures = []
    if not any("grpc" in probe for probe in probes(render())):
        failures.append("without TLS, no probe asks grpc.health.v1")
    tls = probes(render("--shard-arg", "--tls-cert /tls/crt --tls-key /tls/key"))
    if not tls or any(probe.get("tcpSocket") != {"port": "grpc"} for probe in tls):
        failures.append(f"with --tls-cert, probes other than TCP: {tls}")
    kinds = [doc["kind"] for doc in render("--build-job")]
    if kinds != ["Job"]:
        failures.append(f"--build-job rendered {kinds}, not the Job alone")
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
