#!/usr/bin/env python3
"""Where the time of a reaction goes, from the API server's audit log.

The scale harness times a reaction from its `spec.version` patch to the
Deployment's new template hash on its watch. The audit log of the same run
(`<cluster-dir>/logs/audit.log`) holds every request with the moment the
API server received it and the moment it answered, so each reaction splits
into:

- notice: from the answer to the harness's patch to the operator's first
  request about that resource (the watch delivering the change, the work
  queue, the caches' lookups and the decision);
- writes: the time some write of the operator's was in flight, up to and
  including the Deployment's (the status and the snapshot ConfigMap, sent
  together, then the Deployment);
- between: the operator's own time between those writes.

Usage:
  benches/reaction_profile.py target/bench-cluster/logs/audit.log [--since ISO-TIME]

A reaction is a patch of a resource by anyone but the operator with
fewer than three others within 100 ms (the harness changes one resource
at a time, the next as soon as the last is applied; its rollback
measurement moves ten at once, which this leaves out).
"""

import argparse
import json
from datetime import datetime

OPERATOR = "system:serviceaccount:openmed-bench-system:operator-under-test"
WRITES = {"create", "update", "patch", "delete"}


def when(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def user(event):
    impersonated = event.get("impersonatedUser") or {}
    return impersonated.get("username") or event["user"]["username"]


def requests(path, since):
    for line in open(path, encoding="utf-8"):
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" or event["verb"] == "watch":
            continue
        ref = event.get("objectRef") or {}
        received = when(event["requestReceivedTimestamp"])
        if since and received < since:
            continue
        yield {
            "user": user(event),
            "verb": event["verb"],
            "resource": ref.get("resource", ""),
            "subresource": ref.get("subresource", ""),
            "namespace": ref.get("namespace", ""),
            "name": ref.get("name", ""),
            "received": received,
            "answered": when(event["stageTimestamp"]),
            "code": event.get("responseStatus", {}).get("code"),
        }


def busy(intervals):
    """The time some request was in flight: writes sent together count once."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def percentile(values, p):
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, -(-len(ordered) * p // 100) - 1))
    return ordered[int(rank)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("audit_log")
    parser.add_argument("--since", help="ignore requests before this time (ISO 8601)")
    args = parser.parse_args()
    since = when(args.since) if args.since else None
    all_requests = sorted(requests(args.audit_log, since), key=lambda r: r["received"])
    patches = [
        r
        for r in all_requests
        if r["user"] != OPERATOR
        and r["resource"] == "openmedmodels"
        and r["verb"] == "patch"
        and not r["subresource"]
    ]
    isolated = [
        p
        for p in patches
        if sum(q is not p and abs(q["received"] - p["received"]) < 0.1 for q in patches) < 3
    ]
    operator = [r for r in all_requests if r["user"] == OPERATOR]
    reactions = []
    for patch in isolated:
        key = (patch["namespace"], patch["name"])
        mine = [
            r
            for r in operator
            if patch["answered"] <= r["received"] < patch["answered"] + 10
            and r["namespace"] == key[0]
            and (r["name"] == key[1] or r["name"].startswith(key[1] + "-model-manifest"))
        ]
        deployment = next(
            (
                i
                for i, r in enumerate(mine)
                if r["resource"] == "deployments" and r["verb"] == "patch"
            ),
            None,
        )
        if not mine or deployment is None:
            continue
        path = mine[: deployment + 1]
        notice = path[0]["received"] - patch["answered"]
        writes = busy([(r["received"], r["answered"]) for r in path])
        total = path[-1]["answered"] - patch["answered"]
        reactions.append(
            {
                "key": "/".join(key),
                "notice": notice,
                "writes": writes,
                "between": total - notice - writes,
                "total": total,
                "path": path,
                "patch": patch,
            }
        )
    if not reactions:
        raise SystemExit("no reactions found in the audit log")
    print(f"{len(reactions)} reactions (harness patch answered -> operator's Deployment write answered)")
    print(f"{'ms':>10} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for part in ["notice", "writes", "between", "total"]:
        values = [r[part] * 1000 for r in reactions]
        row = " ".join(f"{percentile(values, p):8.1f}" for p in (50, 90, 99, 100))
        print(f"{part:>10} {row}")
    print("\nthe five slowest:")
    for r in sorted(reactions, key=lambda r: r["total"], reverse=True)[:5]:
        start = r["patch"]["answered"]
        print(
            f"  {r['key']}: total {r['total'] * 1000:.1f} ms, notice {r['notice'] * 1000:.1f},"
            f" writes {r['writes'] * 1000:.1f}, between {r['between'] * 1000:.1f}"
        )
        for q in r["path"]:
            what = q["resource"] + ("/" + q["subresource"] if q["subresource"] else "")
            print(
                f"    +{(q['received'] - start) * 1000:7.1f} ms {q['verb']:<6} {what:<24}"
                f" {q['name']:<36} {(q['answered'] - q['received']) * 1000:6.1f} ms {q['code']}"
            )


if __name__ == "__main__":
    main()
