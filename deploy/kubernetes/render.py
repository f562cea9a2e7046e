#!/usr/bin/python3
"""Renders the Kubernetes manifests of a knnserve retrieval cluster: S shards x R replicas and a
router in front of them, serving one index directory from a volume.

    deploy/kubernetes/render.py --index-manifest ds/index/manifest.json --replicas 2 \\
        --image registry.example/knnserve-server:1 --namespace knn > knnserve.yaml
    kubectl apply -f knnserve.yaml

What it writes (one multi-document YAML; docs/deploy.md explains each choice):
  * ConfigMap <name>-shard-map: the router's shard map, every replica by its stable DNS name;
  * Service <name>-shard: headless, gives each shard pod that name;
  * StatefulSet <name>-shard-<S> for each shard s: its R replicas, pod <name>-shard-3-1 is
    replica 1 of shard 3; a PodDisruptionBudget per shard (one replica evicted at a time);
  * Deployment <name>-router and Service <name>-router (the address decoders call), with a
    PodDisruptionBudget (one router evicted at a time);
  * with --build-job, instead of all the above: a Job that runs `knnserve datastore build` into
    the volume, to apply alone and let finish before the shards start.
The index directory is read from a PersistentVolumeClaim (--index-claim, mounted read-only at
/data, the index at /data/<--index-path>), which the cluster must provide with the index in it.
"""
import argparse
import hashlib
import json
import re
import shlex
import sys

import yaml

