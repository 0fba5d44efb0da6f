#!/usr/bin/env python3
"""Import cycles between the `warden` crate's modules (src/), from its `crate::`/`super::` paths.

Usage: .ci/module-cycles.py [DEPTH] [PREFIX]
  DEPTH 1 (default): top-level modules (cluster, server, team, ...).
  DEPTH 2 with PREFIX server: the submodules of `server` (server::api, server::events, ...).
Prints each strongly connected component of more than one module with the edges inside it
(file:line of each reference) and exits 1 if there is any; prints "no cycles" and exits 0 otherwise.
Comments (doc links included) are ignored: they are not compile-time dependencies.
"""
import os, re, sys
from collections import defaultdict

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
depth = int(sys.argv[1]) if len(sys.argv) > 1 else 1
prefix = sys.argv[2] if len(sys.argv) > 2 else ""


def module_of(rel):
    parts = rel[:-3].split("/")
    if parts[-1] in ("mod", "lib", "main"):
        parts = parts[:-1]
    return parts


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return "\n".join(re.sub(r"//.*", "", line) for line in text.split("\n"))


def use_targets(tree, base):
    """The paths a use tree names (`a::{b, c::d}` → a::b, a::c::d), as segment lists."""
    out = []
    tree = tree.strip()
    if not tree:
        return out
    m = re.match(r"([\w:]*?)(::)?\{(.*)\}$", tree, flags=re.S)
    if m:
        head = [s for s in m.group(1).split("::") if s]
        depth_, cur, items = 0, "", []
        for ch in m.group(3):
            if ch == "{":
                depth_ += 1
            elif ch == "}":
                depth_ -= 1
            if ch == "," and depth_ == 0:
                items.append(cur)
                cur = ""
            else:
                cur += ch
        items.append(cur)
        for item in items:
            if item.strip() == "self":
                out.append(base + head)
            else:
                out += use_targets(item, base + head)
        return out
    name = re.split(r"\s+as\s+", tree)[0]
    return [base + [s for s in name.split("::") if s]]


def resolve(module, segs):
    """Absolute segments of a `crate::`/`super::`/`self::` path seen in `module`."""
    if segs[0] == "crate":
        return segs[1:]
    here = list(module)
    while segs and segs[0] in ("super", "self"):
        if segs[0] == "super":
            here = here[:-1]
        segs = segs[1:]
    return here + segs


def key(mod):
    if prefix:
        if mod[: len(prefix.split("::"))] != prefix.split("::"):
            return None
    return "::".join(mod[:depth]) if len(mod) >= depth else None


edges = defaultdict(list)
for root, _, files in os.walk(SRC):
    for f in files:
        if not f.endswith(".rs"):
            continue
        path = os.path.join(root, f)
        rel = os.path.relpath(path, SRC)
        if rel == "main.rs":
            continue  # the binary is its own crate
        module = module_of(rel)
        text = strip_comments(open(path, encoding="utf-8").read())
        refs = []
        for m in re.finditer(r"\buse\s+((?:crate|super|self)\b[^;]*);", text, flags=re.S):
            line = text.count("\n", 0, m.start()) + 1
            for t in use_targets(m.group(1), []):
                refs.append((line, t))
        for m in re.finditer(r"(?<![\w:])((?:crate|super)(?:::\w+)+)", text):
            line = text.count("\n", 0, m.start()) + 1
            refs.append((line, m.group(1).split("::")))
        for line, segs in refs:
            target = resolve(module, segs)
            a, b = key(module), key(target)
            if a and b and a != b:
                edges[(a, b)].append(f"{rel}:{line}")

graph = defaultdict(set)
for a, b in edges:
    graph[a].add(b)

# Tarjan's strongly connected components.
index, low, stack, on, sccs, n = {}, {}, [], set(), [], [0]


def visit(v):
    index[v] = low[v] = n[0]
    n[0] += 1
    stack.append(v)
    on.add(v)
    for w in graph[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        sccs.append(comp)


sys.setrecursionlimit(10000)
for v in list(graph):
    if v not in index:
        visit(v)
cycles = [sorted(c) for c in sccs if len(c) > 1]
level = f"depth {depth}" + (f" under {prefix}" if prefix else "")
if not cycles:
    print(f"no cycles ({level}, {len(graph)} modules with references)")
    sys.exit(0)
for comp in cycles:
    print(f"cycle ({level}): {' <-> '.join(comp)}")
    for (a, b), where in sorted(edges.items()):
        if a in comp and b in comp:
            print(f"  {a} -> {b}: {len(where)} refs, e.g. {', '.join(where[:3])}")
sys.exit(1)
