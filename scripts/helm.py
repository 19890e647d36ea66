#!/usr/bin/env python3
"""A `helm` command line for the subset the tests and the e2e suite use, over PyPI's
helm-python-sdk (Helm 4's Go SDK in a shared library; no helm binary needed):

    helm.py version
    helm.py lint CHART [-f VALUES]... [--set K=V]... [--strict] [--kube-version V]
    helm.py template NAME CHART [-n NS] [-f VALUES]... [--set K=V]... [--include-crds]
    helm.py install NAME CHART [-n NS] [--create-namespace] [-f VALUES]... [--set K=V]...
                    [--wait] [--timeout 300s]
    helm.py uninstall NAME [-n NS]

scripts/test.sh puts a `helm` wrapper around it into the test virtualenv and exports
KORTEX_TEST_HELM; a real `helm` binary takes the same arguments.
"""

import argparse
import sys

import helm_python as helm
import yaml


def merge(base, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            merge(base[k], v)
        else:
            base[k] = v
    return base


def user_values(args):
    values = {}
    for path in args.values or []:
        with open(path, encoding="utf-8") as f:
            merge(values, yaml.safe_load(f) or {})
    for s in args.set or []:
        merge(values, helm.parse_set_string(s))
    return values


def main():
    p = argparse.ArgumentParser(prog="helm")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version")

    def common(sp):
        sp.add_argument("-f", "--values", action="append")
        sp.add_argument("--set", action="append")
        sp.add_argument("-n", "--namespace", default="default")

    lint = sub.add_parser("lint")
    lint.add_argument("chart")
    lint.add_argument("--strict", action="store_true")
    lint.add_argument("--kube-version")
    common(lint)

    tpl = sub.add_parser("template")
    tpl.add_argument("name")
    tpl.add_argument("chart")
    tpl.add_argument("--include-crds", action="store_true")
    common(tpl)

    inst = sub.add_parser("install")
    inst.add_argument("name")
    inst.add_argument("chart")
    inst.add_argument("--create-namespace", action="store_true")
    inst.add_argument("--wait", action="store_true")
    inst.add_argument("--timeout", default="300s")
    common(inst)

    un = sub.add_parser("uninstall")
    un.add_argument("name")
    un.add_argument("-n", "--namespace", default="default")

    args = p.parse_args()
    try:
        if args.cmd == "version":
            print(f"{helm.helm_sdk_version()} (helm-python-sdk {helm.__version__})")
        elif args.cmd == "lint":
            report = helm.lint(
                args.chart,
                user_values(args),
                strict=args.strict or None,
                namespace=args.namespace,
                kube_version=args.kube_version,
            )
            failed = False
            for m in report.get("messages") or []:
                level = {1: "INFO", 2: "WARNING", 3: "ERROR"}.get(m.get("severity"), "UNKNOWN")
                print(f"[{level}] {m.get('path')}: {m.get('error')}")
                failed |= m.get("severity") == 3 or (args.strict and m.get("severity") == 2)
            for e in report.get("errors") or []:
                print(f"[ERROR] {e}")
                failed = True
            print(f"1 chart(s) linted, {1 if failed else 0} chart(s) failed")
            return 1 if failed else 0
        elif args.cmd == "template":
            chart = helm.Chart.load(args.chart)
            values = user_values(args)
            chart.validate_schema(values)
            out = []
            if args.include_crds:
                for crd in chart.crds():
                    out.append(f"---\n# Source: {crd['name']}\n{crd['data'].strip()}\n")
            rendered = chart.render(values, name=args.name, namespace=args.namespace, is_install=True)
            for path in sorted(rendered):
                text = rendered[path].strip()
                if path.endswith("NOTES.txt") or not text:
                    continue
                for doc in text.split("\n---\n"):
                    if doc.strip():
                        out.append(f"---\n# Source: {path}\n{doc.strip()}\n")
            sys.stdout.write("".join(out))
        elif args.cmd == "install":
            cfg = helm.Config(namespace=args.namespace)
            release = cfg.install(
                args.chart,
                args.name,
                user_values(args),
                namespace=args.namespace,
                create_namespace=args.create_namespace,
                wait="watcher" if args.wait else None,
                timeout=int(args.timeout.rstrip("s")),
            )
            print(f"NAME: {args.name}\nNAMESPACE: {args.namespace}\nSTATUS: {release.get('status', '?')}")
            if release.get("notes"):
                print(f"NOTES:\n{release['notes']}")
        elif args.cmd == "uninstall":
            helm.Config(namespace=args.namespace).uninstall(args.name)
            print(f'release "{args.name}" uninstalled')
    except helm.HelmError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