GRPC_PORT = 7000
ROUTER_PORT = 6000
METRICS_PORT = 9090
DATA_MOUNT = "/data"
PRE_STOP_SECONDS = 5


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    shards = p.add_mutually_exclusive_group(required=True)
    shards.add_argument("--shards", type=int, help="shards of the index")
    shards.add_argument("--index-manifest",
                        help="the index's manifest.json: the shards are counted there")
    p.add_argument("--replicas", type=int, default=1, help="replicas of every shard (default 1)")
    p.add_argument("--routers", type=int, default=2, help="router pods (default 2)")
    p.add_argument("--name", default="knnserve", help="prefix of every object (default knnserve)")
    p.add_argument("--namespace", default="default",
                   help="namespace the objects go to; part of the shards' DNS names")
    p.add_argument("--cluster-domain", default="cluster.local",
                   help="the cluster's DNS domain (default cluster.local)")
    p.add_argument("--image", default="knnserve-server:latest",
                   help="image with knnserve-shard and knnserve-router (deploy/docker)")
    p.add_argument("--cli-image", default="knnserve-cli:latest",
                   help="image with the knnserve CLI, for --build-job (deploy/docker)")
    p.add_argument("--index-claim", default="knnserve-data",
                   help="PersistentVolumeClaim holding the datastore (ReadOnlyMany for serving)")
    p.add_argument("--index-path", default="datastore/index",
                   help="the index directory inside the claim (default datastore/index)")
    p.add_argument("--gpu", action="store_true",
                   help="shards request one nvidia.com/gpu and run subset searches on it "
                        "(an image built with -DKNNSERVE_WITH_CUDA=ON)")
    p.add_argument("--shard-cpu", default="2", help="CPU request of a shard pod (default 2)")
    p.add_argument("--shard-memory", default="4Gi",
                   help="memory request and limit of a shard pod: its slice of the index, its "
                        "values and subset codes (knnserve index info), plus ~200 MiB")
    p.add_argument("--shard-threads", type=int, default=0,
                   help="knnserve-shard --threads (default: the CPU request, rounded up)")
    p.add_argument("--drain-seconds", type=int, default=30,
                   help="how long calls in flight may take after SIGTERM (default 30)")
    p.add_argument("--shard-arg", action="append", default=[],
                   help="more knnserve-shard flags, split as a shell would (\"--batch-threads 2\")")
    p.add_argument("--router-arg", action="append", default=[],
                   help="more knnserve-router flags, split as a shell would (\"--timeout-ms 500\")")
    p.add_argument("--tcp-probes", action="store_true",
                   help="probe the servers' ports over TCP instead of grpc.health.v1, which "
                        "Kubernetes speaks in plaintext only (the default for the shards when "
                        "--shard-arg passes --tls-cert, for the router when --router-arg does)")
    p.add_argument("--build-job", action="store_true",
                   help="render only a Job that builds the datastore and its index into the "
                        "claim (which must then be writable: ReadWriteOnce or ReadWriteMany); "
                        "apply it alone and let it finish before the serving manifests")
    p.add_argument("--build-cpu", type=int, default=4,
                   help="--build-job: CPU request of the build, and its --threads (default 4)")
    p.add_argument("--corpus", default="corpus/datastore.tsv",
                   help="--build-job: the parallel corpus (TSV) inside the claim")
    p.add_argument("--model", default="model/model.pt",
                   help="--build-job: the NMT model inside the claim")
    p.add_argument("--factory", default="IVF1024,PQ32np",
                   help="--build-job: faiss index_factory string")
    args = p.parse_args(argv)
    if args.index_manifest:
        try:
            with open(args.index_manifest) as f:
                args.shards = len(json.load(f)["shards"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            p.error(f"--index-manifest {args.index_manifest}: not an index manifest "
                    f"(knnserve index build writes DIR/manifest.json): {error!r}")
    for flag in ("shards", "replicas", "routers"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    if args.drain_seconds < 0:
        p.error(f"--drain-seconds must be >= 0, got {args.drain_seconds}")
    if args.shard_threads < 0:
        p.error(f"--shard-threads must be >= 0, got {args.shard_threads}")
    if args.build_cpu < 1:
        p.error(f"--build-cpu must be at least 1, got {args.build_cpu}")
    # Each side probed over TCP when it serves TLS (or everything with --tcp-probes): a shard
    # keeps its health probes when only the router serves TLS.
    args.shard_tcp_probes = args.tcp_probes or passes_tls(args.shard_arg)
    args.router_tcp_probes = args.tcp_probes or passes_tls(args.router_arg)
    if args.shard_threads == 0:
        args.shard_threads = max(1, -(-cpu_millis(args.shard_cpu, p) // 1000))
    for flag in ("name", "namespace"):
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", getattr(args, flag)):
            p.error(f"--{flag} must be a DNS label (lower-case letters, digits, '-'), got "
                    f"{getattr(args, flag)!r}")
    longest_pod = f"{args.name}-shard-{args.shards - 1}-{args.replicas - 1}"
    if len(longest_pod) > 63:
        p.error(f"pod names such as {longest_pod} exceed the 63 characters of a DNS label: "
                "use a shorter --name")
    if args.index_path.startswith("/") or ".." in args.index_path.split("/"):
        p.error(f"--index-path is relative to the claim, got {args.index_path}")
    if args.build_job and not args.index_path.endswith("/index"):
        p.error("--build-job writes DATASTORE/index (knnserve datastore build): --index-path "
                f"must end in /index, got {args.index_path}")
    return args


def passes_tls(flag_args):
    """Whether these flags (each split as a shell would) give a server --tls-cert."""
    return any(word == "--tls-cert" or word.startswith("--tls-cert=")
               for arg in flag_args for word in shlex.split(arg))


def cpu_millis(quantity, parser):
    """A Kubernetes CPU quantity ("2", "1.5", "500m") in millicores."""
    try:
        if quantity.endswith("m"):
            return int(quantity[:-1])
        return int(float(quantity) * 1000)
    except ValueError:
        parser.error(f"--shard-cpu is not a CPU quantity: {quantity}")


def labels(args, component, **extra):
    return {"app.kubernetes.io/name": "knnserve", "app.kubernetes.io/instance": args.name,
            "app.kubernetes.io/component": component, **extra}


def meta(args, name, component, **extra):
    return {"name": name, "namespace": args.namespace, "labels": labels(args, component, **extra)}


def shard_set_name(args, shard):
    return f"{args.name}-shard-{shard}"


def shard_address(args, shard, replica):
    """Replica `replica` of shard `shard`: its pod's stable DNS name (through the headless
    Service) and port."""
    return (f"{shard_set_name(args, shard)}-{replica}.{args.name}-shard.{args.namespace}"
            f".svc.{args.cluster_domain}:{GRPC_PORT}")


def shard_map(args):
    lines = ["# shard_id replica [replica ...]  (rendered by deploy/kubernetes/render.py)"]
    for s in range(args.shards):
        lines.append(" ".join([str(s)] + [shard_address(args, s, r)
                                          for r in range(args.replicas)]))
    return "\n".join(lines) + "\n"


def tcp_probe(port_name, **timing):
    return {"tcpSocket": {"port": port_name}, **timing}


def health_probe(tcp, port, **timing):
    """A probe of grpc.health.v1 on `port`; with `tcp` (TLS) only whether it listens."""
    if tcp:
        return tcp_probe("grpc", **timing)
    return {"grpc": {"port": port}, **timing}


def spread_over_nodes(pod_labels):
    """Pods with these labels prefer different nodes: one node's loss takes one of them."""
    return {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": pod_labels}}}]}}


def disruption_budget(args, name, component, pod_labels, **extra):
    """Voluntary evictions (a node drain) take one of these pods at a time."""
    return {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": meta(args, name, component, **extra),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pod_labels}},
    }


def server_ports(grpc_port):
    return [{"name": "grpc", "containerPort": grpc_port},
            {"name": "metrics", "containerPort": METRICS_PORT}]


def metrics_annotations():
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT),
            "prometheus.io/path": "/metrics"}


def data_volume(args, read_only):
    return {"name": "data",
            "persistentVolumeClaim": {"claimName": args.index_claim, "readOnly": read_only}}


def shard_command(args, shard):
    command = ["knnserve-shard", "--index", f"{DATA_MOUNT}/{args.index_path}",
               "--shard", str(shard), "--listen", f"0.0.0.0:{GRPC_PORT}",
               "--metrics-listen", f"0.0.0.0:{METRICS_PORT}",
               "--threads", str(args.shard_threads), "--drain-seconds", str(args.drain_seconds)]
    if args.gpu:
        command += ["--subset-device", "cuda"]
    for arg in args.shard_arg:
        command += shlex.split(arg)
    return command


def shard_labels(args, shard):
    return labels(args, "shard", **{"knnserve.io/shard": str(shard)})


def shard_statefulset(args, shard):
    """The R replicas of one shard. One StatefulSet per shard: a rolling update replaces one
    replica of each shard at a time, the replicas avoid sharing a node, and a disruption budget
    can count them (one set per replica set, pod ordinal = shard id, rolled every set's highest
    ordinal together: every replica of that shard at once)."""
    pod_labels = shard_labels(args, shard)
    resources = {"requests": {"cpu": args.shard_cpu, "memory": args.shard_memory},
                 "limits": {"memory": args.shard_memory}}
    if args.gpu:
        resources["limits"]["nvidia.com/gpu"] = 1
    container = {
        "name": "shard",
        "image": args.image,
        "command": shard_command(args, shard),
        "ports": server_ports(GRPC_PORT),
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT, "readOnly": True}],
        "resources": resources,
        # NOT_SERVING until the shard is loaded, its SHA-256 verified and a warm-up search run:
        # the startup probe gives that up to 30 minutes, then readiness takes over.
        "startupProbe": health_probe(args.shard_tcp_probes, GRPC_PORT, periodSeconds=10,
                                     failureThreshold=180),
        "readinessProbe": health_probe(args.shard_tcp_probes, GRPC_PORT, periodSeconds=5,
                                       failureThreshold=2),
        "livenessProbe": health_probe(args.shard_tcp_probes, GRPC_PORT, periodSeconds=20,
                                      failureThreshold=3, timeoutSeconds=5),
    }
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": meta(args, shard_set_name(args, shard), "shard",
                         **{"knnserve.io/shard": str(shard)}),
        "spec": {
            "serviceName": f"{args.name}-shard",
            "replicas": args.replicas,
            # The replicas load at once; replica 1 need not wait for replica 0 to be ready.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {"labels": pod_labels, "annotations": metrics_annotations()},
                "spec": {
                    # SIGTERM drains (no new calls, those in flight finish): give it the time.
                    "terminationGracePeriodSeconds": args.drain_seconds + 15,
                    "affinity": spread_over_nodes(pod_labels),
                    "containers": [container],
                    "volumes": [data_volume(args, read_only=True)],
                },
            },
        },
    }


