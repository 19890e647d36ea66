#!/usr/bin/env python3
"""The rooms of operator/src and who may import whom (docs/architecture.md).

Reads every `crate::ROOM` a room's files name (in `use` lines and in paths) and checks
that each points to a lower floor of LAYERS. Prints the graph with --graph; exits 1 on an
import that climbs a floor or goes sideways on one (a circle needs one of those).

    python3 scripts/layers.py            # check
    python3 scripts/layers.py --graph    # every import edge, with how many files make it
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent / "operator" / "src"

# Highest floor first. A room may import from any floor below its own, never from its own
# floor's other rooms or from above. Keep this and docs/architecture.md's diagram one.
LAYERS = [
    ["cli", "kubectl_plugin"],
    ["eval"],
    ["http"],
    ["trigger"],
    ["chat", "notify"],
    ["operator"],
    ["proposals"],
    ["tools"],
    ["govern", "redact", "gitops", "oidc", "slack"],
    ["llm"],
    ["live"],
    ["source"],
    ["catalog"],
    ["store"],
    ["metrics"],
    ["crd", "telemetry", "egress", "glob"],
]

FLOOR = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}
USE = re.compile(r"\bcrate::([a-z_]+)")
# `use crate::{a, b::c}` names several rooms at once.
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)


def room_of(path: pathlib.Path) -> str | None:
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ("main.rs", "lib.rs", "bin"):
        return None
    return rel.parts[0].removesuffix(".rs")


def edges() -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for path in sorted(ROOT.rglob("*.rs")):
        source = room_of(path)
        if source is None:
            continue
        text = path.read_text()
        # Tests may reach anywhere (they build what they check).
        text = re.split(r"#\[cfg\(test\)\]", text)[0]
        # Comments (doc links included) are not imports.
        text = "\n".join(line.split("//")[0] for line in text.splitlines())
        targets = set(USE.findall(text))
        for group in GROUP.findall(text):
            targets.update(re.findall(r"(?:^|,)\s*([a-z_]+)", group))
        for target in targets:
            if target != source and target in FLOOR:
                out.setdefault((source, target), set()).add(
                    str(path.relative_to(ROOT))
                )
    return out


def main() -> int:
    graph = edges()
    unknown = sorted(
        {room_of(p) for p in ROOT.rglob("*.rs")} - set(FLOOR) - {None}
    )
    if "--graph" in sys.argv:
        for (a, b), files in sorted(graph.items()):
            print(f"{a} -> {b} ({len(files)})")
    bad = 0
    for room in unknown:
        print(f"room {room} has no floor in scripts/layers.py LAYERS")
        bad += 1
    for (a, b), files in sorted(graph.items()):
        if a in FLOOR and FLOOR[b] <= FLOOR[a]:
            how = "sideways" if FLOOR[b] == FLOOR[a] else "up"
            print(f"{a} -> {b} goes {how}: {', '.join(sorted(files))}")
            bad += 1
    if bad:
        print(f"{bad} import(s) against the layers (docs/architecture.md)")
        return 1
    print(f"layers hold: {len(graph)} import edges between {len(FLOOR)} rooms, all downwards")
    return 0


if __name__ == "__main__":
    sys.exit(main())
