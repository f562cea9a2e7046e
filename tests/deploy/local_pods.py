#!/usr/bin/python3
"""Checks rendered Kubernetes manifests of knnserve and plans their pods as local processes.

    local_pods.py --manifests knnserve.yaml --claim knnserve-data=/tmp/data --bin build/bin \\
        --out plan.json

First the checks a cluster would only reveal at run time: selectors that select the pods,
ports and probes that name declared container ports, volumes that exist, a drain shorter than
the grace period, disruption budgets that select pods, and a router shard map whose every
address is the stable DNS name of a StatefulSet pod that serves that very shard (its
knnserve-shard --shard). Any failure: exit 1, one line per problem.

Then the plan (JSON): for every pod of every StatefulSet and Deployment, the argv that runs its
container here, as the kubelet would run it there, with what one machine cannot give each pod
replaced: its own network (each container port gets a local port, 0.0.0.0:P in arguments
becomes 127.0.0.1:<local>), cluster DNS (pod names in ConfigMap files become 127.0.0.1:<local>)
and volumes (mount paths in arguments become local directories; ConfigMaps are written out).
The command itself, the image's PATH lookup and the pod's HOSTNAME stay as rendered.
"""
import argparse
import json
import os
import re
import shlex
import socket
import sys

import yaml

WORKLOADS = ("StatefulSet", "Deployment")


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def by_kind(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def selects(selector, workload):
    """Whether label selector `selector` (a label -> value map) selects the workload's pods."""
    pod_labels = workload["spec"]["template"]["metadata"].get("labels", {})
    return all(pod_labels.get(k) == v for k, v in selector.items())


def container_ports(workload):
    ports = {}
    for c in pod_spec(workload)["containers"]:
        for p in c.get("ports", []):
            ports[p.get("name", str(p["containerPort"]))] = p["containerPort"]
    return ports


def pod_names(workload):
    name = workload["metadata"]["name"]
    replicas = workload["spec"].get("replicas", 1)
    if workload["kind"] == "StatefulSet":
        return [f"{name}-{i}" for i in range(replicas)]
    return [f"{name}-pod{i}" for i in range(replicas)]


def command_line(container):
    return list(container.get("command", [])) + list(container.get("args", []))


def flag_value(argv, flag):
    """The value of --flag in a container's command (inside a sh -c string too), or None."""
    words = []
    for arg in argv:
        words += shlex.split(arg) if " " in arg else [arg]
    for i, word in enumerate(words):
        if word == flag and i + 1 < len(words):
            return words[i + 1]
        if word.startswith(flag + "="):
            return word[len(flag) + 1:]
    return None


def check(docs, claims, cluster_domain):
    problems = []
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    namespaces = {d["metadata"].get("namespace") for d in docs}
    if len(namespaces) != 1:
        problems.append(f"objects in several namespaces: {sorted(map(str, namespaces))}")
    workloads = [d for d in docs if d["kind"] in WORKLOADS]
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    for w in workloads:
        where = f"{w['kind']} {w['metadata']['name']}"
        selector = w["spec"]["selector"]["matchLabels"]
        if not selects(selector, w):
            problems.append(f"{where}: selector {selector} does not select its own pods")
        if w["kind"] == "StatefulSet":
            service = services.get(w["spec"].get("serviceName"))
            if service is None or service["spec"].get("clusterIP") != "None":
                problems.append(f"{where}: serviceName {w['spec'].get('serviceName')} is not a "
                                "headless Service of these manifests")
        spec = pod_spec(w)
        ports = container_ports(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(probe_name)
                if not probe:
                    continue
                port = (probe.get("grpc") or probe.get("tcpSocket") or
                        probe.get("httpGet") or {}).get("port")
                if port not in ports.values() and port not in ports:
                    problems.append(f"{where}: {probe_name} probes port {port}, which no "
                                    f"container declares ({ports})")
            for mount in c.get("volumeMounts", []):
                volume = volumes.get(mount["name"])
                if volume is None:
                    problems.append(f"{where}: volumeMount {mount['name']} has no volume")
                elif "configMap" in volume and volume["configMap"]["name"] not in configmaps:
                    problems.append(f"{where}: ConfigMap {volume['configMap']['name']} is not "
                                    "in these manifests")
                elif ("persistentVolumeClaim" in volume and
                      volume["persistentVolumeClaim"]["claimName"] not in claims):
                    problems.append(f"{where}: claim "
                                    f"{volume['persistentVolumeClaim']['claimName']} not given "
                                    "(--claim NAME=DIR)")
            drain = flag_value(command_line(c), "--drain-seconds")
            grace = spec.get("terminationGracePeriodSeconds", 30)
            if drain is not None and int(drain) >= grace:
                problems.append(f"{where}: --drain-seconds {drain} is not shorter than "
                                f"terminationGracePeriodSeconds {grace}: the drain is killed")
    for s in services.values():
        selected = [w for w in workloads
                    if selects(s["spec"].get("selector", {}), w)]
        if not selected:
            problems.append(f"Service {s['metadata']['name']}: its selector selects no pods")
        for p in s["spec"].get("ports", []):
            target = p.get("targetPort", p["port"])
            if selected and not any(target in container_ports(w) or
                                    target in container_ports(w).values() for w in selected):
                problems.append(f"Service {s['metadata']['name']}: targetPort {target} is not a "
                                "port of the pods it selects")
    for budget in by_kind(docs, "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        if not any(selects(selector, w) for w in workloads):
            problems.append(f"PodDisruptionBudget {budget['metadata']['name']}: its selector "
                            "selects no pods")
    problems += check_shard_maps(docs, services, cluster_domain)
    return problems


def stateful_pod_addresses(docs, services, cluster_domain):
    """{"pod.service.namespace.svc.DOMAIN:port": (StatefulSet, ordinal, port)}."""
    addresses = {}
    for w in by_kind(docs, "StatefulSet"):
        service = services.get(w["spec"].get("serviceName"))
        if service is None:
            continue
        namespace = w["metadata"].get("namespace", "default")
        for ordinal, pod in enumerate(pod_names(w)):
            for port in container_ports(w).values():
                host = f"{pod}.{service['metadata']['name']}.{namespace}.svc.{cluster_domain}"
                addresses[f"{host}:{port}"] = (w, ordinal, port)
    return addresses


def served_shard(workload):
    """The shard id a workload's pods serve (their knnserve-shard --shard), or None."""
    for c in pod_spec(workload)["containers"]:
        shard = flag_value(command_line(c), "--shard")
        if shard is not None:
            return int(shard)
    return None


def check_shard_maps(docs, services, cluster_domain):
    """Every router's --shards file: each address a pod that serves that shard."""
    problems = []
    addresses = stateful_pod_addresses(docs, services, cluster_domain)
    configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    for w in by_kind(docs, "Deployment"):
        spec = pod_spec(w)
        for c in spec["containers"]:
            path = flag_value(command_line(c), "--shards")
            if path is None:
                continue
            text = configmap_file(spec, c, configmaps, path)
            if text is None:
                problems.append(f"Deployment {w['metadata']['name']}: --shards {path} is not a "
                                "file of a mounted ConfigMap")
                continue
            seen = set()
            for line in text.splitlines():
                fields = line.split("#", 1)[0].split()
                if not fields:
                    continue
                shard = int(fields[0])
                seen.add(shard)
                for address in fields[1:]:
                    target = addresses.get(address)
                    if target is None:
                        problems.append(f"shard map: {address} (shard {shard}) is no StatefulSet "
                                        "pod's DNS name and port")
                    elif served_shard(target[0]) != shard:
                        problems.append(f"shard map: {address} is a pod of "
                                        f"{target[0]['metadata']['name']}, which serves shard "
                                        f"{served_shard(target[0])}, listed for shard {shard}")
            if seen != set(range(len(seen))):
                problems.append(f"shard map: shard ids {sorted(seen)} are not 0..{len(seen) - 1}")
    return problems


def configmap_file(spec, container, configmaps, path):
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})
        prefix = mount["mountPath"].rstrip("/") + "/"
        if "configMap" in volume and path.startswith(prefix):
            cm = configmaps.get(volume["configMap"]["name"])
            if cm is not None:
                return cm.get("data", {}).get(path[len(prefix):])
    return None


def plan(docs, claims, bin_dir, base_port, run_dir, cluster_domain):
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    configmaps = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    next_port = [base_port]

    def local_port():
        if base_port == 0:  # a free one (the kernel's pick, released for the pod to take)
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                return probe.getsockname()[1]
        next_port[0] += 1
        return next_port[0] - 1

    pods = []
    for w in [d for d in docs if d["kind"] in WORKLOADS]:
        for ordinal, pod in enumerate(pod_names(w)):
            pods.append({"workload": w, "ordinal": ordinal, "pod": pod,
                         "ports": {port: local_port()
                                   for port in container_ports(w).values()}})
    # Cluster DNS: a StatefulSet pod's stable name -> its local port.
    dns = {}
    for address, (w, ordinal, port) in stateful_pod_addresses(docs, services,
                                                               cluster_domain).items():
        for p in pods:
            if p["workload"] is w and p["ordinal"] == ordinal:
                dns[address] = f"127.0.0.1:{p['ports'][port]}"
    processes = []
    for p in pods:
        spec = pod_spec(p["workload"])
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec["containers"]:
            mounts = {}
            for mount in c.get("volumeMounts", []):
                volume = volumes[mount["name"]]
                if "persistentVolumeClaim" in volume:
                    mounts[mount["mountPath"]] = claims[
                        volume["persistentVolumeClaim"]["claimName"]]
                elif "configMap" in volume:
                    local = os.path.join(run_dir, p["pod"], mount["name"])
                    os.makedirs(local, exist_ok=True)
                    data = configmaps[volume["configMap"]["name"]].get("data", {})
                    for key, text in data.items():
                        for address, here in dns.items():
                            text = text.replace(address, here)
                        with open(os.path.join(local, key), "w") as f:
                            f.write(text)
                    mounts[mount["mountPath"]] = local
            argv = []
            for arg in command_line(c):
                for port, here in p["ports"].items():
                    arg = re.sub(rf"0\.0\.0\.0:{port}\b", f"127.0.0.1:{here}", arg)
                for path, here in sorted(mounts.items(), key=lambda m: -len(m[0])):
                    arg = arg.replace(path.rstrip("/") + "/", here.rstrip("/") + "/")
                    if arg == path:
                        arg = here
                argv.append(arg)
            env = {"HOSTNAME": p["pod"], "PATH": f"{os.path.abspath(bin_dir)}:/usr/bin:/bin"}
            env.update({e["name"]: e["value"] for e in c.get("env", []) if "value" in e})
            processes.append({
                "pod": p["pod"], "kind": p["workload"]["kind"],
                "component": p["workload"]["metadata"]["labels"].get(
                    "app.kubernetes.io/component", ""),
                "ports": {str(k): v for k, v in p["ports"].items()},
                "argv": ["/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in env.items()] + argv,
            })
    return processes


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--manifests", required=True)
    parser.add_argument("--claim", action="append", default=[], metavar="NAME=DIR",
                        help="a PersistentVolumeClaim's contents: a local directory")
    parser.add_argument("--bin", default="build/bin", help="the image's executables, here")
    parser.add_argument("--base-port", type=int, default=0,
                        help="local ports from here on (default 0: free ports)")
    parser.add_argument("--cluster-domain", default="cluster.local")
    parser.add_argument("--run-dir", default="/tmp/knnserve-local-pods")
    parser.add_argument("--out", help="write the plan (JSON) here")
    args = parser.parse_args(argv)
    claims = dict(c.split("=", 1) for c in args.claim)
    docs = load(args.manifests)
    problems = check(docs, claims, args.cluster_domain)
    for problem in problems:
        print(f"local_pods: {problem}", file=sys.stderr)
    if problems:
        return 1
    processes = plan(docs, claims, args.bin, args.base_port, args.run_dir, args.cluster_domain)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(processes, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