def shard_disruption_budget(args, shard):
    """One replica of a shard evicted at a time (with one replica, that is the shard: warned)."""
    return disruption_budget(args, f"{shard_set_name(args, shard)}-budget", "shard",
                             shard_labels(args, shard), **{"knnserve.io/shard": str(shard)})


def shard_service(args):
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(args, f"{args.name}-shard", "shard"),
        "spec": {
            "clusterIP": "None",
            # The router probes loading shards too (its coverage names them "loading").
            "publishNotReadyAddresses": True,
            "selector": labels(args, "shard"),
            "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def shard_map_configmap(args):
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": meta(args, f"{args.name}-shard-map", "router"),
            "data": {"shards.txt": shard_map(args)}}


def router_deployment(args):
    pod_labels = labels(args, "router")
    container = {
        "name": "router",
        "image": args.image,
        "command": ["knnserve-router", "--shards", "/etc/knnserve/shards.txt",
                    "--listen", f"0.0.0.0:{ROUTER_PORT}",
                    "--metrics-listen", f"0.0.0.0:{METRICS_PORT}",
                    "--drain-seconds", str(args.drain_seconds)]
                    + [word for arg in args.router_arg for word in shlex.split(arg)],
        "ports": server_ports(ROUTER_PORT),
        "volumeMounts": [{"name": "shard-map", "mountPath": "/etc/knnserve", "readOnly": True}],
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"},
                      "limits": {"memory": "1Gi"}},
        # The router's health is SERVING while every shard has a serving replica: started once
        # it has been (it then knows what each shard serves; shards may take 30 minutes to
        # load). From then on it stays ready while it runs: a shard down is answered with
        # UNAVAILABLE naming it, or a partial answer with its Coverage, where a router taken
        # out of the Service would refuse the connection. Alive is not healthy either.
        "startupProbe": health_probe(args.router_tcp_probes, ROUTER_PORT, periodSeconds=10,
                                     failureThreshold=180),
        "readinessProbe": tcp_probe("grpc", periodSeconds=5, failureThreshold=2),
        "livenessProbe": tcp_probe("grpc", periodSeconds=20, failureThreshold=3),
        # The Service takes a few seconds to stop sending a terminating pod connections: the
        # router keeps listening meanwhile, then drains.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_SECONDS)]}}},
    }
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": meta(args, f"{args.name}-router", "router"),
        "spec": {
            "replicas": args.routers,
            "selector": {"matchLabels": pod_labels},
            "template": {
                "metadata": {
                    "labels": pod_labels,
                    # The routers read the map at start: a changed map rolls them.
                    "annotations": {**metrics_annotations(), "knnserve.io/shard-map-sha256":
                                    hashlib.sha256(shard_map(args).encode()).hexdigest()},
                },
                "spec": {
                    "terminationGracePeriodSeconds": PRE_STOP_SECONDS + args.drain_seconds + 15,
                    "affinity": spread_over_nodes(pod_labels),
                    "containers": [container],
                    "volumes": [{"name": "shard-map",
                                 "configMap": {"name": f"{args.name}-shard-map"}}],
                },
            },
        },
    }


def router_service(args):
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": meta(args, f"{args.name}-router", "router"),
        "spec": {
            "selector": labels(args, "router"),
            "ports": [{"name": "grpc", "port": ROUTER_PORT, "targetPort": "grpc",
                       "appProtocol": "grpc"},
                      {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}],
        },
    }


def build_job(args):
    datastore = f"{DATA_MOUNT}/{args.index_path[:-len('/index')]}"
    command = ["knnserve", "datastore", "build",
               "--corpus", f"{DATA_MOUNT}/{args.corpus}", "--model", f"{DATA_MOUNT}/{args.model}",
               "--out", datastore, "--factory", args.factory, "--shards", str(args.shards),
               "--threads", str(args.build_cpu)]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": meta(args, f"{args.name}-datastore-build", "build"),
        "spec": {
            # The build resumes where it stopped (keys.h5 records its rows), so a retry after a
            # lost node continues rather than starting over.
            "backoffLimit": 4,
            "template": {
                "metadata": {"labels": labels(args, "build")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [{
                        "name": "build", "image": args.cli_image, "command": command,
                        "env": [{"name": "OMP_WAIT_POLICY", "value": "PASSIVE"}],
                        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}],
                        "resources": {"requests": {"cpu": str(args.build_cpu),
                                                   "memory": "16Gi"}},
                    }],
                    "volumes": [data_volume(args, read_only=False)],
                },
            },
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block literals for multi-line strings (the shard map reads as a file); no YAML aliases
    for repeated label maps (kubectl takes them, people reading the file trip over them)."""

    def ignore_aliases(self, data):
        return True


def _represent_str(dumper, text):
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Dumper.add_representer(str, _represent_str)


def render(args):
    if args.build_job:
        docs = [build_job(args)]
        header = ("# knnserve's datastore build Job, rendered by deploy/kubernetes/render.py: "
                  "apply it alone\n# and let it finish before the serving manifests.\n")
    else:
        docs = [shard_map_configmap(args), shard_service(args)]
        for shard in range(args.shards):
            docs += [shard_statefulset(args, shard), shard_disruption_budget(args, shard)]
        docs += [router_deployment(args), router_service(args),
                 disruption_budget(args, f"{args.name}-router-budget", "router",
                                   labels(args, "router"))]
        header = ("# knnserve on Kubernetes, rendered by deploy/kubernetes/render.py "
                  f"({args.shards} shards x {args.replicas} replicas, {args.routers} routers).\n"
                  "# Regenerate rather than edit; docs/deploy.md explains the choices.\n")
    return header + yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=100)


def main(argv):
    args = parse_args(argv)
    if args.replicas == 1 and not args.build_job:
        print("render.py: --replicas 1: a node drain or a lost node takes a whole shard down "
              "(its disruption budget allows evicting its only replica); serve with 2 or more",
              file=sys.stderr)
    sys.stdout.write(render(args))


if __name__ == "__main__":
    main(sys.argv[1:])
